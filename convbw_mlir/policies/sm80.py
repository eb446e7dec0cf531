"""The policy of our sm_80 kernels (``convbw_mlir/kernels/gemm_sm80.py`` and its StreamK and
wave-specialized forms): the implicit-GEMM view of a problem, the kernel's tiling and its rule, its split
rule, which problems and plans it takes and why not (pure Python: the plan asks it, :func:`plan` and
:func:`refusals`, once).

The weight gradient in layout 4 (NGCHW/GKCYX/NGKHW) is, per group, an implicit GEMM
``dW[k, j] = sum_r A[k, r] * B[j, r]``: M = K out channels, N = C x taps (``j = c * Y * X + y * X + x``,
so ``[K, N]`` is dW's own memory order), reduction ``r = (n, ho, wo)`` over N x Ho x Wo. A is dy,
contiguous along r within an image. B is x at ``(ho * s + y * d - p, wo * s + x * d - p)``: for a 1x1
with stride 1 and no padding that is x itself, contiguous like A (a plain GEMM, copied by ``cp.async``);
otherwise each element's address is computed per tile, zero outside the image (no im2col buffer).

In layout 2 (NHWGC/GKYXC/NHWGK, channels-last) the same GEMM has ``j = (y * X + x) * C + c`` (dW's
GKYXC order) and both operands are reduction-outer: dy ``[N*Ho*Wo, G, K]`` and x ``[N, H, W, G, C]``
hold 8 consecutive channels in 16 bytes, so both go by 16-byte ``cp.async`` into shared memory stored
reduction-major (``[bk, bm]``, ``[bk, bn]``) and reach the registers by ``ldmatrix`` with ``.trans``.

Merged groups (thin groups, layout 2; ``plan.merge``, CK's group merging): ``m`` consecutive groups are ``m * C``
consecutive channels of x and ``m * K`` of dy, so the dense GEMM of the merged problem (:func:`merged`:
``G / m`` groups of ``m * C`` in and ``m * K`` out channels) holds every group's dW on its block diagonal
(``k // K == c // C``); the kernel is the dense one on that problem, its store keeps the diagonal blocks only
and writes them to dW's own ``[G, K, taps * C]``. It does ``m`` times the useful MMA work and fills the
tile (docs/decisions.md#thin-groups).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from convbw_mlir.plan_data import (
    STREAMK_FIXUPS,
    WAVESPEC_PRODUCERS,
    Decision,
    MergePlan,
    Overrides,
    Plan,
    PlanError,
    Strategy,
    StreamKPlan,
    Tile,
    WaveSpecPlan,
    _is_int,
)
from convbw_mlir.policies import switches
from convbw_mlir.policies.split import check, explicit_split, split_refusals
from convbw_mlir.targets import TARGETS, Target

__all__ = ["COST", "INTRINSIC", "INTRINSICS", "ROWS_FIT_K", "SHARED_MEMORY_CAP", "ConvGeometry", "CostModel",
           "CostRule", "FoldedWindow", "GemmShape", "GemmTiling", "auto_splits", "choose_folded_tiling",
           "folded_problems", "folded_window", "gemm_shape", "merge_rule", "merged", "plan", "refusals",
           "rows_fit_k_waived", "takes_by_default", "tiling", "unsupported"]  # fmt: skip

INTRINSIC = "NV_MMA_SYNC_F32_16x8x16_F16"  # the plan's name of mma.sync m16n8k16 f16 -> f32
# mma.sync m16n8k16 per input type (IREE's names, targets._SM80): bf16 has f16's fragment layouts.
INTRINSICS = {"f16": INTRINSIC, "bf16": "NV_MMA_SYNC_F32_16x8x16_BF16"}

# The sm_80 target's shared-memory limit (an A100's 163 KiB): IREE refuses a kernel above it
# (docs/iree-facts.md "sm_80: 166,912 bytes of shared memory": a 4-stage 128x256x64 (216 KiB) is refused).
SHARED_MEMORY_CAP = TARGETS["sm_80"].lds_bytes
WARP = 32
MMA_M, MMA_N, MMA_K = 16, 8, 16
COPY_ELEMENTS = 8  # f16 elements in one 16-byte cp.async
ROW_PAD = 8  # elements of padding per shared row: a row stride of 16 bytes past a multiple of 128


@dataclass(frozen=True)
class ConvGeometry:
    """Where B's elements live in x: sizes per spatial dimension (1, 2 or 3 of them: ``(W,)``, ``(H, W)``,
    ``(D, H, W)``), outermost first; the tap and output position run row-major over them."""

    in_size: tuple[int, ...]
    out_size: tuple[int, ...]
    filter: tuple[int, ...]
    stride: tuple[int, ...]
    dilation: tuple[int, ...]
    pad: tuple[int, ...]

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
    channels_last: bool = False  # layout 2: A [R, G, M], B [R, G, C] or [N, H, W, G, C]; reduction outer

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
        one image and keeps its alignment (8: ``cp.async.cg`` 16 bytes; 4, 2: ``cp.async.ca``; 1: a load).
        Channels-last: the largest of 8, 4, 2 that divides K (a copy stays in one output position)."""
        if self.channels_last:
            return _divisor_vector(self.m)
        return next(v for v in (8, 4, 2, 1) if self.hw % v == 0)

    def b_vector(self) -> int:
        """The same for B: x's rows are A's shape for a plain GEMM; a gathered B is loaded element-wise
        (channels-last: up to 8 channels of one tap, by ``cp.async`` with zero-fill in the padding)."""
        if self.channels_last:
            return _divisor_vector(self.channels)
        return self.a_vector() if self.conv is None else 1


