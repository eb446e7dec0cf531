"""The explicit GEMM kernel's shapes and tiling, and which problems it computes (no IREE import: the
plan uses it).

A 1x1 weight gradient in layout 4 (NGCHW/GKCYX/NGKHW) with stride 1 and no padding is, per group,
``dW[k, c] = sum_{n, hw} dy[n, k, hw] * x[n, c, hw]``: a GEMM whose operands are both contiguous
along the reduction, which is what the sm_80 kernel (``gemm_sm80``) computes.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GemmShape", "GemmTiling", "INTRINSIC", "SHARED_MEMORY_CAP", "gemm_shape", "unsupported"]

INTRINSIC = "NV_MMA_SYNC_F32_16x8x16_F16"  # the plan's name of mma.sync m16n8k16 f16 -> f32

# The sm_80 target's shared-memory limit (an A100's 163 KiB): IREE refuses a kernel above it
# (../shared/DESIGN.md: "a 4-stage 128x256x64 (216 KiB) is refused").
SHARED_MEMORY_CAP = 166_912
WARP = 32
MMA_M, MMA_N, MMA_K = 16, 8, 16
COPY_ELEMENTS = 8  # f16 elements in one 16-byte cp.async
ROW_PAD = 8  # elements of padding per shared row: a row stride of 16 bytes past a multiple of 128


@dataclass(frozen=True)
class GemmShape:
    """The batched GEMM: ``groups`` GEMMs of ``m x n``, reducing over ``images x hw`` elements."""

    groups: int
    m: int
    n: int
    images: int
    hw: int

    @property
    def reduction(self) -> int:
        return self.images * self.hw

    @property
    def flops(self) -> int:
        return 2 * self.groups * self.m * self.n * self.reduction


@dataclass(frozen=True)
class GemmTiling:
    """The kernel's numbers: workgroup tile ``bm x bn x bk``, ``stages`` of shared memory, warps ``wm x wn``."""

    bm: int = 128
    bn: int = 256
    bk: int = 64
    stages: int = 3
    wm: int = 64
    wn: int = 64

    @property
    def warps(self) -> int:
        return (self.bm // self.wm) * (self.bn // self.wn)

    @property
    def threads(self) -> int:
        return self.warps * WARP

    @property
    def row(self) -> int:
        """Shared-memory row stride in elements."""
        return self.bk + ROW_PAD

    def shared_bytes(self, element_bytes: int = 2) -> int:
        return self.stages * (self.bm + self.bn) * self.row * element_bytes

    def problems(self, shape: GemmShape, shared_cap: int = SHARED_MEMORY_CAP) -> list[str]:
        """Why this tiling cannot compute ``shape`` within ``shared_cap`` bytes of shared memory
        ("field: value ..." lines); empty if it can."""
        why = []
        sizes = (
            ("out_channels", shape.m, self.bm),
            ("in_channels", shape.n, self.bn),
            ("input_size", shape.hw, self.bk),
        )
        for name, size, tile in sizes:
            if size % tile:
                why.append(f"{name}: {size} elements are not a multiple of the explicit kernel's {tile}-element tile")
        if self.bm % self.wm or self.bn % self.wn or self.wm % MMA_M or self.wn % (2 * MMA_N) or self.bk % MMA_K:
            why.append(f"tiling: warp tile {self.wm}x{self.wn} does not divide {self.bm}x{self.bn} in mma tiles")
        for name, rows in (("bm", self.bm), ("bn", self.bn)):
            if (rows * self.bk // COPY_ELEMENTS) % self.threads:
                why.append(f"tiling: the {name}x{self.bk} tile is no whole number of 16-byte copies per thread")
        if self.shared_bytes() > shared_cap:
            why.append(f"stages: {self.stages} need {self.shared_bytes()} B of shared memory, over {shared_cap}")
        if self.threads > 1024:
            why.append(f"tiling: {self.threads} threads a workgroup, over 1024")
        if self.stages < 2:
            why.append(f"stages: at least 2, got {self.stages}")
        return why


def gemm_shape(problem) -> GemmShape:  # problem: convbw_mlir.problem.ConvBwdWeightProblem
    """The batched GEMM of a layout-4 1x1 problem (call :func:`unsupported` first)."""
    hw = 1
    for s in problem.input_size:
        hw *= s
    return GemmShape(problem.groups, problem.out_channels, problem.in_channels, problem.batch, hw)


def unsupported(problem, tiling: GemmTiling, shared_cap: int = SHARED_MEMORY_CAP) -> list[str]:
    """Why the explicit kernel cannot compute ``problem`` with ``tiling`` ("field: value ..." lines)."""
    why = []
    if problem.layout_family.x != "NGCHW":
        why.append(f"layout: {problem.layout} (the explicit kernel takes layout 4, NGCHW/GKCYX/NGKHW)")
    if any(f != 1 for f in problem.filter_size) or any(s != 1 for s in problem.stride):
        why.append(f"filter_size: {problem.filter_size}, stride {problem.stride} (1x1 with stride 1 only)")
    if any(problem.pad_low) or any(problem.pad_high):
        why.append(f"pad_low/pad_high: {problem.pad_low}/{problem.pad_high} (no padding only)")
    if problem.dtype != "f16":
        why.append(f"dtype: {problem.dtype} (f16 only)")
    if problem.dw_dtype not in ("f16", "f32"):
        why.append(f"dw_dtype: {problem.dw_dtype} (f32 or f16)")
    if problem.epilogue is not None:
        why.append(f"epilogue: {problem.epilogue.kind} (none yet)")
    if not why:
        why += tiling.problems(gemm_shape(problem), shared_cap)
    return why
