"""convbw-relayout: compute a layout-1 problem (and a layout-3 convolution) in layout 2, the same dW, with x and
dy transposed.

    %dw = convbw.conv_bwd_weight(%x, %dy)   layout 1: x G x N x H x W x C, dy G x N x Ho x Wo x K, dW GKYXC
  ->
    %xt = linalg.transpose %x               N x H x W x G x C     (each copied, its own dispatch:
    %dt = linalg.transpose %dy              N x Ho x Wo x G x K    util.optimization_barrier)
    %dw = convbw.conv_bwd_weight(%xt, %dt)  layout 2 (NHWGC/GKYXC/NHWGK): dW and D as before

A layout-4 op (NGCHW/GKCYX/NGKHW) whose plan is ``channels_last`` (the plan's layout-4 rule on NVIDIA,
docs/decisions.md#layout4) becomes the layout-2 op the same way, D transposed to GKYXC before it and dW
transposed back to GKCYX after it, so the channels-last kernels compute it.

A G-less op (PyTorch's NCHW/KCYX/NKHW or NHWC/KYXC/NHWK, G = 1) is first its grouped twin's (layout 4 or 2) by
reshapes alone: x, dy and D gain a unit G (``tensor.expand_shape``), dW loses it (``tensor.collapse_shape``);
the same bytes take the same plan and no copy.

A 3-D op whose plan folds its rank (``fold_rank``: :func:`convbw_mlir.problem.fold_rank`, docs/decisions.md#rank-fold)
becomes its 2-D twin's op by reshapes alone, after the rewrites above: x, dy and D ``tensor.collapse_shape``d (depth
into the batch, or H and W into one axis), dW ``tensor.expand_shape``d back; no copy.

IREE 3.13's CUDA codegen read past the end of x or dy at the last group of layout 1 in every form it
was given, and computed two layout-3 convolutions wrongly in every form (docs/decisions.md#relayout);
layout 2 is the explicit kernel's and the layout the fenced fuzz found right. Which ops it rewrites is
the plan's rule (:func:`convbw_mlir.plan.relayout`), so the op's plan (decided for the layout-2 problem)
stays as it is. The barriers keep IREE from folding the transposes back into the contraction's loads.
"""

from __future__ import annotations

from dataclasses import replace

from convbw_mlir.dialects import convbw
from convbw_mlir.passes.framework import ConvbwPass, collect_ops, register

from convbw_mlir.builders import reassociation, transpose, unit_groups
from convbw_mlir.ir_imports import ir, tensor_d, util_d
from convbw_mlir.plan import PlanError, computed_problem, relayout

__all__ = ["Relayout"]


def _to(value: ir.Value, src: tuple[str, ...], dst: tuple[str, ...]) -> ir.Value:
    """``value`` (dimensions ``src``) transposed to the order ``dst``, behind an optimization barrier (``value``
    itself where the orders agree)."""
    if src == dst:
        return value
    moved = transpose(value, [src.index(d) for d in dst])
    return util_d.OptimizationBarrierOp([moved.type], [moved]).results[0]


def _unit_g(value: ir.Value, dims: tuple[str, ...], shape: tuple[int, ...], collapse: bool = False) -> ir.Value:
    """``value`` with its unit G (``dims``/``shape``: the grouped twin's) inserted, or with ``collapse`` removed:
    a reshape, no copy."""
    groups = reassociation(unit_groups([d != "G" for d in dims]))
    etype = ir.RankedTensorType(value.type).element_type
    if collapse:
        flat = ir.RankedTensorType.get([s for d, s in zip(dims, shape) if d != "G"], etype)
        return tensor_d.CollapseShapeOp(flat, value, groups).result
    return tensor_d.ExpandShapeOp(ir.RankedTensorType.get(list(shape), etype), value, groups, [], list(shape)).result


