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

__all__ = ["EXPLICIT_SPLIT", "check", "explicit_split", "split_refusals"]

# The explicit kernel splits its flattened reduction (images x output positions) in k tiles: Split.chunk
# counts k tiles per split.
EXPLICIT_SPLIT = "r"


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
