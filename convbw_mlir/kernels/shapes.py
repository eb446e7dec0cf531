"""The explicit kernel's problem view and tiling, and which problems it computes (no IREE import: the
plan uses it).

The weight gradient in layout 4 (NGCHW/GKCYX/NGKHW) is, per group, an implicit GEMM
``dW[k, j] = sum_r A[k, r] * B[j, r]``: M = K out channels, N = C x taps (``j = c * Y * X + y * X + x``,
so ``[K, N]`` is dW's own memory order), reduction ``r = (n, ho, wo)`` over N x Ho x Wo. A is dy,
contiguous along r within an image. B is x at ``(ho * s + y * d - p, wo * s + x * d - p)``: for a 1x1
with stride 1 and no padding that is x itself, contiguous like A (a plain GEMM, copied by ``cp.async``);
otherwise each element's address is computed per tile, zero outside the image (no im2col buffer).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["ConvGeometry", "GemmShape", "GemmTiling", "INTRINSIC", "SHARED_MEMORY_CAP", "auto_splits", "gemm_shape",
           "unsupported"]  # fmt: skip

INTRINSIC = "NV_MMA_SYNC_F32_16x8x16_F16"  # the plan's name of mma.sync m16n8k16 f16 -> f32

# The sm_80 target's shared-memory limit (an A100's 163 KiB): IREE refuses a kernel above it
# (../shared/DESIGN.md: "a 4-stage 128x256x64 (216 KiB) is refused").
SHARED_MEMORY_CAP = 166_912
WARP = 32
MMA_M, MMA_N, MMA_K = 16, 8, 16
COPY_ELEMENTS = 8  # f16 elements in one 16-byte cp.async
ROW_PAD = 8  # elements of padding per shared row: a row stride of 16 bytes past a multiple of 128


@dataclass(frozen=True)
class ConvGeometry:
    """Where B's elements live in x (a 2-D convolution): sizes ``(H, W)`` pairs."""

    in_size: tuple[int, int]
    out_size: tuple[int, int]
    filter: tuple[int, int]
    stride: tuple[int, int]
    dilation: tuple[int, int]
    pad: tuple[int, int]

    @property
    def taps(self) -> int:
        return math.prod(self.filter)


