"""How large an operand IREE 3.13 takes on this path, per IREE backend, and the check before compiling.

CK tests its weight-gradient kernels on operands over 2 GiB because 32-bit offsets silently wrap there.
In IREE 3.13 nothing on our path is 32-bit: the stream resource limits default to int64 and no HAL
device narrows them, the CPU, NVVM and ROCDL lowerings index with 64 bits, and the HAL allocators
accept any size. The one 32-bit path, AMD's buffer instructions, is taken only for bindings under
2 GiB. docs/limits.md gives the sources and what was compiled to check them.

:func:`check_limits` refuses, before compiling, a problem with an operand or intermediate buffer over
its backend's limit, naming the size and the limit. Importable without the IREE compiler.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from convbw_mlir.problem import DTYPES, INT64_MAX, ConvBwdWeightProblem
from convbw_mlir.targets import Target, resolve

__all__ = ["INT32_MAX", "LIMITS", "MAX_BINDING_BYTES", "BackendLimits", "buffers", "check_limits"]

INT32_MAX = 2**31 - 1

# Sources are iree-org/iree at b48a5955 (2026-08-21, the newest snapshot to hand; 3.13 is 89ece87b):
# paths under compiler/src/iree/compiler/ (C/) and runtime/src/iree/ (R/).
_STREAM = (
    "C/Dialect/Stream/IR/StreamTypes.cpp:47-62: --iree-stream-resource-max-allocation-size and "
    "--iree-stream-resource-max-range default to INT64_MAX, --iree-stream-resource-index-bits to 64; "
    "#hal.device.affinity implements no getResourceConfigAttr (C/Dialect/HAL/IR/HALAttrs.td:1024), so "
    "every backend gets these defaults"
)


@dataclass(frozen=True)
class BackendLimits:
    """What one IREE backend allows a buffer of a dispatch, with where each number comes from.

    Attributes:
        backend: IREE HAL target device (``local``, ``hip``, ``cuda``).
        max_binding_bytes: the largest buffer one dispatch binding may span (stream ``max_buffer_range``).
        max_allocation_bytes: the largest single allocation (stream ``max_allocation_size``; the runtime
            allocator's ``max_allocation_size`` is ``~0``, so device or host memory is the real bound).
        index_bits: bit width of ``index`` in the kernels' address arithmetic.
        max_workgroup_count: the grid IREE's codegen distributes within (x, y, z).
        buffer_instruction_bytes: bindings spanning fewer bytes use 32-bit-offset buffer instructions
            (AMD), larger ones 64-bit global addressing; None where there are none.
        sources: one line per fact.
    """

    backend: str
    max_binding_bytes: int
    max_allocation_bytes: int
    index_bits: int
    max_workgroup_count: tuple[int, int, int]
    buffer_instruction_bytes: int | None
    sources: tuple[str, ...]

    @property
    def max_buffer_bytes(self) -> int:
        """The largest buffer a dispatch can address: the least of the binding, allocation and index limits."""
        return min(self.max_binding_bytes, self.max_allocation_bytes, 2 ** (self.index_bits - 1) - 1)


LIMITS: dict[str, BackendLimits] = {
    "local": BackendLimits(
        "local",
        max_binding_bytes=INT64_MAX,
        max_allocation_bytes=INT64_MAX,
        index_bits=64,
        max_workgroup_count=(2**32 - 1,) * 3,
        buffer_instruction_bytes=None,
        sources=(
            _STREAM,
            "C/Codegen/LLVMCPU/ConvertToLLVM.cpp:1128: index width = the target's pointer size (64 on x86-64)",
            "R/hal/allocator_heap.c:128: max_allocation_size = ~0",
            "R/hal/command_buffer.h:482: uint32_t workgroup_count[3]",
        ),
    ),
    "hip": BackendLimits(
        "hip",
        max_binding_bytes=INT64_MAX,
        max_allocation_bytes=INT64_MAX,
        index_bits=64,
        max_workgroup_count=(INT32_MAX,) * 3,
        buffer_instruction_bytes=INT32_MAX,
        sources=(
            _STREAM,
            "C/Codegen/LLVMGPU/ConvertToROCDL.cpp:243: overrideIndexBitwidth(64)",
            "C/Codegen/LLVMGPU/ROCDLConfigureBufferInstructions.cpp:165: buffer instructions only for bindings "
            "spanning < INT32_MAX bytes (statically bounded); larger ones use global pointers",
            "R/hal/drivers/hip/hip_allocator.c:273: max_allocation_size = ~0",
            "C/Codegen/Dialect/GPU/TargetUtils/KnownTargets.cpp:294 (CDNA3; CDNA2/4, RDNA3/4 alike): "
            "max workgroup counts 0x7fffffff each",
        ),
    ),
    "cuda": BackendLimits(
        "cuda",
        max_binding_bytes=INT64_MAX,
        max_allocation_bytes=INT64_MAX,
        index_bits=64,
        max_workgroup_count=(INT32_MAX, 0xFFFF, 0xFFFF),
        buffer_instruction_bytes=None,
        sources=(
            _STREAM,
            "C/Codegen/LLVMGPU/ConvertToNVVM.cpp:84: overrideIndexBitwidth(64)",
            "R/hal/drivers/cuda/cuda_allocator.c:194: max_allocation_size = ~0",
            "C/Codegen/Dialect/GPU/TargetUtils/KnownTargets.cpp:1055 (Ampere): max workgroup counts "
            "(0x7fffffff, 0xffff, 0xffff)",
        ),
    ),
}

#: The largest buffer one dispatch can address, per IREE backend.
MAX_BINDING_BYTES: dict[str, int] = {name: lim.max_buffer_bytes for name, lim in LIMITS.items()}


def buffers(problem: ConvBwdWeightProblem) -> list[tuple[str, int]]:
    """(name, bytes) of every buffer a compiled problem's dispatches bind, split-K partials aside
    (their count is the pass's choice): x, x with its pads, dy, the f32 accumulator and dW."""
    p = problem
    padded = [i + lo + hi for i, lo, hi in zip(p.input_size, p.pad_low, p.pad_high)]
    x_rows = p.batch * p.groups * p.in_channels
    dw = math.prod(p.dw_shape)
    out = [("x", x_rows * math.prod(p.input_size) * DTYPES[p.dtype])]
    if padded != list(p.input_size):
        out.append(("x padded", x_rows * math.prod(padded) * DTYPES[p.dtype]))
    out += [("dy", math.prod(p.dy_shape) * DTYPES[p.dtype]), ("dw f32 accumulator", dw * 4)]
    out.append(("dw", dw * DTYPES[p.dw_dtype]))
    return out


def check_limits(problem: ConvBwdWeightProblem, target: str | Target) -> None:
    """Refuse, before compiling, a problem with a buffer larger than ``target``'s backend can address.

    Raises:
        ValueError: naming the buffer, its size and the limit (and the target and backend).
    """
    tgt = resolve(target)
    lim = LIMITS[tgt.backend]
    for name, nbytes in buffers(problem):
        if nbytes > lim.max_buffer_bytes:
            raise ValueError(
                f"{name}: {nbytes} bytes, more than the {lim.max_buffer_bytes} bytes one buffer may span on "
                f"{tgt.name} (IREE {lim.backend} backend, {lim.index_bits}-bit indices); docs/limits.md"
            )
