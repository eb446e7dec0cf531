"""convbw-split-k: carry out the plan's split of the long reduction as a two-stage computation.

    %dw = convbw.conv_bwd_weight(%x, %dy) {plan = {split = {k_batch = 4, dim = "n", chunk = 8}, ...}}
  ->
    %p  = convbw.conv_bwd_weight(%x, %dy) {k_batch = 4, split_dim = "n", split_chunk = 8, plan = ...}
            : ... -> tensor<4 x G x K x F... x C x f32>          stage 1: f32 partial sums
    %s  = linalg.generic (reduce the leading k_batch dimension)  stage 2: sum in f32,
    %dw = truncf + transpose to dW's type and layout                     then convert (CK's TwoStage)

An epilogue stays off stage 1 (it would apply once per split) and lands in stage 2's write: the reduced
f32 sum goes through ``alpha * sum + beta * D`` in the generic that converts it (builders.finish_dw).

The split is the plan's (``convbw-plan{k-batch=...}``; :func:`convbw_mlir.plan.plan_split_k` says how
it is chosen): chunks of the batch, where an uneven split pads the last chunk with zero images so no
work is ever dropped, or a *rows* split (one partial sum per image and output row: the batch and the
first output loop made parallel, nothing reshaped). An op without a split in its plan is left alone.
"""

from __future__ import annotations

from convbw_mlir.dialects import convbw
from convbw_mlir.passes.framework import ConvbwPass, collect_ops, register

from convbw_mlir.builders import finish_dw, reduce_partials
from convbw_mlir.ir_imports import ir
from convbw_mlir.loops import check_split

__all__ = ["SplitK"]


@register
class SplitK(ConvbwPass):
    argument = "convbw-split-k"
    description = (
        "Carry out the plan's split-K: the op becomes its first stage yielding k_batch f32 partial sums and a "
        "second stage that reduces them and converts to dW's type and layout (run convbw-plan first)."
    )

    def run(self, module: ir.Operation) -> None:
        for op in collect_ops(module, convbw.OP_NAME):
            problem = convbw.verify_op(op)
            if problem is None:
                raise self.fail(op, "invalid convbw.conv_bwd_weight op")
            if convbw.split_of(op):
                continue  # already split
            plan = convbw.plan_of(op)
            if plan is None:
                raise self.fail(op, "the op has no plan; run convbw-plan first (e.g. convbw-plan{k-batch=4})")
            if plan.split is None:
                continue
            try:
                check_split(problem, plan.split)
            except ValueError as e:
                raise self.fail(op, f"the plan's split does not fit this op: {e}") from None
            with ir.InsertionPoint(op), op.location:
                plan_attr = op.attributes[convbw.PLAN_ATTR]
                partial = convbw.build_op(problem, op.operands[0], op.operands[1], op.location, plan.split, plan_attr)
                d = op.operands[2] if len(op.operands) > 2 else None  # the epilogue's D, read by stage 2
                dw = finish_dw(problem, reduce_partials(partial.result), d)
            op.results[0].replace_all_uses_with(dw)
            op.erase()