@dataclass(frozen=True)
class GemmShape:
    """``groups`` implicit GEMMs of ``m x n``, reducing over ``images x hw`` (hw: output positions an image).

    ``conv`` None: B is x as ``[images, groups, n, hw]`` (a 1x1, stride 1, no padding); else B is
    gathered from x ``[images, groups, channels, H, W]`` with ``n = channels * taps``. ``splits``
    cuts the reduction into that many partial sums (split-K), added up after the kernel.
    """

    groups: int
    m: int
    n: int
    images: int
    hw: int
    conv: ConvGeometry | None = None
    splits: int = 1

    @property
    def reduction(self) -> int:
        return self.images * self.hw

    @property
    def flops(self) -> int:
        return 2 * self.groups * self.m * self.n * self.reduction

    @property
    def channels(self) -> int:
        return self.n // self.conv.taps if self.conv else self.n

    def a_vector(self) -> int:
        """Elements of one copy of A (dy): the largest of 8, 4, 2, 1 that divides hw, so a copy stays in
        one image and keeps its alignment (8: ``cp.async.cg`` 16 bytes; 4, 2: ``cp.async.ca``; 1: a load)."""
        return next(v for v in (8, 4, 2, 1) if self.hw % v == 0)

    def b_vector(self) -> int:
        """The same for B: x's rows are A's shape for a plain GEMM; a gathered B is loaded element-wise."""
        return self.a_vector() if self.conv is None else 1


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
        if self.bm % self.wm or self.bn % self.wn or self.wm % MMA_M or self.wn % (2 * MMA_N) or self.bk % MMA_K:
            why.append(f"tiling: warp tile {self.wm}x{self.wn} does not divide {self.bm}x{self.bn} in mma tiles")
        for name, rows, v in (("bm", self.bm, shape.a_vector()), ("bn", self.bn, max(shape.b_vector(), 8))):
            if (rows * self.bk // v) % self.threads:
                why.append(f"tiling: the {name}x{self.bk} tile is no whole number of {2 * v}-byte copies per thread")
        if self.shared_bytes() > shared_cap:
            why.append(f"stages: {self.stages} need {self.shared_bytes()} B of shared memory, over {shared_cap}")
        if self.threads > 1024:
            why.append(f"tiling: {self.threads} threads a workgroup, over 1024")
        if self.stages < 2:
            why.append(f"stages: at least 2, got {self.stages}")
        return why


def gemm_shape(problem, splits: int = 1) -> GemmShape:  # problem: convbw_mlir.problem.ConvBwdWeightProblem
    """The implicit GEMM of a layout-4 problem (call :func:`unsupported` first)."""
    hw = 1
    for s in problem.output_size:
        hw *= s
    plain = all(f == 1 for f in problem.filter_size) and all(s == 1 for s in problem.stride)
    plain = plain and not any(problem.pad_low) and not any(problem.pad_high)
    conv = None
    taps = 1
    if not plain:
        conv = ConvGeometry(problem.input_size, problem.output_size, problem.filter_size, problem.stride,
                            problem.dilation, problem.pad_low)  # fmt: skip
        taps = conv.taps
    return GemmShape(problem.groups, problem.out_channels, problem.in_channels * taps, problem.batch, hw, conv,
                     splits)  # fmt: skip


def auto_splits(shape: GemmShape, tiling: GemmTiling, compute_units: int, min_tiles: int = 8) -> int:
    """Split-K partial sums so the grid fills the machine about once, each split at least ``min_tiles``
    k tiles long (CK's rule of thumb, split_k_utils.hpp: k_batch = max_occupancy * num_CUs / grid_size)."""
    tiles = shape.groups * -(-shape.m // tiling.bm) * -(-shape.n // tiling.bn)
    ktiles = -(-shape.reduction // tiling.bk)
    if tiles >= compute_units:
        return 1
    return max(1, min(-(-compute_units // tiles), ktiles // min_tiles))


def unsupported(problem, tiling: GemmTiling, shared_cap: int = SHARED_MEMORY_CAP) -> list[str]:
    """Why the explicit kernel cannot compute ``problem`` with ``tiling`` ("field: value ..." lines)."""
    why = []
    if problem.layout_family.x != "NGCHW":
        why.append(f"layout: {problem.layout} (the explicit kernel takes layout 4, NGCHW/GKCYX/NGKHW)")
    plain = all(f == 1 for f in problem.filter_size) and all(s == 1 for s in problem.stride)
    if not (plain and not any(problem.pad_low) and not any(problem.pad_high)) and problem.rank != 2:
        why.append(f"input_size: {problem.input_size} (a filter, stride or padding needs a 2-D problem)")
    if problem.dtype != "f16":
        why.append(f"dtype: {problem.dtype} (f16 only)")
    if problem.dw_dtype not in ("f16", "f32"):
        why.append(f"dw_dtype: {problem.dw_dtype} (f32 or f16)")
    if problem.epilogue is not None:
        why.append(f"epilogue: {problem.epilogue.kind} (none yet)")
    if not why and isinstance(tiling, GemmTiling):  # a CdnaTiling is checked by the plan, with the split
        why += tiling.problems(gemm_shape(problem), shared_cap)
    return why


CDNA_INTRINSIC = "MFMA_F32_16x16x16_F16"

# The AMD matrix forms the explicit kernel writes, by IREE's intrinsic name (a target's table entry
# picks one): f16 of A (and of B) a lane for one 16x16x16 instruction, f32 accumulators a lane, wave size.
# MFMA (CDNA, wave64): 4 and 4; WMMA on RDNA 3 (gfx11, wave32): 16 (lanes 16-31 repeat lanes 0-15) and
# 8; RDNA 4 (gfx12): 8 and 8 (IREE's IREEGPUAttrs.cpp, getSingleSubgroupLayout).
AMD_FORMS = {
    CDNA_INTRINSIC: (4, 4, 64),
    "WMMAR3_F32_16x16x16_F16": (16, 8, 32),
    "WMMAR4_F32_16x16x16_F16": (8, 8, 32),
}
AMD_LOAD = 8  # f16 elements of one 16-byte global load, LDS store and chunk of the reduction


@dataclass(frozen=True)
class CdnaTiling:
    """The AMD kernel's numbers (CDNA MFMA and RDNA WMMA forms): workgroup tile ``bm x bn x bk``, waves of
    ``wave`` lanes each ``wm x wn``, two LDS buffers (global -> registers -> LDS, double-buffered), the
    matrix ``intrinsic`` (a key of :data:`AMD_FORMS`)."""

    bm: int = 128
    bn: int = 128
    bk: int = 32
    wm: int = 32  # 8 waves of 32x64: 2 waves a SIMD on gfx942 (64x64 waves: 257 registers, 1)
    wn: int = 64
    wave: int = 64
    intrinsic: str = CDNA_INTRINSIC

    @property
    def threads(self) -> int:
        return (self.bm // self.wm) * (self.bn // self.wn) * self.wave

    @property
    def waves(self) -> int:
        return self.threads // self.wave

    @property
    def row(self) -> int:
        return self.bk + ROW_PAD

    def lds_bytes(self) -> int:
        return 2 * (self.bm + self.bn) * self.row * 2

    def planned_occupancy(self, target) -> int:  # target: convbw_mlir.targets.Target
        """Waves a SIMD the plan expects: what the two LDS buffers and the target's wave slots allow
        (the ISA report's LDS rule, convbw_mlir.isa.parse_rocmasm). The kernel meets it if its registers
        stay within :meth:`register_budget`."""
        by_lds = (target.lds_per_cu // self.lds_bytes()) * self.waves // target.simds_per_cu
        return max(1, min(target.max_waves_per_simd, by_lds))

    def register_budget(self, target) -> int:
        """The most registers a lane (VGPRs + AGPRs) that keep :meth:`planned_occupancy` (whole granules)."""
        per_wave = target.register_file // self.planned_occupancy(target)
        return min(target.registers, per_wave // target.register_granule * target.register_granule)

    def problems(self, shape: GemmShape, lds_cap: int) -> list[str]:
        """Why this tiling cannot compute ``shape`` ("field: value ..." lines); empty if it can.

        Any M, N and reduction (ragged edges are masked), any filter, stride, dilation and padding (B's
        addresses computed per element), split-K: only the tiling itself can be wrong."""
        why = []
        if self.intrinsic not in AMD_FORMS:
            why.append(f"intrinsic: {self.intrinsic} (the AMD forms: {', '.join(AMD_FORMS)})")
        elif AMD_FORMS[self.intrinsic][2] != self.wave:
            why.append(f"intrinsic: {self.intrinsic} runs on waves of {AMD_FORMS[self.intrinsic][2]}, not {self.wave}")
        if self.bm % self.wm or self.bn % self.wn or self.wm % 16 or self.wn % 16 or self.bk % 16:
            why.append(f"tiling: wave tile {self.wm}x{self.wn} does not divide {self.bm}x{self.bn} in 16x16 tiles")
        for name, rows in (("bm", self.bm), ("bn", self.bn)):
            if (rows * self.bk // AMD_LOAD) % self.threads:
                why.append(f"tiling: the {name}x{self.bk} tile is no whole number of 16-byte loads per thread")
        if self.threads > 1024:
            why.append(f"tiling: {self.threads} threads a workgroup, over 1024")
        if self.lds_bytes() > lds_cap:
            why.append(f"tiling: {self.lds_bytes()} B of LDS, over {lds_cap}")
        return why


# Test-only: the intrinsic whose operand form every RDNA kernel is built with (the plan's is ignored);
# the kernel cache's key names it, so a forced kernel is never stored under the plan's own key.
FORCE_FORM_ENV = "CONVBW_TEST_FORCE_WMMA_FORM"
