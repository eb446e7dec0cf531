"""The policy of the sm_90a weight-gradient kernel (``convbw_mlir/kernels/conv_sm90.py``): which problems it
takes and why not, its tiling and its split rule, and the tensor maps its launcher encodes (pure Python, no MLIR).

The plan asks it for the sm_90a target (:func:`convbw_mlir.policies.for_target`): a problem it takes gets its
plan (strategy explicit, a wgmma tile ``NV_WGMMA_F32_64x<bn>x16_<type>``, split-K ``r``); any other problem, or
options this kernel has no knob for, get the sm_80 kernels' plan (:mod:`convbw_mlir.policies.sm80`), compiled
for sm_90a. :func:`tensor_maps` is the record the build puts in the launch schedule: what the direct launch
encodes with ``cuTensorMapEncodeTiled`` / ``cuTensorMapEncodeIm2col`` (docs/explicit-kernels.md "Hopper").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from convbw_mlir.cuda_launch import im2col_corners
from convbw_mlir.loops import Split
from convbw_mlir.plan_data import (
    WGMMA_STAGES_MIN,
    Decision,
    MergePlan,
    Overrides,
    Plan,
    PlanError,
    Strategy,
    StreamKPlan,
    Tile,
    _is_int,
)
from convbw_mlir.policies import sm80, switches
from convbw_mlir.policies.sm80 import CostRule
from convbw_mlir.policies.split import EXPLICIT_SPLIT, check, split_refusals
from convbw_mlir.targets import TARGETS, Target

__all__ = ["BK", "BM", "BN", "COST", "COST_RULES", "MAPS_BYTES", "MEMORY_FLOOR", "MIN_SLICE", "PADDED_CHANNELS",
           "PADDED_MAX_WASTE", "PADDED_MIN_SLICE", "SMS", "STAGES", "STREAMK_SEGMENTS", "WGMMA", "CostModel",
           "CostRule", "auto_splits", "choose", "cost", "cost_streamk", "deciding_rules", "floor_us", "flops",
           "is_sm90", "max_stages", "merge_for", "merge_misaligned", "merge_refusals", "merge_rule",
           "padded_channels", "pads_by_default", "plan", "refusals", "ring_bytes", "streamk_workspace", "takes",
           "takes_by_default", "takes_padded", "tensor_maps", "unsupported"]  # fmt: skip

BM, BN, BK = 128, 256, 64  # the GEMM's recipe tile (2 consumer warpgroups of m64n256k16; 64 channels a box)
SMS = TARGETS["sm_90a"].compute_units  # the rule's default grid (H100 SXM); one workgroup an SM (4 stages of 48 KiB)


@dataclass(frozen=True)
class CostModel:
    """The rule's model (:func:`cost`, :func:`cost_streamk`), one record, fitted (least squares on log time) to 33
    timings of the rule's choices and of other splits and tile widths on an H100 (``fitted_on[0]``, runs 1 and 2;
    within ~10% but for the narrowest tiles; docs/timing.md#remeasured for those runs): a 128x256x64 k tile takes
    ``ktile_us`` an SM, a narrower tile ``tile_cost`` of that; a split's f32 partials go out and back in at
    ``bytes_per_us``, the sum's dispatch hidden; a workgroup pays ``fill_tiles`` k tiles of fill, barrier set-up and
    epilogue. The narrow tiles' costs (one consumer warpgroup where K <= 64, 64 columns where Y X C <= 64) were
    fitted on the H200 (``fitted_on[1]``, run 2; docs/explicit-kernels.md "Measured: StreamK and the rule"); a
    256-wide split tile's fill and StreamK's fill at every tile segment on ``fitted_on[2]`` (the H100's short
    reductions: docs/decisions.md#sm90-cost-rules)."""

    ktile_us: float = 0.67
    tile_cost: dict[int, float] = field(default_factory=lambda: {256: 1.0, 192: 0.87, 128: 0.6})  # by bn, of 256's
    narrow_cost: dict[int, float] = field(default_factory=lambda: {64: 0.35})
    one_consumer: float = 0.6
    bytes_per_us: float = 3.0e6
    sum_us: float = 0.0
    fill_tiles: int = 8
    # a split's 256-wide tile: its fill and epilogue measured 2-5 us a wave over the 8 k tiles on short
    # reductions (fitted_on[2]: split-1 runs of 3x3s with 8-36 k tiles a tile); StreamK's segments fit with 8
    fill_tiles_wide: int = 10
    # StreamK is offered only where the tiles are at least this many a workgroup (with fewer, a tile's finisher
    # adds many partials in turn, which the model leaves out: up to 4.9x slower)
    streamk_min_tiles: float = 0.5
    fitted_on: tuple[str, ...] = (
        "bench/results/h100_2026-11-26_hopper_conv",
        "bench/results/h200_2026-11-26_hopper_perf",
        "bench/results/h100_2026-12-06_heur",
    )


COST = CostModel()


#: The model's terms that issue 39 found missing (docs/decisions.md#sm90-cost-rules), by name
STREAMK_SEGMENTS = CostRule(
    "streamk-tile-segments",
    "StreamK pays its fill, epilogue and fixup at every tile its share of k tiles touches, not once a workgroup: "
    "on short reductions that costs more than the wave it evens (docs/decisions.md#sm90-cost-rules)",
)
MEMORY_FLOOR = CostRule(
    "memory-floor",
    "no plan is estimated faster than reading x and dy and writing dW once at the target's bandwidth; at the floor "
    "the least compute-side estimate wins, not fewer splits (docs/decisions.md#sm90-cost-rules)",
)
# the padded kernel's split (PADDED_CHANNELS): 4 slices of 6-7 k tiles beat 3 of 8-9 on the three 25-k-tile tune rows
PADDED_MIN_SLICE = 6
# padded columns a real one at most (Cp / C): the most measured, C 200 -> 256; wider waste (C 32 -> 64) unmeasured
PADDED_MAX_WASTE = 1.28
PADDED_CHANNELS = CostRule(
    "padded-channels",
    f"a dense layer with C % 8 == 0, C % 64 != 0 and at most {PADDED_MAX_WASTE} padded columns a real one takes the "
    f"wgmma kernel with each tap's channels padded to whole 64-channel boxes, split with slices of at least "
    f"{PADDED_MIN_SLICE} k tiles: on the "
    "H100 (pack wgmmapad, bench/padrule.py) 1.15-1.99x the sm_80 kernel on the tuned models' 5 layers, 0.98-2.12x "
    "on 7 held ones (docs/decisions.md#short-reduction-dense item 4)",
)
COST_RULES = (STREAMK_SEGMENTS, MEMORY_FLOOR)
# The tile widths the rule weighs (and the kernel takes): the model's (wide, then the narrow ones where the
# 128 x 128+ tile would compute past the problem: splits up to one wave there)
TILE_COST = COST.tile_cost
NARROW_COST = COST.narrow_cost
MAX_SPLITS = 32
MIN_SLICE = 8  # k tiles a split's slice at least (CK's k_batch rule of thumb)
STAGES, CONSUMERS = 4, 2  # Sm90Tiling's defaults: the kernel the rule was fitted on
STAGE_BARRIER_BYTES = 16  # a ring stage's full and empty mbarriers (gemm_sm90.Sm90Tiling.shared_bytes)
SWIZZLE_ALIGN = 1024  # the dynamic shared memory's base rounded up to the swizzle atom (gemm_sm90.ATOM_BYTES)
WGMMA = "NV_WGMMA_F32_64x{n}x16_{t}"  # the plan's name of the kernel's instruction (the tile marks the kernel)
MAPS_BYTES = 256  # the maps binding: dy's CUtensorMap, then x's (128 bytes each)
# by convolution rank: the bits of an im2col map's corners (signed) and offsets (unsigned): 3-D maps 16, 4-D 8,
# 5-D 5 (PTX ISA "Im2col mode"; cuTensorMapEncodeIm2col's corner ranges); a tap's offset, (F - 1) d <= p - upper,
# fits its bits wherever both corners fit theirs
IM2COL_BITS = {1: 16, 2: 8, 3: 5}
MAX_TRAVERSAL_STRIDE = 8  # cuTensorMapEncodeIm2col's elementStrides: at most 8
# A plain GEMM (1x1, stride 1, unpadded, one group) this short and small is IREE's to compute: our kernels' start-up
# outweighs it; the limits are the measured ones (docs/decisions.md#short-reduction-codegen).
SHORT_REDUCTION = 128  # images x positions: the longest measured
SHORT_GEMM = 1 << 17  # out x in channels
SHORT_WORK = 1 << 22  # images x positions x weights: codegen's time grows with it, our kernel's start-up does not
SHORT_MIN_CHANNELS = 20  # narrower: unmeasured, and 8 and below the GEMV kernel's


def short_reduction(problem: Any) -> bool:
    """Whether ``problem`` is a plain GEMM of at most :data:`SHORT_REDUCTION` images x positions, at most
    :data:`SHORT_GEMM` weights, at most :data:`SHORT_WORK` of the two multiplied and at least
    :data:`SHORT_MIN_CHANNELS` in and out channels (an SE block's 1x1 on a 1x1 map at batch 32 to 128)."""
    plain = (
        all(f == 1 for f in problem.filter_size)
        and all(s == 1 for s in problem.stride)
        and not any((*problem.pad_low, *problem.pad_high))
    )
    weights = problem.out_channels * problem.in_channels
    narrow = min(problem.in_channels, problem.out_channels) < SHORT_MIN_CHANNELS
    return (
        plain
        and not narrow
        and problem.groups == 1
        and _reduction(problem) <= SHORT_REDUCTION
        and weights <= SHORT_GEMM
        and _reduction(problem) * weights <= SHORT_WORK
    )


def refusals(problem: Any, plan: Plan | None = None) -> list[str]:
    """Why the sm_90a kernel cannot compute ``problem`` ("field: value (why)" lines; empty: it can); with a
    ``plan`` for sm_90a, why it cannot carry that plan out (the sm_80 kernels' refusals for a plan of theirs).
    """
    if plan is not None and not is_sm90(plan):
        return sm80.refusals(problem, plan)
    if plan is not None and plan.merge is not None:  # the boxed form (thin and medium groups)
        why = merge_refusals(problem, plan.merge.groups)
        if plan.streamk is not None:
            why.append(f"wgmma-merge: {plan.merge.groups} with streamk (the boxed form runs the split-K grid)")
        return why + (_plan_refusals(problem, plan, _merged_rows(problem, plan.merge.groups)) if not why else [])
    why = _problem_refusals(problem, padded=plan is not None)  # a plan on C % 64 != 0: wgmma-pad-channels'
    if plan is not None:
        why += _plan_refusals(problem, plan)
        if plan.streamk is not None and problem.in_channels % BOX:
            why.append(f"streamk: with in_channels {problem.in_channels} (padded to 64-channel boxes: the split-K "
                       "grid only)")  # fmt: skip
    return why


def _problem_refusals(problem: Any, boxed: bool = False, padded: bool = False) -> list[str]:
    """Why the kernel cannot compute ``problem``; ``boxed``: in its boxed form (:func:`merge_refusals` adds the
    form's own channel limits); ``padded``: with each tap's channels padded to whole boxes (C % 8 == 0)."""
    why = []
    fam = problem.layout_family
    if (fam.x, fam.w) != ("NHWGC", "GKYXC"):
        why.append(f"layout: {problem.layout} (the sm_90a kernel takes layout 2, NHWGC/GKYXC/NHWGK)")
    if problem.rank not in IM2COL_BITS:
        why.append(f"rank: {problem.rank} (the sm_90a kernel's im2col maps are 3- to 5-D: 1- to 3-D convolutions)")
    else:
        why += _im2col_refusals(problem)
    if problem.dtype not in ("f16", "bf16"):
        why.append(f"dtype: {problem.dtype} (f16 or bf16)")
    elif problem.dw_dtype not in ("f32", problem.dtype):
        why.append(f"dw_dtype: {problem.dw_dtype} (f32 or {problem.dtype}, the input type)")
    if boxed:
        return why
    if padded and problem.in_channels % 8:
        why.append(f"in_channels: {problem.in_channels} (a group's: a multiple of 8, 16-byte im2col box starts)")
    elif not padded and problem.in_channels % 64:
        why.append(f"in_channels: {problem.in_channels} (a group's: a multiple of 64, an im2col box of 64 channels)")
    if problem.out_channels % 8:
        why.append(f"out_channels: {problem.out_channels} (a group's: a multiple of 8, dy's 16-byte TMA rows)")
    return why


def _im2col_refusals(problem: Any) -> list[str]:
    """Why x's im2col map cannot be encoded or walked for ``problem`` (TMA's limits by the map's rank)."""
    why, bits = [], IM2COL_BITS[problem.rank]
    lower, upper = _corners(problem)
    if any(not -(1 << bits - 1) <= v < 1 << bits - 1 for v in (*lower, *upper)):
        why.append(f"pad: {problem.pad_low} (the im2col box's corners {lower}, {upper} past the {bits}-bit range "
                   f"of a {problem.rank + 2}-D map)")  # fmt: skip
    if max(problem.stride) > MAX_TRAVERSAL_STRIDE:
        why.append(f"stride: {problem.stride} (the im2col map's traversal strides: at most {MAX_TRAVERSAL_STRIDE})")
    return why


def _plan_refusals(problem: Any, plan: Plan, rows: int | None = None) -> list[str]:
    """Why an sm_90a plan's tile and split do not fit the kernel ("field: value" lines; ``rows``: the GEMM's M
    where it is not K, the boxed form's)."""
    t, why = plan.tile, []
    tiles = (_tile(problem, t.n, 1, rows, t.stages), _tile(problem, t.n, 2, rows, t.stages))
    if t.n not in (*TILE_COST, *NARROW_COST) or t not in tiles:
        why.append(f"tile: {t} (the sm_90a kernel's tiles: m 64 or 128, k 64, bn one of "
                   f"{', '.join(map(str, (*TILE_COST, *NARROW_COST)))})")  # fmt: skip
    elif not WGMMA_STAGES_MIN <= t.stages <= max_stages(t.m, t.n, TARGETS.get(plan.target, TARGETS["sm_90a"])):
        why.append(_stages_refusal(t.m, t.n, t.stages, TARGETS.get(plan.target, TARGETS["sm_90a"])))
    if plan.wavespec is not None or plan.depthwise is not None:
        why.append("plan: wavespec or depthwise (the sm_90a kernel has neither)")
    if plan.streamk is not None:
        sk, total = plan.streamk, _streamk_iterations(problem, t.n)
        if problem.epilogue is not None:
            why.append(f"streamk: with the {problem.epilogue.kind} epilogue (the sm_90a StreamK kernel writes dW "
                       "plain; a split carries the epilogue in its sum)")  # fmt: skip
        if sk.fixup != "linear":
            why.append(f"streamk-fixup: {sk.fixup} (the sm_90a kernel's fixup is linear)")
        if plan.split is not None:
            why.append(f"split: {plan.split.k_batch} with streamk (StreamK replaces the split)")
        if not (_is_int(sk.workgroups) and 1 <= sk.workgroups <= total):
            why.append(f"streamk: {sk.workgroups!r} workgroups (1 .. {total}, the tiles' k tiles)")
    if plan.gemm or plan.reduction_innermost:
        why.append("gemm: the sm_90a kernel reads x by its im2col map (plan.gemm false)")
    why += split_refusals(problem, plan)
    if not why and plan.split is not None:  # the kernel's own rule: no empty last split
        ktiles = -(-_reduction(problem) // BK)
        if (plan.split.k_batch - 1) * plan.split.chunk >= ktiles:
            why.append(f"split: {plan.split.k_batch} leave the last one empty ({ktiles} k tiles)")
    return why


# -- what the plan asks --------------------------------------------------------------------------------------
def is_sm90(plan: Plan) -> bool:
    """Whether ``plan`` is this kernel's (its tile names wgmma)."""
    return plan.strategy == Strategy.EXPLICIT and plan.tile is not None and plan.tile.intrinsic.startswith("NV_WGMMA")


def takes(problem: Any) -> bool:
    """Whether the kernel computes ``problem`` (:func:`refusals` has no reason)."""
    return not _problem_refusals(problem)


def takes_padded(problem: Any) -> bool:
    """Whether the kernel computes ``problem`` only with ``wgmma-pad-channels`` (C a multiple of 8, not of 64)."""
    return problem.in_channels % BOX != 0 and not _problem_refusals(problem, padded=True)


def pads_by_default(problem: Any) -> bool:
    """Whether the plan gives ``problem`` to the padded wgmma kernel by itself (:data:`PADDED_CHANNELS`: a dense
    layer the kernel takes only with ``wgmma-pad-channels``, at most :data:`PADDED_MAX_WASTE` padded columns a
    real one; switch ``WGMMA_PAD_BY_DEFAULT``)."""
    c = problem.in_channels
    waste_ok = padded_channels(c) <= PADDED_MAX_WASTE * c
    return switches.WGMMA_PAD_BY_DEFAULT and problem.groups == 1 and waste_ok and takes_padded(problem)


def takes_by_default(problem: Any) -> bool:
    """Whether the plan may choose an explicit kernel by itself on sm_90a: this one where it takes the problem
    (measured faster than the sm_80 kernel: docs/timing.md#remeasured), else the sm_80 kernel's rule."""
    return takes(problem) or sm80.takes_by_default(problem)


def unsupported(problem: Any, tiling: Any, *args: Any, **kwargs: Any) -> list[str]:
    """The sm_80 kernels' :func:`convbw_mlir.policies.sm80.unsupported` where this kernel does not take the
    problem (the plan asks it for depthwise routing), else none."""
    return [] if takes(problem) and tiling is None else sm80.unsupported(problem, tiling, *args, **kwargs)


def tiling(plan: Plan) -> Any:
    """The sm_80 kernels' tiling of an sm_80 plan (an sm_90a plan's numbers are its tile and split)."""
    if is_sm90(plan):
        raise ValueError("plan: an sm_90a plan has no sm_80 tiling (its numbers are plan.tile and plan.split)")
    return sm80.tiling(plan)


def _reduction(problem: Any) -> int:
    return problem.batch * math.prod(problem.output_size)


def _tile(problem: Any, bn: int, consumers: int | None = None, rows: int | None = None, stages: int = STAGES) -> Tile:
    """The plan's tile: ``consumers`` wgmma warpgroups of 64 rows (default: :func:`consumers_for` K, or ``rows``)."""
    c = consumers or consumers_for(rows or problem.out_channels)
    return Tile(64 * c, bn, BK, c, 1, stages, WGMMA.format(n=bn, t=problem.dtype.upper()))


def ring_bytes(rows: int, bn: int, stages: int) -> int:
    """Dynamic shared memory of the wgmma kernel (gemm_sm90.Sm90Tiling.shared_bytes): ``stages`` k tiles of A
    (``rows x 64``) and B (``bn x 64``) 16-bit elements, two mbarriers a stage, the base's alignment."""
    return stages * ((rows + bn) * BK * 2 + STAGE_BARRIER_BYTES) + SWIZZLE_ALIGN


def max_stages(rows: int, bn: int, tgt: Target) -> int:
    """The deepest ring of a ``rows x bn`` tile whose :func:`ring_bytes` fit ``tgt``'s shared memory a workgroup
    (sm_90a: 232,448 bytes, 227 KiB: targets.py, the CUDA guide's cc 9.0 limit)."""
    return (tgt.lds_bytes - SWIZZLE_ALIGN) // ((rows + bn) * BK * 2 + STAGE_BARRIER_BYTES)


def consumers_for(m: int) -> int:
    """Consumer warpgroups (64 rows each) of the tile for a group's ``m`` = K: one where K <= 64."""
    return 1 if m <= 64 else CONSUMERS


def widths_for(n: int) -> list[int]:
    """The tile widths the rule weighs for ``n`` = Y X C columns: 64 alone where n <= 64, else the wide ones."""
    return list(NARROW_COST) if n <= 64 else list(TILE_COST)


def plan(problem: Any, tgt: Target, opts: Overrides) -> Plan:
    """This kernel's plan where it takes the problem and the options (``k-batch``, ``tile-n`` as the wgmma
    N: 64, 128, 192 or 256; ``streamk``; ``wgmma-rows``: 64 or 128 rows, one or two consumer warpgroups), by
    :func:`choose` for the rest; else the sm_80 kernels' (:func:`sm80.plan`).

    Raises:
        PlanError: the kernel cannot carry the plan out (every reason, "field: value").
    """
    others = {k: v for k, v in opts.tile.items() if k != "n"}
    merge = _merge(problem, tgt, opts, others)
    if merge:
        return _boxed_plan(problem, tgt, opts, merge)
    if opts.wgmma_pad_channels:
        _check_padded(problem, opts, others)
    if opts.wgmma_rows is not None:
        _check_rows(problem, opts, others)
    if opts.wgmma_stages is not None:
        _check_stages(problem, opts, others)
    # the padded kernel by its rule where no option asks for another kernel or a knob it was not measured with
    unasked = opts.streamk is None and opts.wgmma_rows is None and opts.wgmma_stages is None
    by_rule = not opts.wgmma_pad_channels and unasked and pads_by_default(problem)
    padded = opts.wgmma_pad_channels or by_rule
    if not (takes(problem) or padded) or others or opts.producers is not None:
        return sm80.plan(problem, tgt, opts)
    m, reduction = problem.out_channels, _reduction(problem)
    n = padded_channels(problem.in_channels) * math.prod(problem.filter_size)  # the GEMM's N: taps x Cp
    widths = [opts.tile["n"]] if "n" in opts.tile else widths_for(n)
    if widths[0] not in (*TILE_COST, *NARROW_COST):
        names = ", ".join(map(str, (*TILE_COST, *NARROW_COST)))
        raise PlanError(f"tile-n: {widths[0]} (the sm_90a kernel's bn: one of {names})")
    consumers = opts.wgmma_rows // 64 if opts.wgmma_rows is not None else None  # default: one where K <= 64
    stages = STAGES if opts.wgmma_stages is None else opts.wgmma_stages
    if opts.wgmma_stages is not None:  # the widths whose ring of that depth fits (the narrowest last)
        rows = 64 * (consumers or consumers_for(m))
        fit = [w for w in widths if stages <= max_stages(rows, w, tgt)]
        if not fit:
            raise PlanError(_stages_refusal(rows, min(widths), stages, tgt))
        widths = fit
    # an epilogue rides the second pass (the split's sum, or one rounding pass): StreamK writes dW itself
    floor = floor_us(problem, tgt)
    args = (m, n, reduction, tgt.compute_units, problem.groups, widths, problem.epilogue is None, floor)
    if opts.wgmma_rows is not None or padded or opts.wgmma_stages is not None:
        args = (*args[:6], False, floor)  # the 128-row, unpadded, 4-stage model's split; no StreamK
    bn, splits, streamk = choose(*args, min_slice=PADDED_MIN_SLICE if padded else MIN_SLICE)
    asked = opts.streamk is not None or _is_int(opts.k_batch) or opts.wgmma_rows is not None or padded
    asked = asked or opts.wgmma_stages is not None
    decided = [] if asked else deciding_rules(*args)
    if opts.streamk is not None:  # StreamK asked: on the target's SMs (auto) or that many workgroups
        splits, streamk = 1, tgt.compute_units if opts.streamk == "auto" else opts.streamk
    if _is_int(opts.k_batch):
        splits = opts.k_batch
        streamk = streamk if opts.streamk is not None else 0
    chosen = Plan(tgt.name, Strategy.EXPLICIT, tile=_tile(problem, bn, consumers, stages=stages))
    if streamk:
        total = _streamk_iterations(problem, bn)
        chosen = replace(chosen, streamk=StreamKPlan(min(streamk, total), opts.streamk_fixup or "linear"))
    if splits > 1:
        ktiles = -(-reduction // BK)
        chosen = replace(chosen, split=Split(EXPLICIT_SPLIT, splits, -(-ktiles // splits)))
    check(problem, chosen, refusals)
    if by_rule:  # the padded kernel by its rule: the decision names it and its measurement
        what = "no split" if chosen.split is None else f"{chosen.split.k_batch} splits"
        chosen = replace(chosen, decision=Decision("", "", f"the wgmma kernel on in_channels {problem.in_channels} "
                         f"padded to {padded_channels(problem.in_channels)}, {what} of {bn}-wide tiles by "
                         f"{PADDED_CHANNELS.name}: {PADDED_CHANNELS.reason}"))  # fmt: skip
    elif decided:  # the model's named terms that made this choice travel with it (the rule's decision shows them)
        what = "StreamK" if streamk else "no split" if splits == 1 else f"{splits} splits"
        why = "; ".join(f"{r.name}: {r.reason}" for r in decided)
        chosen = replace(chosen, decision=Decision("", "", f"{what} of {bn}-wide tiles by {why}"))
    return chosen


def _sm80_options(opts: Overrides, others: dict[str, int]) -> list[str]:
    """The sm_80 kernel's options asked beside a wgmma one (tile options but the width, producers), as one reason."""
    if not others and opts.producers is None:
        return []
    spelled = {"m": "tile-m", "k": "tile-k"}
    asked = {spelled.get(k, k.replace("_", "-")): v for k, v in others.items()}
    asked.update({"producers": opts.producers} if opts.producers is not None else {})
    return [f"with {', '.join(f'{k} {v}' for k, v in asked.items())} (options of the sm_80 kernel)"]


def _check_rows(problem: Any, opts: Overrides, others: dict[str, int]) -> None:
    """Refuse ``wgmma-rows`` where the plain wgmma kernel cannot take it (every reason, "field: value").

    Raises:
        PlanError: naming wgmma-rows and its value, and why.
    """
    rows, why = opts.wgmma_rows, []
    why += _sm80_options(opts, others)
    if opts.streamk is not None and rows == 64 and problem.out_channels > 64:  # not verified on the emulator
        why.append(f"with streamk {opts.streamk!r} (StreamK's workspace and fixup with one consumer where K > 64: "
                   "unverified)")  # fmt: skip
    if rows == 128 and problem.out_channels <= 64:
        why.append(f"with out_channels {problem.out_channels} (K <= 64: the kernel's tile is 64 rows)")
    refused = _problem_refusals(problem, padded=opts.wgmma_pad_channels)
    if refused:
        why.append("on a problem the wgmma kernel does not take: " + "; ".join(refused))
    if why:
        raise PlanError(f"wgmma-rows: {rows} " + "; ".join(why))


def _check_stages(problem: Any, opts: Overrides, others: dict[str, int]) -> None:
    """Refuse ``wgmma-stages`` where the plain wgmma kernel cannot take it (every reason, "field: value"; a depth
    past the tile's shared memory is :func:`plan`'s, once the width is known).

    Raises:
        PlanError: naming wgmma-stages and its value, and why.
    """
    stages, why = opts.wgmma_stages, []
    why += _sm80_options(opts, others)
    refused = _problem_refusals(problem, padded=opts.wgmma_pad_channels)
    if refused:
        why.append("on a problem the wgmma kernel does not take: " + "; ".join(refused))
    if why:
        raise PlanError(f"wgmma-stages: {stages} " + "; ".join(why))


def _stages_refusal(rows: int, bn: int, stages: int, tgt: Target) -> str:
    """A ring too deep (or too shallow) for a ``rows x bn`` tile on ``tgt``, naming the most that fits."""
    most = max_stages(rows, bn, tgt)
    if stages < WGMMA_STAGES_MIN:
        return f"wgmma-stages: {stages} (the ring takes {WGMMA_STAGES_MIN} to {most} stages for the {rows}x{bn} tile)"
    return (f"wgmma-stages: {stages} (the {rows}x{bn} tile's ring of {stages} stages needs "
            f"{ring_bytes(rows, bn, stages):,} bytes of shared memory, past {tgt.name}'s {tgt.lds_bytes:,} a "
            f"workgroup: at most {most} stages fit)")  # fmt: skip


def padded_channels(c: int) -> int:
    """A tap's GEMM columns of the plain wgmma kernel: ``c`` rounded up to whole 64-channel boxes."""
    return -(-c // BOX) * BOX


def _check_padded(problem: Any, opts: Overrides, others: dict[str, int]) -> None:
    """Refuse ``wgmma-pad-channels`` where the padded wgmma kernel cannot take it (every reason, "field: value").

    Raises:
        PlanError: naming wgmma-pad-channels, and why.
    """
    why, c = [], problem.in_channels
    why += _sm80_options(opts, others)
    if opts.streamk is not None:  # the padded epilogue is verified on the split-K grid only
        why.append(f"with streamk {opts.streamk!r} (the padded kernel runs the split-K grid)")
    if c % BOX == 0:
        why.append(f"with in_channels {c} (a multiple of 64: the wgmma kernel takes it unpadded)")
    refused = _problem_refusals(problem, padded=True)
    if refused:
        why.append("on a problem the wgmma kernel does not take: " + "; ".join(refused))
    if why:
        raise PlanError("wgmma-pad-channels: true " + "; ".join(why))


# -- thin and medium groups: the boxed form (conv_sm90.ConvSm90.merge) ----------------------------------------
BOX = 64  # channels of one im2col box: the boxed form's merged groups fit one
MERGE_MAX_ROWS = 2 * 64  # the merged groups' K fill at most two consumer warpgroups
# The rule behind switches.WGMMA_MERGE_BY_DEFAULT: the group widths (C, in channels a group) where the boxed form
# takes the plan from the sm_80 kernel: 4-16, where every layer measured was faster (docs/decisions.md#wgmma-groups)
MERGE_RULE_CHANNELS = (4, 16)


def merge_for(problem: Any) -> int:
    """The most groups the boxed form merges for ``problem`` (0: the form does not apply, C a multiple of 64 or
    over 64, or no such count keeps its boxes' TMA starts aligned): as many as fit one 64-channel box and (where K
    allows) two consumer warpgroups' rows, at most G, and of those the most whose box starts are 16-byte aligned
    (:func:`merge_misaligned`)."""
    c, k = problem.in_channels, problem.out_channels
    if c % BOX == 0 or c > BOX:
        return 0
    most = max(1, min(problem.groups, BOX // c, MERGE_MAX_ROWS // k))
    return next((m for m in range(most, 0, -1) if not merge_misaligned(problem, m)), 0)


def merge_misaligned(problem: Any, groups: int) -> str:
    """Why ``groups`` groups a box put a box start off TMA's 16-byte alignment ("" : they do not). Box ``b`` loads x
    from channel ``b m C`` and dy from column ``b m K`` (+ whole 64-column tiles); a TMA whose innermost coordinate
    is not a multiple of 16 bytes stops the kernel on sm_90a (cudaErrorIllegalInstruction: the thin90 fuzz on an
    H100, triton-lang/triton#7385, tile-ai/tilelang#2681), so ``m C`` and ``m K`` must be multiples of 8 16-bit
    elements wherever a second box exists (one box, m = G: G C and G K, which TMA's row strides already need)."""
    c, k = problem.in_channels, problem.out_channels
    if groups >= problem.groups or ((groups * c) % 8 == 0 and (groups * k) % 8 == 0):
        return ""
    return (f"wgmma-merge: {groups} x {c} in, {k} out channels = {groups * c}, {groups * k} (each a multiple of 8: "
            "16 bytes, the TMA start of every box's x channels and dy columns)")  # fmt: skip


def merge_refusals(problem: Any, groups: int) -> list[str]:
    """Why the boxed form cannot merge ``groups`` groups of ``problem`` a box ("field: value" lines; empty: it can)."""
    why = _problem_refusals(problem, boxed=True)
    c, k, g = problem.in_channels, problem.out_channels, problem.groups
    if c % BOX == 0:
        why.append(f"wgmma-merge: {groups} with in_channels {c} (a multiple of 64: the plain wgmma kernel)")
    elif not 1 <= groups <= min(g, BOX // c):
        why.append(f"wgmma-merge: {groups} groups of {c} channels (1 .. {min(g, BOX // c)}: their channels in one "
                   f"{BOX}-channel box, at most G)")  # fmt: skip
    if c % 2:
        why.append(f"in_channels: {c} (the boxed form stores pairs of channels: C even)")
    if (g * c) % 8 or (g * k) % 8:
        why.append(f"groups: {g} x {c} in, {k} out channels (G C and G K multiples of 8: TMA's 16-byte rows)")
    elif misaligned := merge_misaligned(problem, groups):
        why.append(misaligned)
    return why


def merge_rule(problem: Any, tgt: Target) -> int:
    """Groups a box the plan gives the boxed form by itself (0: none): where the switch
    :data:`~convbw_mlir.policies.switches.WGMMA_MERGE_BY_DEFAULT` is on, for groups of C within
    :data:`MERGE_RULE_CHANNELS` that the form takes (:func:`merge_for`, :func:`merge_refusals`), f16 or bf16."""
    if not (switches.WGMMA_MERGE_BY_DEFAULT and tgt.wgmma_n and problem.groups > 1):
        return 0
    lo, hi = MERGE_RULE_CHANNELS
    m = merge_for(problem)
    if not (m and lo <= problem.in_channels <= hi) or merge_refusals(problem, m) or problem.epilogue is not None:
        return 0
    return m


def _merge(problem: Any, tgt: Target, opts: Overrides, others: dict[str, int]) -> int:
    """The boxed form's groups a box for :func:`plan`: as asked (``wgmma_merge``), else the rule's where no option
    asks for the sm_80 kernels (0: not the boxed form)."""
    if opts.wgmma_merge is None:
        asked = others or opts.producers is not None or opts.merge_groups is not None or opts.streamk is not None
        asked = asked or opts.wgmma_rows is not None or opts.wgmma_pad_channels or opts.wgmma_stages is not None
        return 0 if asked or opts.k_batch == "rows" else merge_rule(problem, tgt)
    for name, value in (("tile options", others), ("producers", opts.producers), ("merge-groups", opts.merge_groups),
                        ("streamk", opts.streamk), ("wgmma-rows", opts.wgmma_rows),
                        ("wgmma-pad-channels", opts.wgmma_pad_channels),
                        ("wgmma-stages", opts.wgmma_stages)):  # fmt: skip
        if value:
            raise PlanError(f"wgmma-merge: {opts.wgmma_merge} with {name} {value!r} (the boxed form takes "
                            "k-batch and tile-n only)")  # fmt: skip
    why = merge_refusals(problem, opts.wgmma_merge)
    if why:
        raise PlanError("strategy explicit: " + "; ".join(why))
    return opts.wgmma_merge


def _merged_rows(problem: Any, groups: int) -> int:
    return groups * problem.out_channels


def _boxed_plan(problem: Any, tgt: Target, opts: Overrides, merge: int) -> Plan:
    """The boxed form's plan: the GEMM of ``merge`` groups a box (``merge K`` rows, ``taps x 64`` columns,
    ``ceil(G / merge)`` GEMMs) tiled and split by :func:`choose` (no StreamK: the form runs the split-K grid)."""
    rows, n = _merged_rows(problem, merge), BOX * math.prod(problem.filter_size)
    reduction, gemms = _reduction(problem), -(-problem.groups // merge)
    widths = [opts.tile["n"]] if "n" in opts.tile else widths_for(n)
    if widths[0] not in (*TILE_COST, *NARROW_COST):
        names = ", ".join(map(str, (*TILE_COST, *NARROW_COST)))
        raise PlanError(f"tile-n: {widths[0]} (the sm_90a kernel's bn: one of {names})")
    bn, splits, _ = choose(rows, n, reduction, tgt.compute_units, gemms, widths, False, floor_us(problem, tgt))
    if _is_int(opts.k_batch):
        splits = opts.k_batch
    chosen = Plan(tgt.name, Strategy.EXPLICIT, tile=_tile(problem, bn, rows=rows), merge=MergePlan(merge))
    if splits > 1:
        ktiles = -(-reduction // BK)
        chosen = replace(chosen, split=Split(EXPLICIT_SPLIT, splits, -(-ktiles // splits)))
    check(problem, chosen, refusals)
    what = "no split" if splits == 1 else f"{splits} splits"
    how = "by its rule (switch WGMMA_MERGE_BY_DEFAULT)" if opts.wgmma_merge is None else "as asked (wgmma-merge)"
    plural = "s" * (merge > 1)
    detail = (f"the wgmma kernel's boxed form {how}: {merge} group{plural} of {problem.in_channels} channels a "
              f"64-channel box, {what} of {bn}-wide tiles")  # fmt: skip
    return replace(chosen, decision=Decision("", "", detail))


# -- what the launcher encodes ----------------------------------------------------------------------------
def _corners(problem: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """x's im2col bounding box per image (:func:`convbw_mlir.cuda_launch.im2col_corners`)."""
    return im2col_corners(problem.input_size, problem.output_size, problem.stride, problem.pad_low)


def tensor_maps(problem: Any, kernel: str) -> list[dict[str, Any]]:
    """The kernel's two CUtensorMaps as the direct launch encodes them (``cuda_launch.TensorMap`` fields), for
    the dispatch ``kernel`` whose bindings are dy ``[N Ho Wo, G K]`` (0), x ``[N, *spatial, G C]`` (1), the maps
    (2: dy's map at byte 0, x's at 128): dy tiled, box 64 x 64; x im2col (3-, 4- or 5-D: the convolution's rank
    plus 2), 64 channels x 64 pixels, traversal strides the conv's; 128-byte swizzle, L2 promotion 256 B, zero
    outside (cuda.h's enums)."""
    dtype = {"f16": 6, "bf16": 9}[problem.dtype]  # CU_TENSOR_MAP_DATA_TYPE_FLOAT16 / _BFLOAT16
    n, gk, gc = problem.batch, problem.groups * problem.out_channels, problem.groups * problem.in_channels
    dims = [gc, *problem.input_size[::-1], n]  # innermost first
    strides = [2 * math.prod(dims[: i + 1]) for i in range(len(dims) - 1)]
    lower, upper = _corners(problem)
    common = {"kernel": kernel, "maps_binding": 2, "dtype": dtype, "swizzle": 3, "l2_promotion": 3}
    return [
        {**common, "binding": 0, "slot": 0, "mode": "tiled", "dims": [gk, _reduction(problem)], "strides": [gk * 2],
         "box": [BK, BK], "element_strides": [1, 1]},
        {**common, "binding": 1, "slot": 1, "mode": "im2col", "dims": dims, "strides": strides, "box": [BK, BK],
         "element_strides": [1, *problem.stride[::-1], 1], "lower": list(lower), "upper": list(upper)},
    ]  # fmt: skip


def floor_us(problem: Any, tgt: Target) -> float:
    """:data:`MEMORY_FLOOR`: us to read x and dy and write dW once at ``tgt``'s bandwidth."""
    return problem.min_bytes / (tgt.bandwidth_gbs * 1e3)


def _fill(bn: int) -> int:
    return COST.fill_tiles_wide if bn == BN else COST.fill_tiles


def cost(m: int, n: int, reduction: int, bn: int, splits: int, sms: int = SMS, groups: int = 1,
         floor: float = 0.0) -> float:  # fmt: skip
    """Estimated us of ``groups`` ``m x n`` dWs reducing over ``reduction`` rows with tile ``128 x bn`` (``64 x
    bn`` where K <= 64) and ``splits`` slices: whole waves of ``sms`` workgroups, each its slice's k tiles plus
    the fill, and a split's partials' round trip and its sum's dispatch; never below ``floor`` us
    (:data:`MEMORY_FLOOR`)."""
    rows = 64 * consumers_for(m)
    tiles = groups * -(-m // rows) * -(-n // bn)
    ktiles = -(-reduction // BK)
    waves = -(-tiles * splits // sms)
    rate = {**COST.tile_cost, **COST.narrow_cost}[bn] * (COST.one_consumer if rows == 64 else 1.0)
    us = waves * (-(-ktiles // splits) + _fill(bn)) * COST.ktile_us * rate
    us += 2 * splits * groups * m * n * 4 / COST.bytes_per_us + COST.sum_us if splits > 1 else 0.0
    return max(us, floor)


def cost_streamk(m: int, n: int, reduction: int, bn: int, sms: int = SMS, groups: int = 1, floor: float = 0.0,
                 segments: bool = True) -> float | None:  # fmt: skip
    """Estimated us of StreamK on ``sms`` workgroups (each an even share of every tile's k tiles, plus the fill at
    each tile its share touches (``segments``: :data:`STREAMK_SEGMENTS`; else once), never below ``floor``, plus
    each workgroup's f32 partial out and back), or None where the tiles are too few for it
    (:attr:`CostModel.streamk_min_tiles` a workgroup) or narrow (64 wide: the model has no StreamK cost for it)."""
    tiles = groups * -(-m // BM) * -(-n // bn)
    if bn not in COST.tile_cost or tiles < COST.streamk_min_tiles * sms:
        return None
    ktiles = -(-reduction // BK)
    share = -(-tiles * ktiles // sms)
    touched = share / ktiles + 1 if segments else 1  # a run of `share` k tiles meets share/ktiles + 1 tiles
    us = (share + touched * COST.fill_tiles) * COST.ktile_us * COST.tile_cost[bn]
    return max(us + 2 * sms * BM * bn * 4 / COST.bytes_per_us, floor)


def _options(m: int, n: int, reduction: int, sms: int, groups: int, widths: list[int], streamk: bool, floor: float,
             segments: bool = True, min_slice: int = MIN_SLICE,
             ) -> list[tuple[float, float, int, int, int]]:  # fmt: skip
    """(us, us without the floor, bn, splits, streamk workgroups) of every choice :func:`choose` weighs (a split's
    slices at least ``min_slice`` k tiles)."""
    ktiles = -(-reduction // BK)
    narrow = m <= 64 or n <= 64  # a narrow tile's few tiles: splits up to one wave

    def most(bn: int) -> int:
        return (
            max(MAX_SPLITS, sms // (groups * -(-m // (64 * consumers_for(m))) * -(-n // bn))) if narrow else MAX_SPLITS
        )

    options = []
    for bn in widths:
        for s in range(1, most(bn) + 1):
            if (s == 1 or ktiles // s >= min_slice) and (s - 1) * -(-ktiles // s) < ktiles:
                us = cost(m, n, reduction, bn, s, sms, groups)
                options.append((max(us, floor), us, bn, s, 0))
    for bn in widths if streamk and not narrow else []:
        us = cost_streamk(m, n, reduction, bn, sms, groups, segments=segments)
        if us is not None:
            options.append((max(us, floor), us, bn, 1, min(sms, groups * -(-m // BM) * -(-n // bn) * ktiles)))
    return options


def _best(options: list[tuple[float, float, int, int, int]]) -> tuple[float, float, int, int, int]:
    # at the floor the estimates tie: the one of least compute-side time (bandwidth-bound 1x1s measured faster
    # with more splits in flight, not fewer: docs/decisions.md#sm90-cost-rules)
    return min(options, key=lambda o: (round(o[0], 1), round(o[1], 1), -o[2], o[4], o[3]))


def choose(m: int, n: int, reduction: int, sms: int = SMS, groups: int = 1, widths: list[int] | None = None,
           streamk: bool = True, floor: float = 0.0, min_slice: int = MIN_SLICE) -> tuple[int, int, int]:  # fmt: skip
    """``(bn, splits, streamk)`` of least estimated time (the tile's rows: :func:`consumers_for`): the tile width
    (of ``widths``, default :func:`widths_for`) and either
    a split count by :func:`cost` (each slice at least ``min_slice`` k tiles: 8, CK's k_batch rule of thumb
    re-weighed for whole waves, none empty; ``streamk`` 0) or StreamK on ``sms`` workgroups by
    :func:`cost_streamk` (splits 1);
    none estimated below ``floor`` us (:data:`MEMORY_FLOOR`); on a tie the wider tile, then the split, then the
    fewer splits (``streamk`` False: splits only)."""
    best = _best(_options(m, n, reduction, sms, groups, widths or widths_for(n), streamk, floor, min_slice=min_slice))
    return best[2], best[3], best[4]


def deciding_rules(m: int, n: int, reduction: int, sms: int = SMS, groups: int = 1, widths: list[int] | None = None,
                   streamk: bool = True, floor: float = 0.0) -> list[CostRule]:  # fmt: skip
    """The :data:`COST_RULES` that shaped :func:`choose`'s answer: :data:`STREAMK_SEGMENTS` where without it the
    choice would differ, :data:`MEMORY_FLOOR` where the chosen estimate is the floor (bandwidth-bound)."""
    widths = widths or widths_for(n)
    chosen = _best(_options(m, n, reduction, sms, groups, widths, streamk, floor))
    offered = streamk and m > 64 and n > 64  # StreamK is weighed at all (not for a narrow tile's few tiles)
    once = _best(_options(m, n, reduction, sms, groups, widths, streamk, floor, segments=False)) if offered else chosen
    return [STREAMK_SEGMENTS] * (once[2:] != chosen[2:]) + [MEMORY_FLOOR] * (chosen[1] < floor)


def auto_splits(m: int, n: int, reduction: int, sms: int = SMS, groups: int = 1) -> int:
    """The split count of :func:`choose`."""
    return choose(m, n, reduction, sms, groups)[1]


def _streamk_iterations(problem: Any, bn: int) -> int:
    """StreamK's iterations of ``problem`` with tile width ``bn``: every tile's k tiles."""
    n = problem.in_channels * math.prod(problem.filter_size)
    return problem.groups * -(-problem.out_channels // BM) * -(-n // bn) * -(-_reduction(problem) // BK)


def streamk_workspace(plan: Plan) -> tuple[int, int]:
    """Bytes of StreamK's f32 partials (a ``128 x bn`` tile a workgroup) and of its i32 flags (one a consumer
    warpgroup of a workgroup)."""
    w, t = plan.streamk.workgroups, plan.tile
    return w * t.m * t.n * 4, w * t.subgroups_m * 4


def flops(problem: Any) -> int:
    """The problem's multiply-adds, twice."""
    return (
        2
        * problem.groups
        * problem.out_channels
        * problem.in_channels
        * math.prod(problem.filter_size)
        * (problem.batch * math.prod(problem.output_size))
    )
