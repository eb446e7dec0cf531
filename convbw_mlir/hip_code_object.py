"""The HSACO code objects of IREE's HIP executables read as AMDGPU ELF, and the check that what a direct launch
passes agrees with what they declare: pure functions over bytes, used by the launcher (:mod:`convbw_mlir.hip_launch`)
at load and by the build when it reads the schedule (:mod:`convbw_mlir.build.hip_schedule`).

Each HSACO is an AMDGPU ELF whose ``NT_AMDGPU_METADATA`` note (msgpack, LLVM AMDGPUUsage "Code Object V3+
Metadata") declares every kernel's kernarg segment, LDS (group segment), workgroup size and wave size, and whose
``<kernel>.kd`` symbol is the 64-byte kernel descriptor the hardware reads (the same sizes, a second source).
IREE's HIP ABI (runtime/src/iree/hal/drivers/hip/stream_command_buffer.c): ``hipModuleLaunchKernel`` with one
parameter per binding (a device pointer) then one per 32-bit constant, block dims from the export, 0 bytes of
dynamic shared memory (AMD kernels use static LDS; the export's shared-memory field must be 0).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from convbw_mlir.cuda_launch import Dispatch, Launch

__all__ = [
    "HIP_FORMAT",
    "CodeObject",
    "CodeObjectError",
    "KernelDescriptor",
    "KernelMeta",
    "LaunchMismatch",
    "check_hip_launch",
    "kernel_arguments",
    "read_code_object",
]

HIP_FORMAT = "rocm-hsaco-fb"
_EM_AMDGPU = 224  # ELF e_machine (LLVM AMDGPUUsage, "ELF Code Object")
_ELFOSABI_AMDGPU_HSA = 64
_NT_AMDGPU_METADATA = 32  # note type of the msgpack metadata (code object V3 and later)
_KD_WAVE32 = 1 << 10  # kernel_code_properties bit ENABLE_WAVEFRONT_SIZE32 (gfx10+)


class CodeObjectError(ValueError):
    """A code object or executable that cannot be read as IREE and LLVM write them; the message says what."""


class LaunchMismatch(ValueError):
    """What a launch would pass disagrees with what a kernel's code object declares; the message names both."""


# -- the code object: an AMDGPU ELF ----------------------------------------------------------------
@dataclass(frozen=True)
class KernelDescriptor:
    """The fields of a 64-byte ``amd_kernel_code_t`` successor (LLVM AMDGPUUsage, "Kernel Descriptor") that
    a launch depends on."""

    group_segment: int  # static LDS bytes
    private_segment: int  # scratch bytes per work-item (spills)
    kernarg_size: int
    wave32: bool


@dataclass(frozen=True)
class KernelMeta:
    """One kernel of ``amdhsa.kernels`` in the metadata note."""

    name: str
    symbol: str
    kernarg_size: int
    kernarg_align: int
    group_segment: int
    private_segment: int
    wavefront_size: int
    max_flat_workgroup_size: int
    reqd_workgroup_size: tuple[int, int, int] | None
    sgprs: int
    vgprs: int
    agprs: int
    args: tuple[tuple[int, int, str], ...]  # (offset, size, value kind), in order
    descriptor: KernelDescriptor


@dataclass(frozen=True)
class CodeObject:
    """A HSACO: its target (``amdgcn-amd-amdhsa--gfx942``...), metadata version and kernels by name."""

    target: str
    version: tuple[int, ...]
    kernels: dict[str, KernelMeta]

    @property
    def arch(self) -> str:
        """The processor (``gfx942``), without target features (``:sramecc+``)."""
        return self.target.rsplit("-", 1)[-1].split(":")[0]


