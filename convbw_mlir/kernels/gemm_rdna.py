"""The RDNA (WMMA) forms of the AMD explicit kernel: ``amdgpu.wmma 16x16x16`` f16 or bf16 -> f32, wave32.

The kernel is ``gemm_cdna.build_amd_kernel`` (global -> registers -> LDS, double-buffered, static LDS,
the implicit GEMM's per-element addresses, split-K, masked edges); only the matrix instruction's operand
form differs, and RDNA 3 and RDNA 4 each have their own (IREE's IREEGPUAttrs.cpp,
``getSingleSubgroupLayout``, which IREE's own WMMA kernels follow):

- ``WMMAR3`` (gfx11): A and B ``vector<16xf16>``: lane l holds row (column) l % 16 of A (B), all 16 k;
  lanes 16-31 repeat lanes 0-15. D ``vector<8xf32>``: accumulator e of lane l is D[2e + l / 16][l % 16].
- ``WMMAR4`` (gfx12): A and B ``vector<8xf16>``: lane l holds row (column) l % 16, k 8(l / 16) .. +7.
  D ``vector<8xf32>``: accumulator e of lane l is D[8(l / 16) + e][l % 16]. (The hardware takes k in
  a permuted order within a lane's registers; the same permutation on A and B leaves the sum as it is.)

Which form a target takes is its table entry's intrinsic (``convbw_mlir.targets``: gfx1100/gfx1151
``WMMAR3_*``, gfx1200/gfx1201 ``WMMAR4_*``), recorded in the plan's tile. The RDNA 3 form on gfx1200
aborts LLVM ("Cannot select": docs/iree-facts.md "AMD: static LDS, and the gfx12 WMMA form");
:data:`FORCE_FORM_ENV` forces a form whatever the plan says, for the test that an LLVM abort costs one compile
(``isolate=True``) and not the caller.

No AMD GPU exists here: these kernels are compiled and their ISA checked (v_wmma, no scratch), never run.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from iree.compiler import ir
from iree.compiler.dialects import amdgpu

from convbw_mlir.kernels.gemm_cdna import TILE, MatrixForm, build_amd_kernel, with_bf16
from convbw_mlir.policies.amd import AMD_FORMS, FORCE_FORM_ENV, CdnaTiling
from convbw_mlir.policies.sm80 import GemmShape

__all__ = ["FORCE_FORM_ENV", "FORMS", "build_kernel_body", "grid"]


@dataclass(frozen=True)
class WmmaForm(MatrixForm):
    def mma(self, a: ir.Value, b: ir.Value, acc: ir.Value) -> ir.Value:
        return amdgpu.wmma(TILE, TILE, TILE, a, b, acc)


def _form(intrinsic: str, k_lanes: int, acc_row: tuple[int, int]) -> WmmaForm:
    frag, acc, _ = AMD_FORMS[intrinsic]
    return WmmaForm(intrinsic, frag, acc, k_lanes, acc_row)


FORMS: dict[str, MatrixForm] = with_bf16(
    (
        _form("WMMAR3_F32_16x16x16_F16", 0, (1, 2)),  # all 16 k a lane; D row 2e + l / 16
        _form("WMMAR4_F32_16x16x16_F16", 8, (8, 1)),  # k 8(l / 16) .. +7; D row 8(l / 16) + e
    )
)


def grid(shape: GemmShape, t: CdnaTiling) -> tuple[int, int, int]:
    """Workgroups: N tiles, M tiles, groups x splits (as the CDNA form)."""
    from convbw_mlir.kernels.gemm_cdna import grid as amd_grid

    return amd_grid(shape, t)


def build_kernel_body(entry: ir.Block, a: ir.Value, b: ir.Value, c: ir.Value, shape: GemmShape, t: CdnaTiling) -> None:
    """Emit the RDNA kernel into ``entry`` in the WMMA operand form of ``t.intrinsic``."""
    name = os.environ.get(FORCE_FORM_ENV) or t.intrinsic
    if name not in FORMS:
        raise ValueError(f"intrinsic: {name} has no WMMA form here (forms: {', '.join(FORMS)})")
    build_amd_kernel(entry, a, b, c, shape, t, FORMS[name])
