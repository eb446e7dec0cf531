"""Planning decisions shared by the passes, importable without the IREE compiler: how a reduction is
split (split-K), which tile a target gets, and when a problem is too thin for matrix cores.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from convbw_mlir.problem import DTYPES, ConvBwdWeightProblem

__all__ = [
    "SimtTile",
    "Split",
    "Tile",
    "auto_k_batch",
    "choose_simt_tile",
    "choose_tile",
    "pick_intrinsic",
    "plan_rows_split",
    "plan_split",
    "plan_split_k",
    "reduction_extents",
    "rows_split_pays",
    "simt_threads_fit",
]


@dataclass(frozen=True)
class Split:
    """A split of one reduction loop into ``k_batch`` chunks of ``chunk`` iterations.

    ``dim`` is ``n`` (batch) or ``o0``/``o1``/``o2`` (an output spatial loop, outermost first). When
    ``k_batch * chunk`` exceeds the loop's extent the last chunk reads zero padding: no work is
    dropped and the padding contributes nothing.

    A comma-separated ``dim`` (``"n,o0"``, a *rows* split) names loops made parallel whole: every
    combination (each image's each output row) is its own partial sum, ``chunk`` is 1 and ``k_batch``
    the product of their extents. Nothing is reshaped for it: the loops simply stop being reductions.
    """

    dim: str
    k_batch: int
    chunk: int

    def __post_init__(self) -> None:
        if self.k_batch < 1 or self.chunk < 1:
            raise ValueError(f"split: k_batch and chunk must be positive, got {self.k_batch} and {self.chunk}")
        if self.promoted and self.chunk != 1:
            raise ValueError(f"split: a split over loops {self.dim} takes chunk 1, got {self.chunk}")

    @property
    def padded_extent(self) -> int:
        return self.k_batch * self.chunk

    @property
    def promoted(self) -> tuple[str, ...]:
        """The loops a rows split makes parallel (empty for a chunked split of one loop)."""
        return tuple(self.dim.split(",")) if "," in self.dim else ()


def _divisors(n: int, limit: int) -> list[int]:
    """The divisors of ``n`` up to ``limit`` (1 always among them)."""
    return [d for d in range(1, min(n, max(limit, 1)) + 1) if n % d == 0]


def reduction_extents(problem: ConvBwdWeightProblem) -> dict[str, int]:
    """Extents of the reduction loops: ``n`` and ``o0``.. (output spatial, outermost first)."""
    return {"n": problem.batch, **{f"o{i}": o for i, o in enumerate(problem.output_size)}}


# A rows split writes N * O0 partial sums of the accumulator, which stage 2 reads back. `auto` takes it
# only while they are at most this fraction of the bytes of x and dy. H200 (sm_80 code, f16, one run,
# both forms with the gather pad; bench/results/h200_2026-11-22_depthwise.md), rows vs batch split (32):
# partials/inputs 0.06 (MobileNetV2 G=96 112x112 s2): 403 vs 441 us; 0.16 (G=144 56x56): 331 vs 327;
# 0.64 (G=384 14x14): 98 vs 71; 0.89 (EfficientNet 5x5 G=240): 512 vs 291; 1.29 (G=960 7x7): 103 vs
# 73; 1.79 (5x5 G=672): 271 vs 135; ResNeXt G=32 C=K=4 (0.64): 8576 vs 530 us.
MAX_ROWS_PARTIAL_FRACTION = 0.1
# The SIMT thread over a rows split holds C * taps f32 accumulators; beyond this they leave registers.
MAX_THREAD_ACCUMULATORS = 64


def plan_rows_split(problem: ConvBwdWeightProblem) -> Split | None:
    """Each image's each first-output-row its own partial sum: loops ``n`` and ``o0`` made parallel.

    For the SIMT strategy (depthwise, thin groups): with these loops parallel, a thread owns one (image,
    row, channel) and all filter taps, and reads channels-last x and dy along the channel, coalesced;
    IREE's reduction codegen instead gives each dW element a subgroup reducing along a strided
    dimension. None where it does not apply: a 1-D problem (nothing would be left to reduce in a
    partial) or fewer than 2 partials. Whether it pays is :func:`rows_split_pays`.
    """
    if problem.rank < 2:
        return None
    count = problem.batch * problem.output_size[0]
    return Split("n,o0", count, 1) if count > 1 else None


def rows_split_pays(problem: ConvBwdWeightProblem, split: Split) -> bool:
    """Whether the rows split's partial sums are small against the inputs (:data:`MAX_ROWS_PARTIAL_FRACTION`)."""
    partial_bytes = split.k_batch * math.prod(problem.shape("acc")) * 4
    input_bytes = (math.prod(problem.x_shape) + math.prod(problem.dy_shape)) * DTYPES[problem.dtype]
    return partial_bytes <= MAX_ROWS_PARTIAL_FRACTION * input_bytes


def plan_split_k(problem: ConvBwdWeightProblem, target, k_batch: int | str) -> Split | None:
    """The split ``convbw-split-k{k-batch}`` makes: ``rows`` (:func:`plan_rows_split`), a number of batch
    splits (:func:`plan_split`), or ``auto``: on a GPU target the rows split for problems too thin for
    matrix cores whose threads hold a dW row and whose partials pay (:func:`rows_split_pays`), else the
    even batch split of :func:`auto_k_batch`."""
    if k_batch == "rows":
        return plan_rows_split(problem)
    if k_batch != "auto":
        return plan_split(problem, k_batch)
    if target.is_gpu and pick_intrinsic(problem, target) is None and simt_threads_fit(problem):
        rows = plan_rows_split(problem)
        if rows is not None and rows_split_pays(problem, rows):
            return rows
    return plan_split(problem, auto_k_batch(problem, target), even=True)


def plan_split(problem: ConvBwdWeightProblem, k_batch: int, even: bool = False) -> Split | None:
    """Split the reduction into (at most) ``k_batch`` chunks of the batch; None when nothing is split.

    Only the batch loop is split: its chunks read whole images, x and dy get a plain [k_batch, chunk]
    batch dimension, and IREE still sees a convolution (its IGEMM path and matrix cores stay). An
    output-row split (index ``(s * chunk + o) * stride + f * dilation``) is valid linalg and
    ``convbw-lower-to-linalg`` builds it for a ``split_dim = "o<i>"`` op, but IREE 3.13 crashes compiling
    it (segfault, seen here on host, gfx942 and sm_80 with N=1 problems), so no plan produces one.
    A batch shorter than ``k_batch`` yields fewer chunks, never empty ones (5 images in 3 -> 3 chunks of 2,
    the last padded with a zero image). ``even`` takes the largest divisor of N instead: on the H200 an
    uneven split (N=32 in 6) produced NaNs in IREE's sm_80 code (the padded images were not zeros there;
    exact on the CPU), and padding costs a copy of x, so automatic plans are even.

    Raises:
        ValueError: ``k_batch`` below 1.
    """
    if not isinstance(k_batch, int) or isinstance(k_batch, bool) or k_batch < 1:
        raise ValueError(f"k_batch: must be a positive integer, got {k_batch!r}")
    n = problem.batch
    if k_batch == 1 or n == 1:
        return None
    if even:  # the largest divisor of N not above k_batch: no padded images
        k_batch = max(_divisors(n, k_batch))
        if k_batch == 1:
            return None
    chunk = math.ceil(n / k_batch)
    kb = math.ceil(n / chunk)
    return Split("n", kb, chunk) if kb > 1 else None


# -- tiles ------------------------------------------------------------------------------------------
# Below these, a group's GEMM is too thin for matrix cores: every intrinsic is 16 wide in M and N, so
# K (out channels) < 8 or C * filter < 16 wastes more than half of each instruction. Depthwise (K=C=1)
# and ResNeXt-style 4-channel groups go to the split-K + vectorized-reduction strategy instead.
MIN_MMA_M = 8
MIN_MMA_N = 16
# Each split of the reduction keeps at least this many reduction elements (N * prod(output) / k_batch):
# shorter splits cost more in the second stage and in launch than they win in parallelism. 512, not
# 256: of the suites' problems it changes two on sm_80, measured side by side three times on the H200
# (bench/results/h200_2026-11-22_tiles.md, section 8): video_r3d 256 s2 (784) unsplit 144/137/123 us
# vs split in 2 179/216/156; streamk 3x3 128 N=32 14x14 (6272) in 8 95/98/96 vs in 16 95/91/117.
MIN_SPLIT_REDUCTION = 512
# 1x1 problems too thin for matrix cores (K or C of a few channels): IREE 3.13's f16 reduction kernels
# for them gave wrong dW on the H200 split 64 ways (N=64; CK's ck2d_a/c/d, K=C=4/3/5) and right ones
# unsplit and split in 2 (134 us and 105 us for ck2d_a; bench/results/h200_2026-11-22_gemm_order.md).
MAX_THIN_GEMM_SPLITS = 2
# RDNA (wave32 WMMA), f32 accumulators a lane by input type: a 128 x 128 tile over 4 waves is 128 a
# lane, and spilled 128-144 B on gfx1100 and gfx1151 (CK's ck1d_b, ck2d_e, ck3d_b;
# bench/results/isa_2026-11-22.md); 64 x 128 (64 a lane) compiled without scratch in f16 but spilled
# 36-100 B in bf16 (ck2d_e on gfx1100 and gfx1151, 3x3 256-channel layers on gfx1151); 32 x 128 did not.
RDNA_ACC_PER_LANE = {"f16": 64, "bf16": 32}
# Resident workgroups per CU the occupancy model assumes for the MMA kernels (4-wave workgroups, about
# 128 VGPRs each on CDNA: 2 workgroups per SIMD-set); CK's equivalent comes from its kernel's occupancy.
OCCUPANCY = 2


@dataclass(frozen=True)
class Tile:
    """A workgroup's work, in elements: an ``m`` (out channels) by ``n`` (in channels) tile of one
    group and filter tap, ``k`` reduction elements per step, ``subgroups_m x subgroups_n`` waves,
    ``stages`` of prefetch. ``intrinsic`` is the matrix instruction, or None for the SIMT strategy."""

    m: int
    n: int
    k: int
    subgroups_m: int
    subgroups_n: int
    stages: int
    intrinsic: str | None

    @property
    def subgroups(self) -> int:
        return self.subgroups_m * self.subgroups_n


def _pow2_at_least(v: int, lo: int, hi: int) -> int:
    p = lo
    while p < v and p < hi:
        p *= 2
    return p


def pick_intrinsic(problem: ConvBwdWeightProblem, target):  # -> Intrinsic | None
    """The target's preferred matrix instruction for the problem's input type, or None (no MMA)."""
    options = getattr(target, "intrinsics", {}).get(problem.dtype, ())
    if not options:
        return None
    _, m, n, _ = problem.gemm
    if problem.out_channels < MIN_MMA_M or problem.in_channels * math.prod(problem.filter_size) < MIN_MMA_N:
        return None
    return options[0]


# N tiles are halved (down to this) while the grid, splits included, is below OCCUPANCY workgroups a
# CU. H200, sm_80 code, one run with every variant (bench/results/h200_2026-11-22_tiles.md): N 64
# instead of 128 was 1.07x faster in geomean over the 22 MMA convolutions of the seeds and models
# (1.1-1.33x on RetinaNet's heads, dilated 3x3, video s2, which have 18-216 workgroups against the
# 132 SMs); it lost (0.81x) on RetinaNet K=2376, whose 342 workgroups fill the GPU already. M of 32
# instead of 64-128 was 0.93x in geomean: M is not shrunk.
MIN_OCCUPANCY_TILE_N = 64


def choose_tile(problem: ConvBwdWeightProblem, target, k_batch: int | None = None, **overrides: int) -> Tile:
    """Workgroup tile, reduction step, subgroup layout and prefetch depth for ``problem`` on ``target``.

    M tiles the out channels and N the in channels (the filter channel is innermost, so it is the loop the
    N side of the instruction walks); each filter tap is its own tile. Tiles are powers of two from one
    intrinsic up to 128, so that a small K or C (36, 3) pads to the next power of two, not to 128. Four
    waves per workgroup; the reduction step keeps (m + n) * k * bytes within half the LDS, at most 64.
    With ``k_batch`` (the split already planned), N is halved down to :data:`MIN_OCCUPANCY_TILE_N`
    while ``grid * k_batch`` stays below ``OCCUPANCY`` workgroups a CU (:func:`_grid`); split-K planning
    itself sizes the grid with the unshrunk tile (:func:`auto_k_batch`).
    ``overrides`` (m, n, k, subgroups_m, subgroups_n, stages) replace any choice.
    """
    intr = pick_intrinsic(problem, target)
    if intr is None:
        return Tile(1, 1, 1, 1, 1, 1, None)
    m = _pow2_at_least(problem.out_channels, intr.m, 128)
    n = _pow2_at_least(problem.in_channels, intr.n, 128)
    cus = getattr(target, "compute_units", 0)
    # Not on RDNA: its accumulator cap below halves M already, and 128 x 64 there spilled 72 B
    # (RetinaNet K=C=256 13x13, gfx1100/gfx1201; lit/isa/mnemonics.test).
    while (
        k_batch is not None
        and target.family != "rdna"
        and "n" not in overrides
        and n // 2 >= max(MIN_OCCUPANCY_TILE_N, 2 * intr.n)
        and _grid(problem, m, n) * k_batch < cus * OCCUPANCY
    ):
        n //= 2
    m, n = overrides.get("m", m), overrides.get("n", n)
    # Four waves where the tile has room for them: 2 x 2, else along the longer side.
    sg_m = 2 if m >= 2 * intr.m else 1
    sg_n = 2 if n >= 2 * intr.n else 1
    if sg_m * sg_n < 4 and m >= 4 * intr.m and sg_n == 1:
        sg_m = 4
    elif sg_m * sg_n < 4 and n >= 4 * intr.n and sg_m == 1:
        sg_n = 4
    sg_m, sg_n = overrides.get("subgroups_m", sg_m), overrides.get("subgroups_n", sg_n)
    # RDNA: at most RDNA_ACC_PER_LANE f32 accumulators a lane, halving M (unless M was given)
    while (
        target.family == "rdna"
        and "m" not in overrides
        and m > intr.m * sg_m
        and m * n // (sg_m * sg_n * target.subgroup_size) > RDNA_ACC_PER_LANE.get(problem.dtype, 64)
    ):
        m //= 2
    elem = DTYPES[problem.dtype]
    k = 64
    while k > intr.k and (m + n) * k * elem > target.lds_bytes // 2:
        k //= 2
    k = max(intr.k, overrides.get("k", k))
    stages = overrides.get("stages", 2)
    tile = Tile(m, n, k, sg_m, sg_n, stages, intr.name)
    _check_tile(tile, intr, target, elem)
    return tile


def _grid(problem: ConvBwdWeightProblem, m: int, n: int) -> int:
    """Workgroups of one split: groups x M tiles x N tiles x filter taps."""
    taps = math.prod(problem.filter_size)
    return problem.groups * math.ceil(problem.out_channels / m) * math.ceil(problem.in_channels / n) * taps


def _check_tile(tile: Tile, intr, target, elem: int) -> None:
    for name, size, sg, unit in (("m", tile.m, tile.subgroups_m, intr.m), ("n", tile.n, tile.subgroups_n, intr.n)):
        if size % (sg * unit):
            raise ValueError(f"tile-{name}: {size} is not a multiple of {sg} subgroups x {unit} ({intr.name})")
    if tile.k % intr.k:
        raise ValueError(f"tile-k: {tile.k} is not a multiple of the intrinsic's K {intr.k} ({intr.name})")
    lds = (tile.m + tile.n) * tile.k * elem
    if lds > target.lds_bytes:
        raise ValueError(
            f"tile: ({tile.m} + {tile.n}) x {tile.k} x {elem} B = {lds} B exceeds LDS {target.lds_bytes} B"
        )


def simt_threads_fit(problem: ConvBwdWeightProblem) -> bool:
    """Whether a SIMT thread can hold all in channels x taps of its dW row (see :class:`SimtTile`)."""
    return problem.in_channels * math.prod(problem.filter_size) <= MAX_THREAD_ACCUMULATORS


@dataclass(frozen=True)
class SimtTile:
    """The SIMT strategy's workgroup over a rows split: ``rows`` output rows x ``groups`` groups x
    ``channels`` out channels, one thread each; a thread owns all filter taps and in channels of its
    (image, row, group, out channel) and reduces the rest of the row serially."""

    rows: int
    groups: int
    channels: int

    @property
    def threads(self) -> int:
        return self.rows * self.groups * self.channels


def choose_simt_tile(problem: ConvBwdWeightProblem, target) -> SimtTile:
    """Threads along the channels (out channels innermost, then groups: the innermost dimensions of
    channels-last dy and x, so a subgroup's loads are contiguous), then output rows, up to four
    subgroups per workgroup. Every size divides its loop (no partial tiles, no padding).
    Measured (H200, MobileNetV2 G=144 3x3 56x56 N=32, bench/results/h200_2026-11-22_depthwise.md):
    48 groups x 2 rows, 16 x 8 and 48 x 2 with a 4-deep reduction step all within 3%.
    """
    budget = 4 * target.subgroup_size
    channels = max(_divisors(problem.out_channels, budget))
    # Whole subgroups first (G=144: 16 groups x 8 rows = 128 threads, not 72 x 1), then more threads,
    # then more groups (wider contiguous loads).
    candidates = [
        SimtTile(rows, groups, channels)
        for groups in _divisors(problem.groups, budget // channels)
        for rows in _divisors(problem.output_size[0], budget // (channels * groups))
    ]
    return max(candidates, key=lambda t: (t.threads % target.subgroup_size == 0, t.threads, t.groups))


def auto_k_batch(problem: ConvBwdWeightProblem, target) -> int:
    """How many splits of the reduction, by strategy (the rules and the H200 measurements behind them
    are in bench/results/h200_2026-11-21_tuning.md):

    * matrix-core convolutions (G=1): CK's occupancy rule (split_k_utils.hpp,
      get_best_occupancy_k_batch_value): k_batch = floor(CUs * occupancy / grid) with
      grid = ceil(M / TM) * ceil(C / TN) * taps workgroups, clamped to [1, 128] and so that each split
      keeps MIN_SPLIT_REDUCTION reduction elements;
    * thin groups and depthwise (the SIMT strategy): as many splits as the batch allows (up to 128):
      IREE gives each dW element of these one thread with a serial reduction, so parallelism comes from
      splits only (mobilenetv2 G=144 56x56 N=32: 1049 us at 8 splits, 506 us at 32);
    * GEMMs (1x1) too thin for matrix cores: at most :data:`MAX_THIN_GEMM_SPLITS`;
    * grouped convolutions with matrix cores (G>1): 1; they already have G * taps workgroups, and a
      split made them slower on the H200 (regnet G=8 C=64: 988 us split in 2, 751 us unsplit).

    On the host (no CU model) it is 1. The split itself is planned even (a divisor of N).
    """
    if not getattr(target, "compute_units", 0):
        return 1
    tile = choose_tile(problem, target)
    red = problem.gemm[3]
    if tile.intrinsic is None and math.prod(problem.filter_size) == 1:
        return min(problem.batch, MAX_THIN_GEMM_SPLITS)
    if tile.intrinsic is None:
        return min(problem.batch, 128)
    if problem.groups > 1:
        return 1
    grid = _grid(problem, tile.m, tile.n)  # G = 1 here
    k_batch = (target.compute_units * OCCUPANCY) // max(grid, 1)
    k_batch = min(k_batch, 128, red // MIN_SPLIT_REDUCTION)
    return max(1, k_batch)
