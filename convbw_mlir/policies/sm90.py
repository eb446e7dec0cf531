"""The policy of the sm_90a weight-gradient kernel (``convbw_mlir/kernels/conv_sm90.py``): which problems it
takes and why not, its tiling and its split rule (pure Python, no MLIR).

Not yet asked by the plan: ``compile_op(target="sm_90a")`` still plans the sm_80 kernels or codegen (the
kernel's tensor maps are encoded by the launcher, which only bench/hopper_conv.py does so far).
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["BK", "BM", "BN", "SMS", "auto_splits", "choose", "cost", "flops", "refusals"]

BM, BN, BK = 128, 256, 64  # the GEMM's recipe tile (2 consumer warpgroups of m64n256k16; 64 channels a box)
SMS = 132  # H100 SXM's SMs; one workgroup an SM (4 stages of 48 KiB)
# The rule's model, fitted (least squares on log time) to 33 timings of the rule's choices and of other
# splits and tile widths on an H100 (bench/results/h100_2026-11-26_hopper_conv, runs 1 and 2; within ~10%
# but for the narrowest tiles): a 128x256x64 k tile takes 0.67 us an SM (large_3x3_256_n64_56: 786 TFLOP/s);
# a narrower tile 0.87 (bn 192) or 0.6 (bn 128) of that; a split's f32 partials go out and back in at
# ~3 TB/s, the sum's dispatch hidden; a workgroup pays ~8 k tiles of fill, barrier set-up and epilogue.
KTILE_US = 0.67
TILE_COST = {256: 1.0, 192: 0.87, 128: 0.6}  # a k tile's time by bn, relative to bn = 256
BYTES_PER_US = 3.0e6
SUM_US = 0.0
FILL_TILES = 8
MAX_SPLITS = 32


def refusals(problem: Any) -> list[str]:
    """Why the sm_90a kernel cannot compute ``problem`` ("field: value (why)" lines; empty: it can)."""
    why = []
    fam = problem.layout_family
    if (fam.x, fam.w) != ("NHWGC", "GKYXC"):
        why.append(f"layout: {problem.layout} (the sm_90a kernel takes layout 2, NHWGC/GKYXC/NHWGK)")
    if problem.rank != 2:
        why.append(f"rank: {problem.rank} (the sm_90a kernel's im2col map is 2-D)")
    if problem.dtype not in ("f16", "bf16"):
        why.append(f"dtype: {problem.dtype} (f16 or bf16)")
    elif problem.dw_dtype not in ("f32", problem.dtype):
        why.append(f"dw_dtype: {problem.dw_dtype} (f32 or {problem.dtype}, the input type)")
    if problem.in_channels % 64:
        why.append(f"in_channels: {problem.in_channels} (a group's: a multiple of 64, an im2col box of 64 channels)")
    if problem.out_channels % 8:
        why.append(f"out_channels: {problem.out_channels} (a group's: a multiple of 8, dy's 16-byte TMA rows)")
    if problem.epilogue is not None:
        why.append(f"epilogue: {problem.epilogue.kind} (the sm_90a kernel writes dW plain)")
    return why


def cost(m: int, n: int, reduction: int, bn: int, splits: int, sms: int = SMS, groups: int = 1) -> float:
    """Estimated us of ``groups`` ``m x n`` dWs reducing over ``reduction`` rows with tile ``128 x bn`` and
    ``splits`` slices: whole waves of ``sms`` workgroups, each its slice's k tiles plus the fill, and a
    split's partials' round trip and its sum's dispatch."""
    tiles = groups * -(-m // BM) * -(-n // bn)
    ktiles = -(-reduction // BK)
    waves = -(-tiles * splits // sms)
    us = waves * (-(-ktiles // splits) + FILL_TILES) * KTILE_US * TILE_COST[bn]
    return us + (2 * splits * groups * m * n * 4 / BYTES_PER_US + SUM_US if splits > 1 else 0.0)


def choose(m: int, n: int, reduction: int, sms: int = SMS, groups: int = 1) -> tuple[int, int]:
    """The tile width and split count ``(bn, splits)`` of least :func:`cost`, each slice at least 8 k tiles
    (CK's k_batch rule of thumb, re-weighed for whole waves) and none empty; the wider tile, then the fewer
    splits, on a tie."""
    ktiles = -(-reduction // BK)
    options = [(bn, s) for bn in TILE_COST for s in range(1, MAX_SPLITS + 1)
               if (s == 1 or ktiles // s >= 8) and (s - 1) * -(-ktiles // s) < ktiles]  # fmt: skip
    return min(options, key=lambda o: (round(cost(m, n, reduction, *o, sms, groups), 1), -o[0], o[1]))


def auto_splits(m: int, n: int, reduction: int, sms: int = SMS, groups: int = 1) -> int:
    """The split count of :func:`choose`."""
    return choose(m, n, reduction, sms, groups)[1]


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
