"""The policy of the sm_90a weight-gradient kernel (``convbw_mlir/kernels/conv_sm90.py``): which problems it
takes and why not, its tiling and its split rule (pure Python, no MLIR).

Not yet asked by the plan: ``compile_op(target="sm_90a")`` still plans the sm_80 kernels or codegen (the
kernel's tensor maps are encoded by the launcher, which only bench/hopper_conv.py does so far).
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["BK", "BM", "BN", "SMS", "auto_splits", "refusals"]

BM, BN, BK = 128, 256, 64  # the GEMM's recipe tile (2 consumer warpgroups of m64n256k16; 64 channels a box)
SMS = 132  # H100 SXM's SMs; one workgroup an SM (4 stages of 48 KiB)
# The split rule's model (H100 SXM datasheet: 989 TFLOP/s dense f16 on 132 SMs, 3.35 TB/s): one 128x256x64
# k tile ~0.56 us an SM at full rate; a split's f32 partials go out and back in at ~3 TB/s; the stage-2 sum
# is a second dispatch (~3 us); each workgroup pays ~2 k tiles of pipeline fill and epilogue.
KTILE_US = 2 * BM * BN * BK / (989e12 / SMS) * 1e6
BYTES_PER_US = 3.0e6
SUM_US = 3.0
FILL_TILES = 2
MAX_SPLITS = 32


def refusals(problem: Any) -> list[str]:
    """Why the sm_90a kernel cannot compute ``problem`` ("field: value (why)" lines; empty: it can)."""
    why = []
    fam = problem.layout_family
    if (fam.x, fam.w) != ("NHWGC", "GKYXC"):
        why.append(f"layout: {problem.layout} (the sm_90a kernel takes layout 2, NHWGC/GKYXC/NHWGK)")
    if problem.rank != 2:
        why.append(f"rank: {problem.rank} (the sm_90a kernel's im2col map is 2-D)")
    if problem.groups != 1:
        why.append(f"groups: {problem.groups} (the sm_90a kernel takes one group)")
    if problem.dtype not in ("f16", "bf16"):
        why.append(f"dtype: {problem.dtype} (f16 or bf16)")
    elif problem.dw_dtype not in ("f32", problem.dtype):
        why.append(f"dw_dtype: {problem.dw_dtype} (f32 or {problem.dtype}, the input type)")
    if problem.in_channels % 64:
        why.append(f"in_channels: {problem.in_channels} (a multiple of 64: an im2col box of 64 channels)")
    if problem.out_channels % 8:
        why.append(f"out_channels: {problem.out_channels} (a multiple of 8: dy's rows, 16-byte TMA strides)")
    if problem.epilogue is not None:
        why.append(f"epilogue: {problem.epilogue.kind} (the sm_90a kernel writes dW plain)")
    return why


def auto_splits(m: int, n: int, reduction: int, sms: int = SMS) -> int:
    """Split-K slices for an ``m x n`` dW reducing over ``reduction`` rows: the count of the estimated
    fastest (waves of ``sms`` workgroups, each its slice's k tiles plus the fill; split partials' round
    trip and the sum's dispatch), each slice at least 8 k tiles (CK's k_batch rule of thumb, re-weighed
    for whole waves)."""
    tiles = -(-m // BM) * -(-n // BN)
    ktiles = -(-reduction // BK)

    def cost(s: int) -> float:
        waves = -(-tiles * s // sms)
        us = waves * (-(-ktiles // s) + FILL_TILES) * KTILE_US
        return us + (2 * s * m * n * 4 / BYTES_PER_US + SUM_US if s > 1 else 0.0)

    options = [s for s in range(1, MAX_SPLITS + 1) if s == 1 or ktiles // s >= 8]
    options = [s for s in options if (s - 1) * -(-ktiles // s) < ktiles]  # no empty last slice
    return min(options, key=lambda s: (cost(s), s))


def flops(problem: Any) -> int:
    return (
        2
        * problem.groups
        * problem.out_channels
        * problem.in_channels
        * math.prod(problem.filter_size)
        * (problem.batch * math.prod(problem.output_size))
    )