def read_code_object(image: bytes) -> CodeObject:
    """The metadata and kernel descriptors of an AMDGPU code object (a 64-bit little-endian ELF).

    Raises:
        CodeObjectError: not an AMDGPU HSA code object, or a corrupt one (the message says what).
    """
    import msgpack

    image = bytes(image)
    if image[:4] != b"\x7fELF":
        raise CodeObjectError(f"code object: not an ELF file (starts with {image[:4]!r})")
    if image[4:6] != b"\x02\x01":
        raise CodeObjectError("code object: not a 64-bit little-endian ELF")
    if image[7] != _ELFOSABI_AMDGPU_HSA:
        raise CodeObjectError(f"code object: ELF OS/ABI {image[7]}, expected {_ELFOSABI_AMDGPU_HSA} (AMDGPU HSA)")
    try:
        (machine,) = struct.unpack_from("<H", image, 18)
        if machine != _EM_AMDGPU:
            raise CodeObjectError(f"code object: e_machine {machine}, expected {_EM_AMDGPU} (EM_AMDGPU)")
        sections = _sections(image)
        notes = [n for s in sections if s[0] == 7 for n in _notes(image, s[1], s[2])]  # SHT_NOTE
        meta = [desc for name, kind, desc in notes if name == b"AMDGPU" and kind == _NT_AMDGPU_METADATA]
        if len(meta) != 1:
            raise CodeObjectError(f"code object: {len(meta)} NT_AMDGPU_METADATA notes, expected 1")
        try:
            doc = msgpack.unpackb(meta[0], raw=False, strict_map_key=False)
        except Exception as e:  # msgpack raises several types for bad data
            raise CodeObjectError(f"code object: metadata note is not msgpack ({type(e).__name__}: {e})") from None
        symbols = _symbols(image, sections)
        kernels = {}
        for k in doc["amdhsa.kernels"]:
            sym = k[".symbol"]
            if sym not in symbols:
                raise CodeObjectError(f"code object: kernel {k['.name']}: no descriptor symbol {sym}")
            kernels[k[".name"]] = _kernel(k, _descriptor(image, sections, *symbols[sym]))
        return CodeObject(doc["amdhsa.target"], tuple(doc.get("amdhsa.version", ())), kernels)
    except (struct.error, KeyError, TypeError, IndexError, AttributeError) as e:
        raise CodeObjectError(f"code object: truncated or corrupt ({type(e).__name__}: {e})") from None


def _sections(image: bytes) -> list[tuple[int, int, int, int, int, int]]:
    """(type, offset, size, link, entry size, address) of every section header."""
    shoff, shentsize, shnum = struct.unpack_from("<Q", image, 40)[0], *struct.unpack_from("<HH", image, 58)
    if shoff + shentsize * shnum > len(image):
        raise CodeObjectError(f"code object: section headers end at byte {shoff + shentsize * shnum}, "
                              f"past the file's {len(image)} (truncated)")  # fmt: skip
    out = []
    for i in range(shnum):
        at = shoff + i * shentsize
        _, kind, _, addr, off, size, link, _, _, entsize = struct.unpack_from("<IIQQQQIIQQ", image, at)
        if kind != 8 and off + size > len(image):  # SHT_NOBITS has no bytes in the file
            raise CodeObjectError(f"code object: section {i} ends at byte {off + size}, past the file's {len(image)}")
        out.append((kind, off, size, link, entsize, addr))
    return out


