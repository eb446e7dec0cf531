"""The ISA report: what IREE's dumped intermediates say about each kernel.

AMD (``*.rocmasm``): counts of every MFMA/WMMA mnemonic, VGPR / AGPR / SGPR counts, LDS bytes, scratch
bytes (spills) and the occupancy limit in waves per SIMD from registers and from LDS.
NVIDIA (``*.optimized.ll``, the NVPTX LLVM IR; IREE 3.13 dumps no PTX): the count of ``mma.sync``
intrinsics and the shared memory the kernel declares. Which file to read and every hardware limit
(register file and granule, waves per SIMD, SIMDs and LDS per CU, wave size) come from the target's
entry in :data:`convbw_mlir.targets.TARGETS`.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

from convbw_mlir.targets import Target, get_target, resolve

__all__ = ["KernelReport", "IsaReport", "dropped_configs", "parse_nvptx_ll", "parse_rocmasm", "report"]


@dataclass
class KernelReport:
    name: str
    mma: dict[str, int] = field(default_factory=dict)  # mnemonic -> static count
    vgpr: int | None = None
    agpr: int | None = None
    sgpr: int | None = None
    lds_bytes: int = 0
    scratch_bytes: int = 0
    workgroup_size: int | None = None
    occupancy: int | None = None  # waves per SIMD (AMD) allowed by registers and LDS
    occupancy_limit: str = ""  # "vgpr", "lds" or "waves"

    @property
    def mma_count(self) -> int:
        return sum(self.mma.values())


@dataclass
class IsaReport:
    target: str
    kernels: list[KernelReport]

    @property
    def main(self) -> KernelReport:
        """The kernel doing the contraction: most matrix instructions, else the one IREE named after a
        convolution or matmul (its dispatch names say what they hold), else most registers."""

        def contraction(k: KernelReport) -> bool:
            return any(word in k.name for word in ("_conv_", "_matmul", "_contract"))

        return max(self.kernels, key=lambda k: (k.mma_count, contraction(k), k.vgpr or 0, k.lds_bytes))

    @property
    def scratch_bytes(self) -> int:
        return max((k.scratch_bytes for k in self.kernels), default=0)

    def to_dict(self) -> dict:
        return {"target": self.target, "kernels": [asdict(k) | {"mma_count": k.mma_count} for k in self.kernels]}

    def summary(self) -> str:
        k = self.main
        mma = ", ".join(f"{n} x{c}" for n, c in sorted(k.mma.items())) or "none"
        regs = f"vgpr {k.vgpr} agpr {k.agpr} sgpr {k.sgpr}" if k.vgpr is not None else "registers n/a"
        occ = f"occupancy {k.occupancy} waves/SIMD ({k.occupancy_limit})" if k.occupancy else ""
        return (
            f"{self.target}: {len(self.kernels)} kernels; main {k.name}: mma [{mma}], {regs}, "
            f"LDS {k.lds_bytes} B, scratch {self.scratch_bytes} B {occ}".rstrip()
        )


_KERNEL = re.compile(r"^\s*\.amdhsa_kernel\s+(\S+)", re.M)
_DIRECTIVE = re.compile(r"^\s*\.amdhsa_(\w+)\s+(\d+)", re.M)
_MMA_AMD = re.compile(r"^\s*(v_mfma_\w+|v_wmma_\w+|v_smfmac_\w+)", re.M)
_FUNC = re.compile(r"^(\w+):\s*(?:;.*)?$", re.M)


_METADATA = re.compile(r"^\s*\.amdgpu_metadata\s*$(.*?)^\s*\.end_amdgpu_metadata", re.M | re.S)
# amdhsa.kernels entries start at "  - "; their own keys sit at 4 spaces (the args' at 8), in any order.
_ENTRY = re.compile(r"^  - ", re.M)
_ENTRY_NAME = re.compile(r"^ {4}\.name:\s+(\S+)", re.M)
_ENTRY_WG = re.compile(r"^ {4}\.max_flat_workgroup_size:\s+(\d+)", re.M)


def _workgroup_sizes(text: str) -> dict[str, int]:
    """Kernel name -> ``.max_flat_workgroup_size`` from the code object metadata (YAML) of a ``.rocmasm``."""
    sizes: dict[str, int] = {}
    for meta in _METADATA.findall(text):
        for entry in _ENTRY.split(meta)[1:]:
            entry = "    " + entry  # the first key shares the "  - " line
            name, wg = _ENTRY_NAME.search(entry), _ENTRY_WG.search(entry)
            if name and wg:
                sizes[name.group(1)] = int(wg.group(1))
    return sizes


def parse_rocmasm(text: str, target: Target | str) -> list[KernelReport]:
    """Kernels of an AMD ``.rocmasm`` file with their MMA mnemonics, registers, LDS, scratch, occupancy.

    Args:
        text: the ``.rocmasm`` text.
        target: the :class:`~convbw_mlir.targets.Target` (or its name) the file was compiled for; its
            register file, allocation granule, waves per SIMD, SIMDs and LDS per CU bound the occupancy.
    """
    t = resolve(target)
    workgroup_sizes = _workgroup_sizes(text)
    # Instruction counts per function body: a body runs from its label to the next .amdhsa_kernel block.
    bodies: dict[str, str] = {}
    labels = list(_FUNC.finditer(text))
    for i, m in enumerate(labels):
        end = labels[i + 1].start() if i + 1 < len(labels) else len(text)
        bodies[m.group(1)] = text[m.end() : end]
    kernels = []
    blocks = list(_KERNEL.finditer(text))
    for m in blocks:
        end = text.find(".end_amdhsa_kernel", m.end())
        directives = {k: int(v) for k, v in _DIRECTIVE.findall(text[m.end() : end])}
        name = m.group(1)
        mma: dict[str, int] = {}
        for mnemonic in _MMA_AMD.findall(bodies.get(name, "")):
            mma[mnemonic] = mma.get(mnemonic, 0) + 1
        vgpr_total = directives.get("next_free_vgpr")
        accum = directives.get("accum_offset")
        k = KernelReport(
            name=name,
            mma=mma,
            # .amdhsa_accum_offset is where AGPRs start in the unified file; past next_free_vgpr: no AGPRs.
            vgpr=min(accum, vgpr_total) if (accum is not None and vgpr_total is not None) else vgpr_total,
            agpr=max(0, vgpr_total - accum) if (accum is not None and vgpr_total is not None) else 0,
            sgpr=directives.get("next_free_sgpr"),
            lds_bytes=directives.get("group_segment_fixed_size", 0),
            scratch_bytes=directives.get("private_segment_fixed_size", 0),
        )
        k.workgroup_size = workgroup_sizes.get(name)
        if vgpr_total:
            # LLVM's occupancy rule: a wave holds its registers rounded up to the allocation granule.
            used = -(-vgpr_total // t.register_granule) * t.register_granule
            by_vgpr = min(t.max_waves_per_simd, t.register_file // used)
            limits = {"vgpr": by_vgpr, "waves": t.max_waves_per_simd}
            if k.lds_bytes and k.workgroup_size:
                waves_per_wg = -(-k.workgroup_size // t.subgroup_size)
                limits["lds"] = (t.lds_per_cu // k.lds_bytes) * waves_per_wg // t.simds_per_cu
            k.occupancy_limit, k.occupancy = min(limits.items(), key=lambda kv: kv[1])
        kernels.append(k)
    return kernels


_LL_FUNC = re.compile(r"^define\s.*?@(\w+)\(", re.M)
_MMA_NV = re.compile(r"call [^@]*@(llvm\.nvvm\.mma\.[\w.]+)")
# sm_90a's wgmma reaches the LLVM IR as inline PTX (NVVM's wgmma op is lowered that way): its mnemonic up to A's type
_WGMMA_NV = re.compile(r"call [^\n]*asm [^\n]*?(wgmma\.mma_async\.sync\.aligned\.m\d+n\d+k\d+\.f32\.[a-z0-9]+)")
_SHARED = re.compile(r"^@(\S+)\s*=.*addrspace\(3\).*?\[(\d+) x (i8|half|float|i32|bfloat|i16)\]", re.M)
_BYTES = {"i8": 1, "half": 2, "bfloat": 2, "i16": 2, "float": 4, "i32": 4}


def parse_nvptx_ll(text: str) -> list[KernelReport]:
    """Kernels of an NVPTX ``.optimized.ll`` with their ``mma.sync`` intrinsics (and sm_90a's ``wgmma``) and
    shared memory."""
    shared = sum(int(n) * _BYTES[t] for _, n, t in _SHARED.findall(text))
    funcs = list(_LL_FUNC.finditer(text))
    kernels = []
    for i, m in enumerate(funcs):
        end = funcs[i + 1].start() if i + 1 < len(funcs) else len(text)
        mma: dict[str, int] = {}
        body = text[m.end() : end]
        for name in _MMA_NV.findall(body) + _WGMMA_NV.findall(body):
            mma[name] = mma.get(name, 0) + 1
        kernels.append(KernelReport(name=m.group(1), mma=mma, lds_bytes=shared if len(funcs) == 1 else 0))
    if len(funcs) > 1 and kernels:  # module-level shared globals: attribute them to the MMA kernel
        max(kernels, key=lambda k: k.mma_count).lds_bytes = shared
    return kernels


def report(files: dict[str, str], target: str) -> IsaReport:
    """The report for one compile's intermediates (``convbw_mlir.build.iree.Intermediates.files``)."""
    t = get_target(target)
    parse = {".rocmasm": lambda text: parse_rocmasm(text, t), ".optimized.ll": parse_nvptx_ll}.get(t.isa_suffix)
    if parse is None:
        raise ValueError(f"isa: no report for {t.family} ISA ({t.isa_suffix} files); target {target!r}")
    kernels: list[KernelReport] = []
    for name, text in sorted(files.items()):
        if name.endswith(t.isa_suffix):
            kernels += parse(text)
    if not kernels:
        raise ValueError(f"isa: no {t.family} kernels in the intermediates ({sorted(files)})")
    return IsaReport(target, kernels)


_LOWERING_CONFIG = re.compile(r"#iree_gpu\.lowering_config<\{.*?\}>")


def dropped_configs(linalg_text: str, files: dict[str, str]) -> list[str]:
    """Our lowering configs (in the input IR) that no kernel was compiled with.

    IREE honours a ``compilation_info`` on the root op of a dispatch, but it drops it when it rebuilds
    the op before codegen (unit-dimension folding did, until the lowering left no unit dimensions):
    the configured executables (``configured_*.mlir`` in :class:`convbw_mlir.build.iree.Intermediates`)
    then carry IREE's own config instead. Both print the attribute the same way, so the text compares.
    """
    configured = "\n".join(text for name, text in files.items() if name.startswith("configured_"))
    if not configured:
        raise ValueError("isa: the intermediates hold no configured executables (configured_*.mlir)")
    return [c for c in dict.fromkeys(_LOWERING_CONFIG.findall(linalg_text)) if c not in configured]
