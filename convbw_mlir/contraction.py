"""The contraction in the IR: the ``convbw.contraction`` attribute that ``convbw-lower-to-linalg`` puts on the
one ``linalg.generic`` a convbw op lowers to (its problem, loops, ``k_batch`` and plan), and the reading of it
back (``convbw-tile``, ``convbw-map-mma``). The loops themselves: :mod:`convbw_mlir.loops`.
"""

from __future__ import annotations

from typing import Any

from convbw_mlir.dialects import convbw
from convbw_mlir.ir_imports import ir
from convbw_mlir.loops import Contraction, Split

__all__ = ["CONTRACTION_ATTR", "contraction_attr", "contractions", "read_contraction"]

CONTRACTION_ATTR = "convbw.contraction"


def contraction_attr(c: Contraction) -> ir.Attribute:
    """``convbw.contraction``: the problem, its loops (names and extents, in order), ``k_batch`` and
    the plan."""
    i64 = ir.IntegerType.get_signless(64)
    entries = {
        "problem": convbw.problem_attr(c.problem),
        "loops": ir.ArrayAttr.get([ir.StringAttr.get(n) for n in c.names]),
        "extents": ir.DenseI64ArrayAttr.get(c.extents),
        "k_batch": ir.IntegerAttr.get(i64, c.split.k_batch if c.split else 1),
    }
    if c.plan is not None:
        entries["plan"] = convbw.dict_attr(c.plan)
    return ir.DictAttr.get(entries)


def read_contraction(op: Any) -> Contraction:
    """Read the contraction of a ``linalg.generic`` marked by ``convbw-lower-to-linalg``.

    Raises:
        KeyError: the op is not such a contraction.
    """
    attrs = op.operation.attributes
    if CONTRACTION_ATTR not in attrs:
        raise KeyError(f"{op.operation.name} carries no {CONTRACTION_ATTR}")
    attr = attrs[CONTRACTION_ATTR]
    names = [ir.StringAttr(a).value for a in attr["loops"]]
    extents = list(ir.DenseI64ArrayAttr(attr["extents"]))
    iterators = [str(it) for it in attrs["iterator_types"]]
    n_parallel = sum("parallel" in it for it in iterators)
    plan = convbw.dict_from_attr(attr["plan"]) if "plan" in attr else None
    split = None
    if plan is not None and plan.get("split"):
        split = Split(**plan["split"])
    return Contraction(convbw.problem_from_attr(attr["problem"]), split, tuple(zip(names, extents)), n_parallel, plan)


def contractions(module: Any) -> list[Any]:
    """The linalg.generic ops under ``module`` built by ``convbw-lower-to-linalg``."""
    found: list[Any] = []

    def visit(op: Any) -> Any:
        if op.name == "linalg.generic" and CONTRACTION_ATTR in op.attributes:
            found.append(op.operation)
        return ir.WalkResult.ADVANCE

    module.walk(visit)
    return found