def _notes(image: bytes, off: int, size: int) -> list[tuple[bytes, int, bytes]]:
    """(name, type, descriptor) of each ELF note in a note section (4-byte aligned fields)."""
    out, at, end = [], off, off + size
    while at + 12 <= end:
        namesz, descsz, kind = struct.unpack_from("<III", image, at)
        name_at = at + 12
        desc_at = name_at + (-(-namesz // 4) * 4)
        if desc_at + descsz > end:
            raise CodeObjectError(f"code object: a note of {descsz} bytes runs past its section")
        out.append((image[name_at : name_at + namesz].rstrip(b"\0"), kind, image[desc_at : desc_at + descsz]))
        at = desc_at + (-(-descsz // 4) * 4)
    return out


def _symbols(image: bytes, sections: list) -> dict[str, tuple[int, int, int]]:
    """name -> (value, size, section index) from the symbol tables (SHT_SYMTAB, SHT_DYNSYM)."""
    out = {}
    for kind, off, size, link, entsize, _ in sections:
        if kind not in (2, 11) or not entsize:
            continue
        strtab = sections[link]
        for at in range(off, off + size, entsize):
            name, _, _, shndx, value, sym_size = struct.unpack_from("<IBBHQQ", image, at)
            start = strtab[1] + name
            text = image[start : image.index(b"\0", start)].decode()
            if text:
                out[text] = (value, sym_size, shndx)
    return out


def _descriptor(image: bytes, sections: list, value: int, size: int, shndx: int) -> KernelDescriptor:
    """The kernel descriptor at symbol value ``value`` of section ``shndx`` (64 bytes)."""
    if size != 64 or not 0 < shndx < len(sections):
        raise CodeObjectError(f"code object: a kernel descriptor of {size} bytes in section {shndx}")
    _, off, sec_size, _, _, addr = sections[shndx]
    at = off + value - addr
    if not off <= at <= off + sec_size - 64:
        raise CodeObjectError(f"code object: a kernel descriptor at {value:#x} outside its section")
    group, private, kernarg = struct.unpack_from("<III", image, at)
    (props,) = struct.unpack_from("<H", image, at + 56)
    return KernelDescriptor(group, private, kernarg, bool(props & _KD_WAVE32))


def _kernel(k: dict, kd: KernelDescriptor) -> KernelMeta:
    reqd = k.get(".reqd_workgroup_size")
    return KernelMeta(
        name=k[".name"],
        symbol=k[".symbol"],
        kernarg_size=int(k[".kernarg_segment_size"]),
        kernarg_align=int(k[".kernarg_segment_align"]),
        group_segment=int(k[".group_segment_fixed_size"]),
        private_segment=int(k[".private_segment_fixed_size"]),
        wavefront_size=int(k[".wavefront_size"]),
        max_flat_workgroup_size=int(k[".max_flat_workgroup_size"]),
        reqd_workgroup_size=tuple(int(v) for v in reqd) if reqd else None,
        sgprs=int(k[".sgpr_count"]),
        vgprs=int(k[".vgpr_count"]),
        agprs=int(k.get(".agpr_count", 0)),
        args=tuple((int(a[".offset"]), int(a[".size"]), str(a[".value_kind"])) for a in k.get(".args", ())),
        descriptor=kd,
    )


# -- the schedule and the check --------------------------------------------------------------------
def kernel_arguments(bindings: int, constants: int) -> tuple[tuple[int, int], ...]:
    """(offset, size) of each kernel argument in IREE's HIP ABI as the kernarg segment packs them:
    ``bindings`` 8-byte pointers, then ``constants`` 32-bit values (each naturally aligned: pointers first)."""
    return tuple((8 * i, 8) for i in range(bindings)) + tuple((8 * bindings + 4 * j, 4) for j in range(constants))


def check_hip_launch(launch: Launch, arch: str | None = None, max_lds: int = 65536) -> dict[str, CodeObject]:
    """Every kernel a dispatch of ``launch`` names, checked against its code object: the arguments the
    launch packs (IREE's HIP ABI) are the kernel's explicit kernarg arguments, offset for offset, and their
    end is the kernarg segment's size; the export's block is the kernel's required workgroup size, within its
    maximum; no dynamic shared memory and the static LDS within ``max_lds``; metadata and kernel descriptor
    agree (kernarg size, LDS, scratch, wave size); the code object is for ``arch`` where given.

    Returns:
        The code objects by kernel name.

    Raises:
        ValueError: a refused launch.
        CodeObjectError: an unreadable code object.
        LaunchMismatch: the first disagreement, naming the kernel, the field and both values.
    """
    if launch.refused:
        raise ValueError(f"launch: refused ({launch.refused})")
    objects = [read_code_object(image) for image in launch.ptx]
    found: dict[str, CodeObject] = {}
    for step in launch.steps:
        if not isinstance(step, Dispatch) or step.kernel in found:
            continue
        e = launch.exports[step.kernel]
        obj = objects[e.module]
        k = obj.kernels.get(e.name)
        if k is None:
            raise LaunchMismatch(f"{e.name}: not in its code object (it has {sorted(obj.kernels)})")

        def differ(field: str, launch_value: Any, kernel_value: Any, kernel: str = e.name) -> None:
            if launch_value != kernel_value:
                raise LaunchMismatch(
                    f"{kernel}: {field}: the launch has {launch_value}, the code object {kernel_value}"
                )

        if arch is not None:
            differ("target", arch, obj.arch)
        packed = kernel_arguments(len(step.bindings), len(step.constants))
        explicit = [(off, size) for off, size, kind in k.args if not kind.startswith("hidden_")]
        differ("kernel arguments (offset, size)", list(packed), explicit)
        kinds = [kind for _, _, kind in k.args if not kind.startswith("hidden_")]
        differ("argument kinds", ["global_buffer"] * len(step.bindings) + ["by_value"] * len(step.constants), kinds)
        differ("kernarg segment size", packed[-1][0] + packed[-1][1] if packed else 0, k.kernarg_size)
        differ("descriptor kernarg size", k.kernarg_size, k.descriptor.kernarg_size)
        if k.reqd_workgroup_size is not None:
            differ("workgroup size", e.block, k.reqd_workgroup_size)
        if e.block[0] * e.block[1] * e.block[2] > k.max_flat_workgroup_size:
            differ("workgroup size within the maximum", e.block, f"at most {k.max_flat_workgroup_size} work-items")
        differ("dynamic shared memory", e.shared_memory, 0)
        differ("descriptor LDS", k.group_segment, k.descriptor.group_segment)
        if k.group_segment > max_lds:
            differ("LDS", k.group_segment, f"at most {max_lds} B")
        differ("descriptor scratch", k.private_segment, k.descriptor.private_segment)
        differ("descriptor wave32", k.wavefront_size == 32, k.descriptor.wave32)
        found[step.kernel] = obj
    return found