def _merged_groups(src: tuple[int, ...], dst: tuple[int, ...]) -> list[list[int]]:
    """Reassociation groups of ``src``'s dimensions whose products are ``dst``'s, in order (unit dimensions join
    the group after them, trailing ones the last group)."""
    groups: list[list[int]] = []
    i = 0
    for size in dst:
        group, prod = [], 1
        while i < len(src) and (prod != size or not group):
            group.append(i)
            prod *= src[i]
            i += 1
        groups.append(group)
    groups[-1].extend(range(i, len(src)))
    return groups


def _reshape(value: ir.Value, src: tuple[int, ...], dst: tuple[int, ...]) -> ir.Value:
    """``value`` (shape ``src``) collapsed, or expanded, to ``dst``: a reshape, no copy."""
    etype = ir.RankedTensorType(value.type).element_type
    out = ir.RankedTensorType.get(list(dst), etype)
    if len(dst) < len(src):
        return tensor_d.CollapseShapeOp(out, value, reassociation(_merged_groups(src, dst))).result
    return tensor_d.ExpandShapeOp(out, value, reassociation(_merged_groups(dst, src)), [], list(dst)).result


@register
class Relayout(ConvbwPass):
    argument = "convbw-relayout"
    description = (
        "Rewrite each layout-1 (GNHWC/GKYXC/GNHWK) convbw.conv_bwd_weight, and each layout-3 convolution, as the "
        "layout-2 (NHWGC/GKYXC/NHWGK) op on transposed x and dy (plan.relayout); dW, D and the plan stay. A plan's "
        "fold_rank: the 3-D op as its 2-D twin's by reshapes."
    )

    def run(self, module: ir.Operation) -> None:
        for op in collect_ops(module, convbw.OP_NAME):
            problem = convbw.verify_op(op)
            if problem is None:
                raise self.fail(op, "invalid convbw.conv_bwd_weight op")
            plan = convbw.plan_of(op)
            try:
                target = computed_problem(problem, plan) if plan is not None else relayout(problem)
                folded = target if plan is not None and plan.fold_rank else None
                if folded is not None:  # the layout rewrites first, to the problem the twin's reshapes start from
                    target = computed_problem(problem, replace(plan, fold_rank=False))
            except PlanError as e:
                raise self.fail(op, str(e)) from None
            if target == problem and folded is None:
                continue
            attrs = op.attributes
            plan_attr = attrs[convbw.PLAN_ATTR] if convbw.PLAN_ATTR in attrs else None
            d = op.operands[2] if len(op.operands) > 2 else None  # in dW's layout
            twin = problem.grouped()  # a G-less problem's grouped twin (the same bytes), else itself
            operands = [op.operands[0], op.operands[1], d]
            w, w_target = twin.dims("dw"), target.dims("dw")
            with ir.InsertionPoint(op), op.location:
                if twin != problem:  # x, dy and D gain their unit G
                    operands = [v if v is None else _unit_g(v, twin.dims(t), twin.shape(t))
                                for v, t in zip(operands, ("x", "dy", "dw"))]  # fmt: skip
                x = _to(operands[0], twin.dims("x"), target.dims("x"))
                dy = _to(operands[1], twin.dims("dy"), target.dims("dy"))
                d = operands[2] if operands[2] is None else _to(operands[2], w, w_target)
                if folded is not None:  # the 2-D twin's x, dy and D
                    x, dy = _reshape(x, target.x_shape, folded.x_shape), _reshape(dy, target.dy_shape, folded.dy_shape)
                    d = d if d is None else _reshape(d, target.dw_shape, folded.dw_shape)
                new = convbw.build_op(folded or target, x, dy, op.location, convbw.split_of(op), plan_attr, d).result
                if folded is not None:  # dW back to the 3-D problem's shape
                    new = _reshape(new, folded.dw_shape, target.dw_shape)
                if w != w_target:  # layout 4: dW back to GKCYX (never a split op: plan._layout4)
                    new = transpose(new, [w_target.index(dim) for dim in w])
                if twin != problem:  # dW loses its unit G
                    new = _unit_g(new, w, twin.shape("dw"), collapse=True)
            op.results[0].replace_all_uses_with(new)
            op.erase()
