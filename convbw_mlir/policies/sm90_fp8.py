"""The policy of fp8 weight gradients (issue 24 item 4): which fp8 problems the sm_90a fp8 GEMM
(``convbw_mlir.kernels.gemm_sm90`` with ``elem_bytes=1``) computes, its tiling and split, its tensor maps, and
why not on every other target (pure Python, no MLIR).

8-bit wgmma takes both operands K-major, so the weight gradient ``dW[K, C] = sum_r dy[r, K] x[r, C]`` is the
"TN" GEMM of ``dy^T [K, R]`` and ``x^T [C, R]``: the K-major copies an fp8 recipe's quantize step writes beside
its casts. The plan (``convbw_mlir.plan.decide`` asks this module first for any fp8 problem) makes them in the
module (``convbw-explicit-kernel``: a transpose each, R padded with zeros to whole k tiles of every split), then
the GEMM; a split's f32 partials are summed in split order by the same stage 2 as the other kernels'.
A 1x1 filter (any stride: x's strided positions are read by the same transpose) is a plain transpose; other
filters are refused: their K-major im2col copy of x would be ``Y X`` times x's bytes written and read again
each step (9x for a 3x3), and an fp8 recipe quantizes x once (docs/explicit-kernels.md "fp8 in the plan").
The per-tensor scales are the problem's scale epilogue (``alpha = scale_x * scale_dy``), a constant of the
kernel (split: of the stage 2).
"""

from __future__ import annotations

import math
from typing import Any

from convbw_mlir.loops import Split
from convbw_mlir.plan_data import Overrides, Plan, PlanError, Strategy, Tile, _is_int
from convbw_mlir.policies.split import EXPLICIT_SPLIT
from convbw_mlir.targets import TARGETS, Target

__all__ = ["BK", "MAPS_BYTES", "SMS", "STAGES", "choose", "is_fp8", "padded_reduction", "plan", "refusals",
           "target_refusal", "tensor_maps", "workspace_bytes"]  # fmt: skip

BK = 128  # one 128-byte swizzled row of 8-bit elements a k tile (wgmma k32 x 4)
STAGES = 6  # bench/results/h200_2026-11-26_hopper_fp8: 128x128, 6 stages, promote (1.80x our f16 wgrad)
SMS = TARGETS["sm_90a"].compute_units  # H100 SXM / H200's SMs (the target table's): the split fills one wave
MAX_SPLITS = 32
MIN_KTILES = 8  # k tiles a split at least (CK's k_batch rule of thumb, as policies/sm90.py)
MAPS_BYTES = 256  # A's (dy^T) CUtensorMap, then B's (x^T)
WGMMA = "NV_WGMMA_F32_64x{n}x32_{a}_{b}"  # the plan's name of the instruction: A (dy^T) type, then B (x^T)
LAYOUTS = ("NHWGC/GKYXC/NHWGK", "NHWC/KYXC/NHWK")  # channels last: x [R, C] and dy [R, K] as they lie
K_MAJOR = "CNHW/KYXC/KNHW"  # problem.K_MAJOR: the copies themselves, from the caller's quantize step
_TMA_UINT8 = 0  # CU_TENSOR_MAP_DATA_TYPE_UINT8: TMA moves fp8 as bytes


def is_fp8(plan: Plan) -> bool:
    """Whether ``plan`` is the fp8 GEMM's (its tile names a k32 wgmma)."""
    return plan.strategy == Strategy.EXPLICIT and plan.tile is not None and plan.tile.intrinsic.startswith(
        "NV_WGMMA_F32_64x") and "x32_" in plan.tile.intrinsic  # fmt: skip


def target_refusal(problem: Any, tgt: Target) -> str | None:
    """Why ``tgt`` computes no fp8 problem ("dtype: ..." naming the target), or None on sm_90a."""
    if tgt.wgmma_n:
        return None
    types = f"{problem.dtype}/{problem.dy_type}"
    if tgt.family == "nvidia":
        why = f"{tgt.name} has no fp8 MMA (fp8 wgmma is sm_90a's; compile for target sm_90a)"
    elif tgt.name in ("gfx942", "gfx950"):
        why = f"{tgt.name} has fp8 MFMA, but no kernel of ours uses it yet"
    elif not tgt.is_gpu:
        why = f"{tgt.name} has no fp8 kernel here (the float64 reference checks fp8 on the CPU)"
    else:
        why = f"{tgt.name} has no fp8 kernel of ours"
    return f"dtype: {types} (fp8 weight gradients are computed on sm_90a only: {why})"


