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

IREE 3.13's CUDA codegen read past the end of x or dy at the last group of layout 1 in every form it
was given, and computed two layout-3 convolutions wrongly in every form (docs/decisions.md#relayout);
layout 2 is the explicit kernel's and the layout the fenced fuzz found right. Which ops it rewrites is
the plan's rule (:func:`convbw_mlir.plan.relayout`), so the op's plan (decided for the layout-2 problem)
stays as it is. The barriers keep IREE from folding the transposes back into the contraction's loads.
"""

from __future__ import annotations

from convbw_mlir.dialects import convbw
from convbw_mlir.passes.framework import ConvbwPass, collect_ops, register

from convbw_mlir.builders import transpose
from convbw_mlir.ir_imports import ir, util_d
from convbw_mlir.plan import PlanError, computed_problem, relayout

__all__ = ["Relayout"]


def _to(value: ir.Value, src: tuple[str, ...], dst: tuple[str, ...]) -> ir.Value:
    """``value`` (dimensions ``src``) transposed to the order ``dst``, behind an optimization barrier."""
    moved = transpose(value, [src.index(d) for d in dst])
    return util_d.OptimizationBarrierOp([moved.type], [moved]).results[0]


@register
class Relayout(ConvbwPass):
    argument = "convbw-relayout"
    description = (
        "Rewrite each layout-1 (GNHWC/GKYXC/GNHWK) convbw.conv_bwd_weight, and each layout-3 convolution, as the "
        "layout-2 (NHWGC/GKYXC/NHWGK) op on transposed x and dy (plan.relayout); dW, D and the plan stay."
    )

    def run(self, module: ir.Operation) -> None:
        for op in collect_ops(module, convbw.OP_NAME):
            problem = convbw.verify_op(op)
            if problem is None:
                raise self.fail(op, "invalid convbw.conv_bwd_weight op")
            plan = convbw.plan_of(op)
            try:
                target = computed_problem(problem, plan) if plan is not None else relayout(problem)
            except PlanError as e:
                raise self.fail(op, str(e)) from None
            if target == problem:
                continue
            attrs = op.attributes
            plan_attr = attrs[convbw.PLAN_ATTR] if convbw.PLAN_ATTR in attrs else None
            d = op.operands[2] if len(op.operands) > 2 else None  # in dW's layout
            w, w_target = problem.dims("dw"), target.dims("dw")
            with ir.InsertionPoint(op), op.location:
                x = _to(op.operands[0], problem.dims("x"), target.dims("x"))
                dy = _to(op.operands[1], problem.dims("dy"), target.dims("dy"))
                if d is not None and w != w_target:
                    d = _to(d, w, w_target)
                new = convbw.build_op(target, x, dy, op.location, convbw.split_of(op), plan_attr, d).result
                if w != w_target:  # layout 4: dW back to GKCYX (never a split op: plan._layout4)
                    new = transpose(new, [w_target.index(dim) for dim in w])
            op.results[0].replace_all_uses_with(new)
            op.erase()
