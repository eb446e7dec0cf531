"""convbw-tile: record each contraction's strategy and tile, from its plan, as ``convbw.tile`` on the
``linalg.generic`` (the form ``convbw-map-mma`` and the ISA report read).

The strategies (:class:`convbw_mlir.plan.Strategy`, decided by :func:`convbw_mlir.plan.decide`):
  * ``mma``: a workgroup tile of M (out channels) x N (in channels) for one group and filter tap, a
    reduction step, a subgroup layout and prefetch stages;
  * ``simt``: no matrix instructions; over a rows split a thread per (image, output row, group, out
    channel) with the workgroup's ``rows``, ``groups`` and ``channels``, otherwise IREE's own
    reduction codegen;
  * ``iree``: IREE's own configuration.
"""

from __future__ import annotations

from dataclasses import fields

from convbw_mlir.passes.framework import ConvbwPass, register

from convbw_mlir.contraction import contractions, read_contraction
from convbw_mlir.ir_imports import ir
from convbw_mlir.loops import Contraction
from convbw_mlir.plan import Plan, PlanError, SimtTile, Strategy, Tile

__all__ = ["TILE_ATTR", "TilePass", "plan_of_contraction", "read_tile"]

TILE_ATTR = "convbw.tile"


def read_tile(op: ir.Operation) -> tuple[str, Tile | SimtTile | None]:
    """(strategy, tile) recorded by this pass: a Tile for mma, a SimtTile for simt over a rows split."""
    attr = op.attributes[TILE_ATTR]
    strategy = ir.StringAttr(attr["strategy"]).value
    if strategy == "simt" and "rows" in attr:
        return strategy, SimtTile(**{f.name: ir.IntegerAttr(attr[f.name]).value for f in fields(SimtTile)})
    if strategy != "mma":
        return strategy, None
    ints = {f.name: ir.IntegerAttr(attr[f.name]).value for f in fields(Tile) if f.name != "intrinsic"}
    return strategy, Tile(**ints, intrinsic=ir.StringAttr(attr["intrinsic"]).value)


def plan_of_contraction(contraction: Contraction) -> Plan:
    """The plan a contraction carries.

    Raises:
        PlanError: none (the op was lowered without a plan) or a malformed one.
    """
    if contraction.plan is None:
        raise PlanError("the contraction has no plan; run convbw-plan before convbw-lower-to-linalg")
    return Plan.from_dict(contraction.plan)


@register
class TilePass(ConvbwPass):
    argument = "convbw-tile"
    description = (
        "Record each contraction's GPU strategy (mma, simt, iree) and tile from its plan as convbw.tile "
        "(run convbw-plan{target=...} first)."
    )

    def run(self, module: ir.Operation) -> None:
        i64 = ir.IntegerType.get_signless(64)
        for op in contractions(module):
            try:
                plan = plan_of_contraction(read_contraction(op))
            except PlanError as e:
                raise self.fail(op, str(e)) from None
            if not plan.target_info.is_gpu:
                raise self.fail(op, f"the plan is for {plan.target}, not a GPU target")
            entries = {"strategy": ir.StringAttr.get(plan.strategy.value)}
            if plan.strategy is Strategy.SIMT and plan.simt is not None:
                entries |= {f.name: ir.IntegerAttr.get(i64, getattr(plan.simt, f.name)) for f in fields(SimtTile)}
            elif plan.strategy is Strategy.MMA:
                entries["intrinsic"] = ir.StringAttr.get(plan.tile.intrinsic)
                for f in fields(Tile):
                    if f.name != "intrinsic":
                        entries[f.name] = ir.IntegerAttr.get(i64, getattr(plan.tile, f.name))
            op.attributes[TILE_ATTR] = ir.DictAttr.get(entries)