def refusals(problem: Any, plan: Plan | None = None) -> list[str]:
    """Why the fp8 path cannot compute ``problem`` ("field: value (why)" lines; empty: it can), and with a
    ``plan``, why it cannot carry that plan out."""
    why = []
    if not problem.is_fp8:
        why.append(f"dtype: {problem.dtype} (the fp8 path takes e4m3 / e5m2 x and dy)")
    if problem.layout not in (*LAYOUTS, K_MAJOR):
        why.append(f"layout: {problem.layout} (the fp8 path reads x and dy channels-last, {' or '.join(LAYOUTS)}, "
                   f"or K-major, {K_MAJOR})")  # fmt: skip
    if problem.layout == K_MAJOR and any(s != 1 for s in problem.stride):
        why.append(f"stride: {problem.stride} (K-major x holds every position: the GEMM reads it as it is; a "
                   "strided 1x1 takes channels-last x)")  # fmt: skip
    if problem.groups != 1:
        why.append(f"groups: {problem.groups} (the fp8 path is one TN GEMM: groups 1)")
    if any(f != 1 for f in problem.filter_size):
        why.append(f"filter_size: {problem.filter_size} (the fp8 path takes 1x1 filters: their K-major x^T is a "
                   "transpose; another filter's im2col copy would be Y*X times x's bytes)")  # fmt: skip
    if any(problem.pad_low) or any(problem.pad_high):
        why.append(f"pad_low/pad_high: {problem.pad_low}/{problem.pad_high} (the fp8 path takes unpadded 1x1s)")
    if problem.in_channels % 64:
        why.append(f"in_channels: {problem.in_channels} (a multiple of 64: the fp8 GEMM's N tile)")
    if problem.out_channels % 64:
        why.append(f"out_channels: {problem.out_channels} (a multiple of 64: a consumer warpgroup's 64 rows)")
    if problem.epilogue is not None and problem.epilogue.kind != "scale":
        why.append(f"epilogue: {problem.epilogue.kind} (the fp8 path takes the scale epilogue only: its "
                   "per-tensor scales)")  # fmt: skip
    if plan is not None and not why:
        want = _plan(problem, plan.target, plan.tile.n if plan.tile else 0, plan.k_batch)
        if plan.tile != want.tile or plan.split != want.split:
            why.append(f"tile/split: {plan.tile}, {plan.split} (the fp8 GEMM's: {want.tile}, {want.split})")
        if plan.gemm or plan.streamk or plan.wavespec or plan.depthwise or plan.merge or plan.channels_last:
            why.append("plan: gemm, streamk, wavespec, depthwise, merge or channels_last (the fp8 GEMM has none)")
    return why


def _reduction(problem: Any) -> int:
    return problem.batch * math.prod(problem.output_size)


