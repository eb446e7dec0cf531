"""The split rule every explicit kernel of ours shares: split-K over the flattened reduction (images x output
positions) in k tiles, as many splits as asked or as the family's occupancy rule gives, and its refusals."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from convbw_mlir.loops import Split
from convbw_mlir.plan_data import Overrides, Plan, PlanError, _is_int
from convbw_mlir.problem import ConvBwdWeightProblem
from convbw_mlir.targets import Target

__all__ = ["EXPLICIT_SPLIT", "OWN_SUM_TILE", "check", "explicit_split", "split_refusals", "sum_tile"]

# The explicit kernel splits its flattened reduction (images x output positions) in k tiles: Split.chunk
# counts k tiles per split.
EXPLICIT_SPLIT = "r"
# The split sum (stage 2) on NVIDIA with a workgroup tile of ours where IREE's own is scalar: IREE 3.13 tiles it
# 32 threads x 4 f32 only where the outputs are a multiple of 128, else 32 x 1 (4-byte loads, 0.5 TB/s on an H100
# at 888x888; docs/decisions.md#short-reduction-dense item 2).
OWN_SUM_TILE = True
# The most threads a workgroup of the split sum: 8 warps (IREE's own takes 1).
SUM_THREADS = 256


def explicit_split(problem: ConvBwdWeightProblem, plan: Plan, shape: Any, tiling: Any, tgt: Target, opts: Overrides,
                   auto_splits: Any, refusals: Any) -> Plan:  # fmt: skip
    """``plan`` with its split-K: the k-batch asked for, else the family's occupancy rule (``auto_splits``);
    checked by the family's ``refusals``."""
    splits = opts.k_batch if _is_int(opts.k_batch) else auto_splits(shape, tiling, tgt.compute_units)
    if splits > 1:
        ktiles = -(-shape.reduction // tiling.bk)
        plan = replace(plan, split=Split(EXPLICIT_SPLIT, splits, -(-ktiles // splits)))
        check(problem, plan, refusals)
    return plan


def split_refusals(problem: ConvBwdWeightProblem, plan: Plan) -> list[str]:
    """Why an explicit plan's split cannot be carried out ("field: value" lines)."""
    if plan.split is None or plan.tile is None:
        return []
    ktiles = -(-math.prod((problem.batch, *problem.output_size)) // plan.tile.k)
    if plan.split.dim != EXPLICIT_SPLIT or plan.split.k_batch > ktiles:
        return [f"split: {plan.split.dim} x {plan.split.k_batch} (the explicit kernel splits its "
                f"reduction, {EXPLICIT_SPLIT}, at most in its {ktiles} k tiles)"]  # fmt: skip
    if plan.split.chunk != -(-ktiles // plan.split.k_batch):
        return [f"split: chunk {plan.split.chunk} (k tiles a split: {-(-ktiles // plan.split.k_batch)})"]
    return []


def check(problem: ConvBwdWeightProblem, plan: Plan, refusals: Any) -> None:
    """Raise :class:`PlanError` with every reason ``refusals(problem, plan)`` gives, if any."""
    why = refusals(problem, plan)
    if why:
        raise PlanError("strategy explicit: " + "; ".join(why))


def sum_tile(outputs: int, units: int) -> tuple[int, int] | None:
    """``(threads, elements a thread)`` of the split sum's workgroup over ``outputs`` flat outputs on a GPU of
    ``units`` SMs, or None where IREE's own tile is kept (a multiple of 128: 32 x 4, measured 2 TB/s; or no tile
    below fits).

    A thread sums 4 (else 2) adjacent f32 of each split (one 16- or 8-byte load a split); the workgroup's tile must
    divide ``outputs`` (IREE 3.13 scalarises a partial tile) and leave a workgroup an SM at least (fewer leave SMs
    idle: IREE's 32-wide tiles then spread further); of 32-256 threads, the fewest idle lanes in the last warp, then
    the most threads.
    """
    if not OWN_SUM_TILE or outputs % 128 == 0:
        return None
    width = next((w for w in (4, 2) if outputs % w == 0), None)
    if width is None:
        return None
    tiles = outputs // width
    fits = [t for t in range(32, SUM_THREADS + 1) if tiles % t == 0 and tiles // t >= units]
    if not fits:
        return None
    return max(fits, key=lambda t: (t / (32 * -(-t // 32)), t)), width
