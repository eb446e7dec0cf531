"""The HIP launch, read at compile time: the schedule of a ``rocm-hsaco-fb`` module at IREE's ``hal`` phase (the
same IR the direct CUDA launch reads, :mod:`convbw_mlir.build.cuda_schedule`) and the HSACO code objects from
IREE's HIP executable flatbuffer (iree/schemas/hip_executable_def.fbs: exports{kernel_name, block_dims,
constant_count, binding_flags}, modules{hsaco_image}), the same flatbuffer the ``.vmfb`` carries as a rodata
segment (iree/schemas/bytecode_module_def.fbs; iree/vm/bytecode/archive.c places it). The code objects are
checked against the schedule (:func:`convbw_mlir.hip_code_object.check_hip_launch`).
"""

from __future__ import annotations

import struct
from typing import Any

from convbw_mlir.build.cuda_schedule import _Table, compile_with_launch, read_launch
from convbw_mlir.cuda_launch import ExportDef, Launch
from convbw_mlir.hip_code_object import HIP_FORMAT, CodeObjectError

__all__ = ["compile_with_hip_launch", "hip_executables_in_vmfb", "read_hip_executable", "read_hip_launch"]


# -- IREE's HIP executable and the vmfb that carries it --------------------------------------------
def read_hip_executable(data: bytes) -> tuple[list[ExportDef], list[bytes]]:
    """The exports and HSACO images of a ``rocm-hsaco-fb`` executable binary: IREE's 64-byte file header
    (magic ``HIP1``, version 0, content size; iree/base/internal/flatcc/parsing.h) and an
    ``iree.hal.hip.ExecutableDef`` flatbuffer (identifier ``HIP1``).

    Raises:
        CodeObjectError: not a HIP executable this reader knows.
    """
    if len(data) < 72 or data[:4] != b"HIP1":
        raise CodeObjectError(f"executable: not an IREE HIP executable (starts with {bytes(data[:4])!r})")
    version, size = struct.unpack_from("<IQ", data, 4)
    if version != 0 or size > len(data) - 64:
        raise CodeObjectError(f"executable: header version {version}, size {size} not readable")
    fb = bytes(data[64 : 64 + size])
    if fb[4:8] != b"HIP1":
        raise CodeObjectError(f"executable: flatbuffer identifier {fb[4:8]!r}, expected b'HIP1'")
    try:
        root = _Table(fb, struct.unpack_from("<I", fb, 0)[0])
        exports = [
            # ExportDef fields: module_ordinal, kernel_name, block_dims, block_shared_memory_size,
            # constant_count, binding_flags, debug_info
            ExportDef(e.bytes_(1).decode(), e.u32(0), tuple(e.struct_u32(2, 3)), e.u32(3), e.u32(4), e.vector_len(5))
            for e in root.tables(0)
        ]
        images = [m.bytes_(0) for m in root.tables(1)]
    except (struct.error, UnicodeDecodeError) as e:
        raise CodeObjectError(f"executable: corrupt flatbuffer ({type(e).__name__}: {e})") from None
    for e in exports:
        if e.module >= len(images):
            raise CodeObjectError(f"executable: export {e.name} names module {e.module} of {len(images)}")
    return exports, images


def hip_executables_in_vmfb(vmfb: bytes) -> list[bytes]:
    """The HIP executables a ``.vmfb`` embeds, in rodata order: the archive's optional ZIP local header is
    skipped, the size-prefixed ``iree.vm.BytecodeModuleDef`` read, and each rodata segment (embedded, or
    external: after the flatbuffer, rounded up to 64 bytes) that starts with the ``HIP1`` header returned.

    Raises:
        CodeObjectError: not a vmfb this reader knows.
    """
    try:
        start = 0
        if vmfb[:4] == b"PK\x03\x04":  # the polyglot ZIP's first local file header
            name_len, extra_len = struct.unpack_from("<HH", vmfb, 26)
            start = 30 + name_len + extra_len
        (size,) = struct.unpack_from("<I", vmfb, start)
        fb = bytes(vmfb[start + 4 : start + 4 + size])
        if len(fb) != size or fb[4:8] != b"IREE":
            raise CodeObjectError(f"vmfb: no IREE bytecode module at byte {start} (identifier {fb[4:8]!r})")
        rodata = -(-(start + 4 + size) // 64) * 64
        root = _Table(fb, struct.unpack_from("<I", fb, 0)[0])
        out = []
        for seg in root.tables(9):  # BytecodeModuleDef.rodata_segments
            # RodataSegmentDef: compression_type (a union: 2 slots), embedded_data, external offset, length
            if seg.u32(0):
                raise CodeObjectError("vmfb: a compressed rodata segment (not written by IREE 3.13)")
            data = seg.bytes_(2)
            if not data and seg._field(3):
                off, n = (struct.unpack_from("<Q", fb, seg._field(i))[0] if seg._field(i) else 0 for i in (3, 4))
                data = bytes(vmfb[rodata + off : rodata + off + n])
            if data[:4] == b"HIP1":
                out.append(data)
        return out
    except struct.error as e:
        raise CodeObjectError(f"vmfb: truncated or corrupt ({e})") from None


def read_hip_launch(module: Any, function: str = "conv_bwd_weight") -> Launch:
    """The launch schedule and HSACO images of a module compiled to the ``hal`` phase for a HIP target;
    ``Launch.ptx`` holds the HSACO images. Never raises for an unsupported schedule: ``refused`` says why."""
    return read_launch(module, function, {HIP_FORMAT: read_hip_executable})


def compile_with_hip_launch(bytecode: bytes, target: Any, extra_flags: list[str] | None) -> tuple[bytes, Launch]:
    """As :func:`convbw_mlir.build.cuda_schedule.compile_with_launch`, for a HIP target: the vmfb and its launch,
    read at the ``hal`` phase of the same compile.

    Raises:
        CompileError: IREE's diagnostics.
    """
    return compile_with_launch(bytecode, target, extra_flags, read_hip_launch)