def padded_reduction(problem: Any, plan: Plan) -> int:
    """R padded with zero rows to whole k tiles of every split (what the K-major copies hold)."""
    return plan.k_batch * (plan.split.chunk if plan.split else -(-_reduction(problem) // BK)) * BK


def choose(m: int, n: int, reduction: int, sms: int = SMS) -> tuple[int, int, int]:
    """``(consumers, bn, splits)``: two consumer warpgroups (bm 128) where M allows, else one; bn 128 where N
    allows (promote keeps two accumulator sets: bn <= 128), else 64; splits filling one wave of ``sms``
    workgroups, each at least :data:`MIN_KTILES` k tiles; where R is whole k tiles, the largest split count
    up to that which divides them, if at least half of it (the copies then need no zero rows: IREE makes a
    padded copy a fill and a copy of its own, two more passes over the operand)."""
    consumers = 2 if m % 128 == 0 else 1
    bn = 128 if n % 128 == 0 else 64
    tiles = (m // (64 * consumers)) * (n // bn)
    ktiles = -(-reduction // BK)
    splits = max(1, min(sms // tiles, ktiles // MIN_KTILES, MAX_SPLITS))
    if reduction % BK == 0:
        whole = max(d for d in range(1, splits + 1) if ktiles % d == 0)
        splits = whole if 2 * whole >= splits else splits
    return consumers, bn, splits


def _plan(problem: Any, target: str, bn: int = 0, splits: int = 0) -> Plan:
    m, n, reduction = problem.out_channels, problem.in_channels, _reduction(problem)
    consumers, auto_bn, auto_splits = choose(m, n, reduction)
    bn, splits = bn or auto_bn, splits or auto_splits
    intrinsic = WGMMA.format(n=bn, a=problem.dy_type.upper(), b=problem.dtype.upper())
    chosen = Plan(target, Strategy.EXPLICIT, tile=Tile(64 * consumers, bn, BK, consumers, 1, STAGES, intrinsic))
    if splits > 1:
        ktiles = -(-reduction // BK)
        chosen = Plan(chosen.target, chosen.strategy, tile=chosen.tile,
                      split=Split(EXPLICIT_SPLIT, splits, -(-ktiles // splits)))  # fmt: skip
    return chosen


def plan(problem: Any, tgt: Target, opts: Overrides) -> Plan:
    """The fp8 GEMM's plan for an fp8 ``problem`` on ``tgt`` (sm_90a); ``k-batch`` and ``tile-n`` (64 or 128)
    override its choice.

    Raises:
        PlanError: another target (naming it and why), an option the path has no knob for, or a problem it
            does not take (every reason, "field: value").
    """
    refusal = target_refusal(problem, tgt)
    if refusal:
        raise PlanError(refusal)
    if opts.strategy not in (None, Strategy.EXPLICIT.value):
        raise PlanError(f"strategy: {opts.strategy} (an fp8 problem is computed by the fp8 GEMM, strategy explicit)")
    others = {k: v for k, v in opts.tile.items() if k != "n"}
    extra = {"tile": others or None, "streamk": opts.streamk, "producers": opts.producers,
             "layout4": opts.layout4, "merge-groups": opts.merge_groups, "plan-for": opts.plan_for,
             "gemm": opts.gemm, "grouped": opts.grouped,
             "reduction-innermost": opts.reduction_innermost or None}  # fmt: skip
    for name, value in extra.items():
        if value is not None:
            raise PlanError(f"{name}: {value!r} (the fp8 GEMM takes k-batch and tile-n only)")
    bn = opts.tile.get("n", 0)
    if bn and (bn not in (64, 128) or problem.in_channels % bn):
        raise PlanError(f"tile-n: {bn} (the fp8 GEMM's bn: 64 or 128, dividing in_channels {problem.in_channels})")
    if opts.k_batch != "auto" and not _is_int(opts.k_batch):
        raise PlanError(f"k-batch: {opts.k_batch!r} (the fp8 GEMM takes auto or a split count)")
    why = refusals(problem)
    if why:
        raise PlanError("fp8: " + "; ".join(why))
    splits = opts.k_batch if _is_int(opts.k_batch) else 0
    ktiles = -(-_reduction(problem) // BK)
    if splits and not 1 <= splits <= ktiles:
        raise PlanError(f"k-batch: {splits} (1 to the {ktiles} k tiles of the fp8 GEMM)")
    return _plan(problem, tgt.name, bn, splits)


def workspace_bytes(problem: Any, plan: Plan) -> int:
    """The K-major copies (dy^T, x^T: fp8, R padded), the maps buffer and a split's f32 partials; where R is
    padded, the padded copies before their transposes too (IREE materialises a tensor.pad: a fill and a copy);
    K-major inputs need copies only where R is padded. Checked against the transient IREE allocates
    (tests/test_fp8_plan.py)."""
    r = padded_reduction(problem, plan)

    def aligned(n: int) -> int:
        return -(-n // 256) * 256

    copies = (2 if r != _reduction(problem) else 1) - (problem.layout == K_MAJOR)
    total = copies * (aligned(problem.out_channels * r) + aligned(problem.in_channels * r)) + MAPS_BYTES
    if plan.k_batch > 1:
        total += plan.k_batch * problem.out_channels * problem.in_channels * 4
    return total


def tensor_maps(problem: Any, plan: Plan, kernel: str) -> list[dict[str, Any]]:
    """The GEMM's two CUtensorMaps (``cuda_launch.TensorMap`` fields) for dispatch ``kernel``, whose bindings are
    dy^T ``[K, R']`` (0), x^T ``[C, R']`` (1), the maps (2): tiled, bytes, box one 128-byte row by the tile's
    rows (bm for A, bn for B), 128-byte swizzle, L2 promotion 256 B."""
    r = padded_reduction(problem, plan)
    common = {"kernel": kernel, "maps_binding": 2, "mode": "tiled", "dtype": _TMA_UINT8, "strides": [r],
              "element_strides": [1, 1], "swizzle": 3, "l2_promotion": 3}  # fmt: skip
    return [
        {**common, "binding": 0, "slot": 0, "dims": [r, problem.out_channels], "box": [BK, plan.tile.m]},
        {**common, "binding": 1, "slot": 1, "dims": [r, problem.in_channels], "box": [BK, plan.tile.n]},
    ]