def _divisor_vector(channels: int) -> int:
    """Elements of a channels-last copy: 8 (16 bytes, ``.cg``), 4 or 2 (``.ca``) channels, whichever divides."""
    return next((v for v in (8, 4, 2) if channels % v == 0), 1)


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

    def shared_bytes(self, element_bytes: int = 2, reduction_major: bool = False) -> int:
        """Bytes of the shared stages: rows of ``bk + 8`` (layout 4), or ``bk`` rows of ``bm + 8`` and
        ``bn + 8`` (``reduction_major``: layout 2, read by ``ldmatrix.trans``)."""
        if reduction_major:
            return self.stages * self.bk * (self.bm + self.bn + 2 * ROW_PAD) * element_bytes
        return self.stages * (self.bm + self.bn) * self.row * element_bytes

    def problems(self, shape: GemmShape, shared_cap: int = SHARED_MEMORY_CAP) -> list[str]:
        """Why this tiling cannot compute ``shape`` within ``shared_cap`` bytes of shared memory
        ("field: value ..." lines); empty if it can."""
        why = []
        if self.bm % self.wm or self.bn % self.wn or self.wm % MMA_M or self.wn % (2 * MMA_N) or self.bk % MMA_K:
            why.append(f"tiling: warp tile {self.wm}x{self.wn} does not divide {self.bm}x{self.bn} in mma tiles")
        # elements a thread moves at once: a copy's, or 8 loaded (layout 4's gather; odd channels, layout 2)
        a_vector, b_vector = shape.a_vector(), shape.b_vector()
        if shape.channels_last:
            a_vector, b_vector = (v if v > 1 else COPY_ELEMENTS for v in (a_vector, b_vector))
        else:
            b_vector = max(b_vector, COPY_ELEMENTS)
        for name, rows, v in (("bm", self.bm, a_vector), ("bn", self.bn, b_vector)):
            if (rows * self.bk // v) % self.threads:
                why.append(f"tiling: the {name}x{self.bk} tile is no whole number of {2 * v}-byte copies per thread")
            elif shape.channels_last and self.threads % (rows // v):  # a pass of all threads covers whole rows
                why.append(f"tiling: {self.threads} threads do not cover whole {rows}-element rows of the {name} tile")
        need = self.shared_bytes(reduction_major=shape.channels_last)
        if need > shared_cap:
            why.append(f"stages: {self.stages} need {need} B of shared memory, over {shared_cap}")
        if self.threads > 1024:
            why.append(f"tiling: {self.threads} threads a workgroup, over 1024")
        if self.stages < 2:
            why.append(f"stages: at least 2, got {self.stages}")
        return why


def gemm_shape(problem, splits: int = 1) -> GemmShape:  # problem: convbw_mlir.problem.ConvBwdWeightProblem
    """The implicit GEMM of a layout-4 or layout-2 problem (call :func:`unsupported` first)."""
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
                     splits, channels_last=is_channels_last(problem))  # fmt: skip


def is_channels_last(problem) -> bool:
    """Layout 2 (NHWGC/GKYXC/NHWGK): the explicit kernel's channels-last form."""
    fam = problem.layout_family
    return (fam.x, fam.w) == ("NHWGC", "GKYXC")


def auto_splits(shape: GemmShape, tiling: GemmTiling, compute_units: int, min_tiles: int = 8,
                shared_cap: int = SHARED_MEMORY_CAP) -> int:  # fmt: skip
    """Split-K partial sums so the grid fills the machine about once, each split at least ``min_tiles``
    k tiles long (CK's rule of thumb, split_k_utils.hpp: k_batch = max_occupancy * num_CUs / grid_size).
    With the register path (odd K or C) every resident workgroup's slot once: its loads are latency-bound
    within a workgroup and overlap only across workgroups (:func:`register_rounds`)."""
    ours = isinstance(tiling, GemmTiling) and register_rounds(shape, tiling)  # the sm_80 kernel's register path
    slots = compute_units * (resident_blocks(shape, tiling, shared_cap) if ours else 1)
    tiles = shape.groups * -(-shape.m // tiling.bm) * -(-shape.n // tiling.bn)
    ktiles = -(-shape.reduction // tiling.bk)
    if tiles >= slots:
        return 1
    return max(1, min(-(-slots // tiles), ktiles // min_tiles))


def register_rounds(shape: GemmShape, t: GemmTiling) -> int:
    """Rounds a thread makes per k tile on the register path (channels-last operands whose rows are not
    4-byte aligned: odd K for dy, odd C for x): each round is :data:`COPY_ELEMENTS` element loads and one
    shared store (``gemm_sm80._load_tile_cl``); 0 where both operands go by ``cp.async``."""
    if not shape.channels_last:
        return 0
    rows = [r for r, v in ((t.bm, shape.a_vector()), (t.bn, shape.b_vector())) if v == 1]
    return sum(t.bk // max(1, t.threads // (r // COPY_ELEMENTS)) for r in rows)


def resident_blocks(shape: GemmShape, t: GemmTiling, shared_cap: int = SHARED_MEMORY_CAP) -> int:
    """Workgroups an SM holds at once, by registers and shared memory (at least 1)."""
    shared = t.shared_bytes(reduction_major=shape.channels_last)
    return max(1, min(SM_REGISTERS // (t.threads * registers_per_thread(t)), shared_cap // shared))


SM_REGISTERS = TARGETS["sm_80"].registers_per_cu  # an SM's register file (the target table's)


@dataclass(frozen=True)
class CostModel:
    """The tiling rule's model of an SM (:func:`tiling_cost`), one record: the A100 whitepaper's rates the model
    assumes (per SM and clock: 1024 dense f16 FMA on the tensor cores, an m16n8k16 mma.sync in 2 clocks; 128 bytes
    of shared memory), the measured GEMM's occupancy (406 TFLOP/s at 8 warps an SM: docs/explicit-kernels.md), and
    the register path's round, fitted on the H100 (``fitted_on``: ResNet-50's conv1 took about 8,000 clocks a k
    tile in 128x256 tiles, 8 rounds a thread, about 4,000 in 64x64 ones, 4 rounds)."""

    fma_per_clock: int = 1024
    shared_bytes_per_clock: int = 128
    full_warps: int = 8  # resident warps an SM below which latency is no longer hidden (the measured GEMM's 8)
    device_bytes_per_clock: int = 1400  # ~2 TB/s of HBM at the 1.41 GHz SM clock: split-K partials' traffic
    launch_clocks: int = 4000  # ~3 us: the split-K sum's own dispatch
    fill_tiles: int = 2  # k tiles of pipeline fill and epilogue a workgroup pays on top of its own
    register_round_clocks: int = 1000  # one register-path round (8 element loads, their shared store), latency-bound
    fitted_on: str = "bench/results/h100_2026-11-25_depthwise_default/first_layers_main.md"


COST = CostModel()

# Candidates of the rule, largest first: (bm, bn, wm, wn); bk 64, 3 stages (fewer where the cap needs).
TILINGS = ((128, 256, 64, 64), (128, 128, 64, 64), (64, 128, 32, 64), (128, 64, 64, 32), (64, 64, 32, 32))


def registers_per_thread(t: GemmTiling) -> int:
    """Estimate: f32 accumulators, two k steps of fragments (current and prefetched), 40 for addresses
    (the 64x64 warp tile comes to 232; ptxas gave the measured kernel 254)."""
    acc = t.wm * t.wn // WARP
    frags = 2 * 4 * (t.wm // MMA_M + t.wn // (2 * MMA_N))
    return min(255, acc + frags + 40)


def tiling_cost(shape: GemmShape, t: GemmTiling, compute_units: int, shared_cap: int = SHARED_MEMORY_CAP) -> float:
    """Estimated SM clocks of ``shape`` with ``t`` (split as :func:`auto_splits` says; ``shape.splits`` ignored).

    Work units (tiles x splits) run in waves of ``compute_units x resident blocks``; a unit takes its k
    tiles plus :attr:`CostModel.fill_tiles`, each at the tensor rate slowed by shared-memory bandwidth (ldmatrix of
    every warp plus the copies in, per k tile) and by too few resident warps; split-K adds its partials'
    round trip through memory and a second dispatch. Padding (M or N not a multiple of the tile) is
    paid in full: that is what favours 64-row tiles for K <= 64. The register path (odd K or C) is
    latency-bound: a k tile takes at least :func:`register_rounds` x :attr:`CostModel.register_round_clocks` however
    few resident workgroups share the SM.
    """
    splits = auto_splits(shape, t, compute_units, shared_cap=shared_cap)
    tiles = shape.groups * -(-shape.m // t.bm) * -(-shape.n // t.bn)
    ktiles = -(-math.ceil(shape.reduction / t.bk) // splits)
    resident = resident_blocks(shape, t, shared_cap)
    mma = t.bm * t.bn * t.bk / COST.fma_per_clock
    smem = (t.warps * (t.wm + t.wn) * 2 * t.bk + (t.bm + t.bn) * t.bk * 2) / COST.shared_bytes_per_clock
    busy = min(1.0, mma / smem) * min(1.0, resident * t.warps / COST.full_warps)
    waves = -(-tiles * splits // (compute_units * resident))
    # a k tile of the SM's resident workgroups: their matrix work shares the SM; register-path latency overlaps
    per_ktile = max(resident * mma / busy, register_rounds(shape, t) * COST.register_round_clocks)
    clocks = waves * (ktiles + COST.fill_tiles) * per_ktile
    if splits > 1:
        clocks += 2 * splits * shape.groups * shape.m * shape.n * 4 / COST.device_bytes_per_clock + COST.launch_clocks
    return clocks


@dataclass(frozen=True)
class CostRule:
    """A named rule of a kernel's tiling or split choice beside its cost model (the plan's decision names the ones
    that decided)."""

    name: str
    reason: str


#: The tiling rule's condition issue 39 found missing (docs/decisions.md#sm90-cost-rules)
ROWS_FIT_K = CostRule(
    "rows-fit-k",
    "on Hopper a 64-row tile only where K fits it (K <= 64): on the H100 every 64-row tile of a K > 64 layer "
    "measured 1.06-1.93x the best 128-row one, which the model's A100 rates miss; not where a workgroup runs no more "
    "k tiles than the model's fill, nor where the 128-row grid needs a second workgroup on some SMs and the 64-row "
    "one does not (docs/decisions.md#sm90-cost-rules)",
)


def _grid(shape: GemmShape, t: GemmTiling, compute_units: int, shared_cap: int) -> tuple[int, int]:
    """Workgroups of ``t``'s split-K grid (:func:`auto_splits`) and the k tiles each one runs."""
    splits = auto_splits(shape, t, compute_units, shared_cap=shared_cap)
    tiles = shape.groups * -(-shape.m // t.bm) * -(-shape.n // t.bn)
    return tiles * splits, -(-math.ceil(shape.reduction / t.bk) // splits)


def rows_fit_k_waived(shape: GemmShape, model: GemmTiling, rows128: GemmTiling, compute_units: int,
                      shared_cap: int = SHARED_MEMORY_CAP) -> str:  # fmt: skip
    """Why :data:`ROWS_FIT_K` keeps the model's 64-row tile ``model`` over the best 128-row one ``rows128`` on a
    K > 64 layer (empty: it does not). The rule is about the k loop's rate on full SMs: a workgroup of no more k
    tiles than the fill (:attr:`CostModel.fill_tiles`) is its fill and epilogue; and the model counts a second
    resident workgroup on an SM as free, which on the H100 it is not where the 64-row grid has one an SM."""
    grid64, ktiles = _grid(shape, model, compute_units, shared_cap)
    if ktiles <= COST.fill_tiles:
        return f"{ktiles} k tile(s) a workgroup, within the fill ({COST.fill_tiles}): no k loop to rank"
    grid128, _ = _grid(shape, rows128, compute_units, shared_cap)
    if grid64 <= compute_units < grid128:
        return (f"the {rows128.bm}x{rows128.bn} grid's {grid128} workgroups put two on some of the "
                f"{compute_units} SMs, the {model.bm}x{model.bn} grid's {grid64} one an SM")  # fmt: skip
    return ""


def _pick(shape: GemmShape, costed: list[tuple[GemmTiling, float]], compute_units: int, shared_cap: int,
          rows_fit_k: bool) -> tuple[GemmTiling | None, str]:  # fmt: skip
    """The cheapest of ``costed`` (the first on a tie); with ``rows_fit_k`` (:data:`ROWS_FIT_K`) a 64-row one on
    K > 64 gives way to the cheapest 128-row one unless :func:`rows_fit_k_waived` says why not (returned beside)."""
    model = min(costed, key=lambda tc: tc[1], default=(None, 0.0))[0]
    if model is None or _rows_fit(shape, model.bm, rows_fit_k):
        return model, ""
    rows128 = min(((t, c) for t, c in costed if t.bm >= 128), key=lambda tc: tc[1], default=(None, 0.0))[0]
    if rows128 is None:
        return model, ""
    waived = rows_fit_k_waived(shape, model, rows128, compute_units, shared_cap)
    return (model, waived) if waived else (rows128, "")


def _costed(shape: GemmShape, compute_units: int, shared_cap: int, folded: bool) -> list[tuple[GemmTiling, float]]:
    """Each of :data:`TILINGS` that can run ``shape`` (3 stages, else 2 where the shared-memory cap needs; ``folded``:
    whose stages hold x's windows too) with its :func:`tiling_cost`."""
    costed = []
    for bm, bn, wm, wn in TILINGS:
        for stages in (3, 2):
            t = GemmTiling(bm, bn, 64, stages, wm, wn)
            if not t.problems(shape, shared_cap) and not (folded and folded_problems(shape, t, shared_cap)):
                costed.append((t, tiling_cost(shape, t, compute_units, shared_cap)))
                break
    return costed


def _rows_fit(shape: GemmShape, bm: int, rule: bool) -> bool:
    return not rule or bm >= 128 or shape.m <= bm


def choose_tiling(shape: GemmShape, compute_units: int, shared_cap: int = SHARED_MEMORY_CAP,
                  rows_fit_k: bool = False) -> GemmTiling:  # fmt: skip
    """The plan's tiling: the cheapest of :data:`TILINGS` by :func:`tiling_cost` among those that can run
    ``shape`` (3 stages, else 2 where the shared-memory cap needs), 64-row ones on K > 64 only where
    :data:`ROWS_FIT_K` is waived (``rows_fit_k``, :func:`_pick`); the first (128x256) on a tie."""
    return (
        _pick(shape, _costed(shape, compute_units, shared_cap, False), compute_units, shared_cap, rows_fit_k)[0]
        or GemmTiling()
    )


def unsupported(problem, tiling: GemmTiling, shared_cap: int = SHARED_MEMORY_CAP, dtypes: tuple[str, ...] | None = None,
                any_channels: bool = False, any_rank: bool = True, epilogues: bool = False) -> list[str]:  # fmt: skip
    """Why the explicit kernel cannot compute ``problem`` with ``tiling`` ("field: value ..." lines).

    ``dtypes``: the input types the kernel takes (default: the sm_80 kernel's, :data:`INTRINSICS`; dW: f32 or
    the input type); ``any_channels``: dW of any of ``dtypes`` (the AMD kernel's stores); any channel count is
    taken (sm_80, layout 2: odd K or C by its register path); ``any_rank``: 1-D and 3-D problems with a filter,
    stride or padding too (the sm_80 kernel's per-dimension gather; not the AMD one's); ``epilogues``: scale,
    bilinear and accumulate applied in the kernel's store (the sm_80 kernel's; split-K: in its sum)."""
    why = []
    fam = problem.layout_family
    if (fam.x, fam.w) not in (("NGCHW", "GKCYX"), ("NHWGC", "GKYXC")):
        why.append(f"layout: {problem.layout} (the explicit kernel takes layouts 4, NGCHW/GKCYX/NGKHW, and 2, "
                   "NHWGC/GKYXC/NHWGK)")  # fmt: skip
    if not any_rank:  # the AMD forms gather x of 2-D problems only
        plain = all(f == 1 for f in problem.filter_size) and all(s == 1 for s in problem.stride)
        if not (plain and not any(problem.pad_low) and not any(problem.pad_high)) and problem.rank != 2:
            why.append(f"input_size: {problem.input_size} (the AMD explicit kernel gathers x of 2-D problems only)")
    dtypes = tuple(INTRINSICS) if dtypes is None else dtypes
    if problem.dtype not in dtypes:
        why.append(f"dtype: {problem.dtype} ({' or '.join(dtypes)})")
    elif problem.dw_dtype not in ("f32", problem.dtype) and not (any_channels and problem.dw_dtype in dtypes):
        why.append(f"dw_dtype: {problem.dw_dtype} (f32 or {problem.dtype}, the input type)")
    if problem.epilogue is not None and not epilogues:
        why.append(f"epilogue: {problem.epilogue.kind} (this kernel writes dW plain)")
    if not why and isinstance(tiling, GemmTiling):  # a CdnaTiling is checked by the plan, with the split
        why += tiling.problems(gemm_shape(problem), shared_cap)
    return why


# -- the folded layout-4 form (kernels/gemm_sm80.py build_folded_kernel_body) --------------------------------
@dataclass(frozen=True)
class FoldedWindow:
    """Where the folded form finds B in shared memory (docs/decisions.md#layout4): with stride 1 and every inner
    dimension's output as wide as its input, B[(c, tap), r] is x's flattened plane at ``pos + shifts[tap]``
    (``pos``: r's output position in its image). A k tile (``bk`` positions of one image: the reduction is
    tiled per image) reads, per channel of the N tile (at most ``channels``), one window of ``length``
    elements from ``pos0 + min_shift`` aligned down to ``vector`` (x's copies: 16, 8 or 4 bytes)."""

    vector: int
    shifts: tuple[int, ...]
    channels: int
    length: int

    @property
    def min_shift(self) -> int:
        return min(self.shifts)


def folded_window(shape: GemmShape, t: GemmTiling) -> FoldedWindow:
    """The folded form's window for ``shape`` (gathered layout 4; :func:`folded_problems` first) and ``t``."""
    conv = shape.conv
    hw_in = math.prod(conv.in_size)
    vector = next((v for v in (8, 4, 2) if hw_in % v == 0), 1)
    strides = [math.prod(conv.in_size[d + 1 :]) for d in range(len(conv.in_size))]
    shifts = []
    for tap in range(conv.taps):
        coords, rest = [], tap
        for f in reversed(conv.filter):
            coords.append(rest % f)
            rest //= f
        coords.reverse()
        shifts.append(sum((f * dl - p) * s for f, dl, p, s in zip(coords, conv.dilation, conv.pad, strides)))
    span = max(shifts) - min(shifts)
    length = -(-(vector + t.bk + span) // vector) * vector
    return FoldedWindow(vector, tuple(shifts), t.bn // conv.taps + 2, length)


def folded_problems(shape: GemmShape, t: GemmTiling, shared_cap: int = SHARED_MEMORY_CAP) -> list[str]:
    """Why the folded form cannot run ``shape`` with ``t`` ("field: value" lines; empty: it can)."""
    conv = shape.conv
    if shape.channels_last or conv is None:
        return ["layout4: fold is layout 4's form of a gathered x (layout 4 with a filter, stride or padding)"]
    why = []
    if any(s != 1 for s in conv.stride):
        why.append(f"stride: {conv.stride} (the folded form shifts x by a tap: stride 1 only)")
    if conv.in_size[1:] != conv.out_size[1:]:
        why.append(f"input_size: {conv.in_size} (the folded form needs the output as wide as x in every inner "
                   f"dimension, got output {conv.out_size})")  # fmt: skip
    if shape.hw % 2:
        why.append(f"output_size: {conv.out_size} (an odd plane: dy's rows go by cp.async of 2 or more elements)")
    if math.prod(conv.in_size) % 2:
        why.append(f"input_size: {conv.in_size} (an odd plane: x's windows go by cp.async of 2 or more elements)")
    if why:
        return why
    w = folded_window(shape, t)
    need = t.shared_bytes() + t.stages * w.channels * w.length * 2
    if need > shared_cap:
        why.append(f"stages: {t.stages} with x's windows need {need} B of shared memory, over {shared_cap}")
    return why


def choose_folded_tiling(shape: GemmShape, compute_units: int, shared_cap: int = SHARED_MEMORY_CAP,
                         rows_fit_k: bool = False) -> GemmTiling:  # fmt: skip
    """:func:`choose_tiling` among the tilings whose stages hold x's windows too (:func:`folded_problems`)."""
    costed = _costed(shape, compute_units, shared_cap, True)
    return _pick(shape, costed, compute_units, shared_cap, rows_fit_k)[0] or GemmTiling(128, 128, 64, 2, 64, 64)


# -- wave specialization (kernels/wavespec_sm80.py): which tilings take producer warps -----------------------
PRODUCERS = WAVESPEC_PRODUCERS  # producer warps a workgroup: CK's wavelet ratios 4:2 and 4:4 with 4 consumer warps
MAX_BARRIER_ID = 15  # named barriers 0 .. 15; 0 is the whole workgroup's (bar.sync 0, gpu.barrier)


def wavespec_threads(t: GemmTiling, producers: int) -> int:
    """The workgroup's threads: the tiling's (consumer) warps and the producer warps."""
    return (t.warps + producers) * WARP


def copiers(t: GemmTiling, producers: int) -> GemmTiling:
    """The tiling as ``_copy_tile_cl`` sees it: only ``producers`` warps share the copies (it reads
    ``threads`` and ``bk``; the warp tile is set so that ``warps == producers``)."""
    return replace(t, wm=t.bm, wn=t.bn // producers)


def wavespec_problems(shape: GemmShape, t: GemmTiling, producers: int) -> list[str]:
    """Why the wave-specialized kernel cannot run ``shape`` with ``t`` and ``producers`` ("field: value")."""
    why = []
    if producers not in PRODUCERS:
        return [f"producers: {producers!r} (2 or 4 producer warps)"]
    if not shape.channels_last:
        why.append("layout: wave specialization is written for layout 2 (NHWGC/GKYXC/NHWGK)")
    regs = registers_per_thread(t)
    need = wavespec_threads(t, producers) * regs
    if need > SM_REGISTERS:  # sm_80 cannot give producers fewer registers than consumers
        why.append(f"producers: {producers} with the {t.bm}x{t.bn} tiling's {t.warps} warps: "
                   f"{t.warps + producers} warps x 32 x ~{regs} registers = {need} > {SM_REGISTERS} (sm_80 has "
                   "no setmaxnreg: producers get the consumers' registers; take a 4-warp tiling, e.g. "
                   "tile-n=128)")  # fmt: skip
    if wavespec_threads(t, producers) > 1024:
        why.append(f"producers: {producers}: {wavespec_threads(t, producers)} threads a workgroup, over 1024")
    if 1 + 2 * t.stages > MAX_BARRIER_ID + 1:
        why.append(f"stages: {t.stages} need {2 * t.stages} named barriers, over {MAX_BARRIER_ID}")
    if t.bn % producers or t.bm % MMA_M:
        why.append(f"producers: {producers} do not split the {t.bm}x{t.bn} tile")
    elif not why:
        for line in copiers(t, producers).problems(shape):
            if "copies" in line or "cover" in line:
                why.append(f"producers: {producers} warps: {line.removeprefix('tiling: ')}")
    return why


# -- what the plan asks -------------------------------------------------------------------------------------
# The classes the kernel was measured fastest on (docs/decisions.md#explicit-by-default): the input type, and
# the rank of a gathered x (a plain 1x1 is one GEMM at any rank); bf16, 1-D and 3-D measured 2026-11-25.
MEASURED_DTYPES = ("f16", "bf16")
MEASURED_RANKS = (1, 2, 3)


def takes_by_default(problem: Any) -> bool:
    """Whether the plan may choose this kernel by itself: channels-last (layout 2) and a problem the kernel
    computes as it is, of a class (:data:`MEASURED_DTYPES`, :data:`MEASURED_RANKS`) where it was the fastest
    correct kernel when measured (docs/decisions.md#explicit-by-default)."""
    gathered = gemm_shape(problem).conv is not None
    measured = problem.dtype in MEASURED_DTYPES and (problem.rank in MEASURED_RANKS or not gathered)
    return measured and is_channels_last(problem) and not unsupported(problem, None, epilogues=True)


def tiling(plan: Plan) -> GemmTiling:
    """The kernel tiling a plan's tile stands for."""
    t = plan.tile
    return GemmTiling(t.m, t.n, t.k, t.stages, t.m // t.subgroups_m, t.n // t.subgroups_n)


def plan(problem: Any, tgt: Target, opts: Overrides) -> Plan:
    """The explicit plan: the tiling rule (``choose_tiling``, or the tile options), wave specialization or
    StreamK where asked, else split-K by the occupancy rule (``auto_splits``) or as asked.

    Raises:
        PlanError: the kernel cannot carry the plan out (every reason, "field: value").
    """
    groups = _merge_groups(problem, tgt, opts)
    dense = merged(problem, groups)  # the GEMM the kernel computes (the problem itself: one group a GEMM)
    given = opts.tile
    t = GemmTiling()
    folded = opts.layout4 == "fold"
    decided = ""  # the named rule that decided the tiling, where one did
    if not given and not unsupported(
        dense, None, epilogues=True
    ):  # the plan's rule: the kernel's cost model (choose_tiling)
        hopper = bool(tgt.wgmma_n)  # measured there only: Ampere and Ada keep the model's choice
        shape = gemm_shape(dense)
        costed = _costed(shape, tgt.compute_units, tgt.lds_bytes, folded)
        chosen_t, waived = _pick(shape, costed, tgt.compute_units, tgt.lds_bytes, hopper)
        t = chosen_t or (GemmTiling(128, 128, 64, 2, 64, 64) if folded else GemmTiling())
        if waived:
            decided = f"a {t.bm}x{t.bn} tile, {ROWS_FIT_K.name} waived: {waived}"
        elif hopper and chosen_t != _pick(shape, costed, tgt.compute_units, tgt.lds_bytes, False)[0]:
            decided = f"a {t.bm}x{t.bn} tile by {ROWS_FIT_K.name}: {ROWS_FIT_K.reason}"
    if "subgroups_m" in given:
        t = replace(t, wm=given.get("m", t.bm) // given["subgroups_m"])
    if "subgroups_n" in given:
        t = replace(t, wn=given.get("n", t.bn) // given["subgroups_n"])
    t = replace(t, bm=given.get("m", t.bm), bn=given.get("n", t.bn), bk=given.get("k", t.bk),
                stages=given.get("stages", t.stages))  # fmt: skip
    for dim, block, warp in (("m", t.bm, t.wm), ("n", t.bn, t.wn)):  # at least one warp tile a block
        if block < warp:
            raise PlanError(f"tile-{dim}: {block} (narrower than the {warp}-wide warp tile: give subgroups-{dim} "
                            "too)")  # fmt: skip
    tile = Tile(t.bm, t.bn, t.bk, t.bm // t.wm, t.bn // t.wn, t.stages, INTRINSICS.get(problem.dtype, INTRINSIC))
    chosen = Plan(
        tgt.name,
        Strategy.EXPLICIT,
        gemm=True,
        tile=tile,
        folded=folded,
        merge=MergePlan(groups) if groups > 1 else None,
    )
    if opts.producers is not None:  # wave specialization: the same tiling and split, producer warps added
        chosen = replace(chosen, wavespec=WaveSpecPlan(opts.producers))
    check(problem, chosen, refusals)  # the tiling first: the split is sized on it
    shape = gemm_shape(dense)
    if opts.streamk is not None:  # StreamK replaces split-K: the persistent grid's workgroups share the k tiles
        if _is_int(opts.k_batch) and opts.k_batch > 1:
            raise PlanError(f"k-batch: {opts.k_batch}: StreamK replaces split-K (give one or the other)")
        workgroups = tgt.compute_units if opts.streamk == "auto" else opts.streamk
        chosen = replace(chosen, streamk=StreamKPlan(workgroups, opts.streamk_fixup or "linear"))
        check(problem, chosen, refusals)
        return chosen
    chosen = explicit_split(problem, chosen, shape, t, tgt, opts, auto_splits, refusals)
    return replace(chosen, decision=Decision("", "", decided)) if decided else chosen


def refusals(problem: Any, plan: Plan) -> list[str]:
    """Why this kernel cannot carry ``plan`` out ("field: value" lines; empty: it can)."""
    cap = plan.target_info.lds_bytes
    if plan.merge is not None:  # the kernel computes the merged problem's dense GEMM
        why = merge_refusals(problem, plan)
        if why:
            return why + split_refusals(problem, plan)
        problem = merged(problem, plan.merge.groups)
    why = ["tile: none"] if plan.tile is None else unsupported(problem, tiling(plan), cap, epilogues=True)
    if plan.folded and not why:
        why += folded_problems(gemm_shape(problem), tiling(plan), cap)
        if plan.streamk is not None or plan.wavespec is not None:
            why.append("layout4: fold with StreamK or wave specialization (written for the split-K grid)")
    if plan.streamk is not None:
        why += _streamk_refusals(plan, problem)
    if plan.wavespec is not None:
        why += _wavespec_refusals(plan, problem, tiling_ok=not why)
    return why + split_refusals(problem, plan)


def _streamk_refusals(plan: Plan, problem: Any) -> list[str]:
    """Why a plan's StreamK cannot be carried out ("field: value" lines)."""
    why, sk = [], plan.streamk
    if is_channels_last(problem):  # its copies are layout 4's (the sm_80 kernel's layout 2 came after it)
        why.append(f"layout: {problem.layout} (StreamK is written for layout 4, NGCHW/GKCYX/NGKHW)")
    if not _is_int(sk.workgroups) or sk.workgroups < 1:
        why.append(f"streamk: {sk.workgroups!r} workgroups (a positive number)")
    if sk.fixup not in STREAMK_FIXUPS:
        why.append(f"streamk-fixup: {sk.fixup!r} (linear or tree)")
    if plan.target_info.family != "nvidia":
        why.append(f"streamk: {sk.workgroups} on target {plan.target} (StreamK is written for sm_80 only)")
    if plan.split is not None:
        why.append(f"split: {plan.split.dim} x {plan.split.k_batch} (StreamK replaces split-K)")
    if problem.epilogue is not None:
        why.append(f"epilogue: {problem.epilogue.kind} (StreamK writes dW plain)")
    return why


def _wavespec_refusals(plan: Plan, problem: Any, tiling_ok: bool) -> list[str]:
    """Why a plan's wave specialization cannot be carried out ("field: value" lines); the kernel's own
    rule (registers, copies, barriers) only where the plain kernel takes the tiling (``tiling_ok``)."""
    producers = plan.wavespec.producers
    if plan.target_info.family != "nvidia":
        return [f"producers: {producers} on target {plan.target} (wave specialization is written for sm_80 only)"]
    if plan.streamk is not None:
        return [f"producers: {producers} with streamk (wave specialization is written for the split-K grid)"]
    if not is_channels_last(problem):
        return [f"producers: {producers} in layout {problem.layout} (wave specialization is written for layout 2, "
                "NHWGC/GKYXC/NHWGK)"]  # fmt: skip
    if problem.epilogue is not None:
        return [f"producers: {producers} with a {problem.epilogue.kind} epilogue (wave specialization writes dW plain)"]
    if problem.in_channels % 2 or problem.out_channels % 2:
        return [f"producers: {producers} with odd channels ({problem.in_channels} in, {problem.out_channels} out a "
                "group: wave specialization's producers copy by cp.async only)"]  # fmt: skip
    if not tiling_ok:
        return []
    return wavespec_problems(gemm_shape(problem, plan.k_batch), tiling(plan), producers)


# -- merged groups (thin groups: several groups in one implicit GEMM, a block-diagonal store) -----------------
# Thin groups: the rule (merge_rule) and its switch, policies/switches.py: MERGE_BY_DEFAULT.
MERGE_MAX_CHANNELS = 16  # thin groups: at most this many in and out channels a group (ResNeXt, RegNet: 4-16)
MERGE_ROWS = 64  # out channels (M) the rule fills: the smallest tiling's bm (TILINGS)


def merged(problem: Any, groups: int) -> Any:
    """The dense problem a merge of ``groups`` consecutive groups computes: ``G / groups`` groups of ``groups * C``
    in and ``groups * K`` out channels (the same x and dy memory in layout 2); ``problem`` itself for 1."""
    if groups == 1:
        return problem
    return problem.with_(groups=problem.groups // groups, in_channels=groups * problem.in_channels,
                         out_channels=groups * problem.out_channels)  # fmt: skip


def merge_refusals(problem: Any, plan: Plan) -> list[str]:
    """Why ``plan``'s group merging cannot be carried out ("field: value" lines; the dense kernel's own
    refusals of the merged problem come after, in :func:`refusals`)."""
    groups = plan.merge.groups
    if groups < 2:
        return [f"merge: {groups} group (at least 2; leave merge out for one group a GEMM)"]
    why = []
    if plan.target_info.family != "nvidia":
        why.append(f"merge: {groups} groups on target {plan.target} (group merging is written for sm_80 only)")
    if not is_channels_last(problem):  # layout 4's groups are not adjacent channels of one row
        why.append(f"merge: {groups} groups in layout {problem.layout} (group merging is written for layout 2, "
                   "NHWGC/GKYXC/NHWGK)")  # fmt: skip
    if problem.groups % groups:
        why.append(f"merge: {groups} groups do not divide the problem's {problem.groups}")
    if plan.streamk is not None:
        why.append(f"merge: {groups} groups with streamk (group merging is written for the split-K grid)")
    if plan.wavespec is not None:
        why.append(f"merge: {groups} groups with producers (group merging is written for the plain kernel)")
    return why


def merge_rule(problem: Any, tgt: Target) -> int:
    """Groups the rule merges (1: none): thin groups (2 to :data:`MERGE_MAX_CHANNELS` channels a group, even C)
    in layout 2, the most groups whose out channels fit :data:`MERGE_ROWS` (and divide G), where the cost model
    (:func:`tiling_cost`, each with its own tiling) prices the merged GEMM below one group a GEMM. The plan takes
    it with strategy=explicit, and without options where the switch
    :data:`~convbw_mlir.policies.switches.MERGE_BY_DEFAULT` is on."""
    c, k = problem.in_channels, problem.out_channels
    thin = 2 <= min(c, k) and max(c, k) <= MERGE_MAX_CHANNELS and c % 2 == 0
    if not (thin and is_channels_last(problem) and tgt.family == "nvidia"):
        return 1
    if problem.dtype not in MEASURED_DTYPES or unsupported(problem, None, epilogues=True):
        return 1
    groups = max((m for m in range(2, problem.groups + 1) if problem.groups % m == 0 and m * k <= MERGE_ROWS),
                 default=1)  # fmt: skip
    if groups == 1:
        return 1
    return groups if merged_cost(problem, groups, tgt) < merged_cost(problem, 1, tgt) else 1


def merged_cost(problem: Any, groups: int, tgt: Target) -> float:
    """:func:`tiling_cost` of ``problem`` merged ``groups`` at a time, with the tiling the rule gives it."""
    shape = gemm_shape(merged(problem, groups))
    t = choose_tiling(shape, tgt.compute_units, tgt.lds_bytes, rows_fit_k=bool(tgt.wgmma_n))  # as the plan tiles it
    return tiling_cost(shape, t, tgt.compute_units, tgt.lds_bytes)


def _merge_groups(problem: Any, tgt: Target, opts: Any) -> int:
    """The merge of :func:`plan`: as asked (``merge_groups``), else the rule's where strategy=explicit is asked
    or the switch is on, and no StreamK or wave specialization is asked (they are written for one group a GEMM)."""
    if opts.merge_groups is not None:
        asked = Plan(tgt.name, Strategy.EXPLICIT, merge=MergePlan(opts.merge_groups),
                     streamk=None if opts.streamk is None else StreamKPlan(opts.streamk),
                     wavespec=None if opts.producers is None else WaveSpecPlan(opts.producers))  # fmt: skip
        why = merge_refusals(problem, asked) if opts.merge_groups > 1 else []
        if why:
            raise PlanError("strategy explicit: " + "; ".join(why))
        return opts.merge_groups
    if opts.streamk is not None or opts.producers is not None:
        return 1
    return merge_rule(problem, tgt) if opts.strategy == Strategy.EXPLICIT.value or switches.MERGE_BY_DEFAULT else 1
