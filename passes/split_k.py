"""convbw-split-k{k-batch=auto|<n> plan-for=<target>}: split the long reduction into a two-stage computation.

    %dw = convbw.conv_bwd_weight(%x, %dy)
  ->
    %p  = convbw.conv_bwd_weight(%x, %dy) {k_batch = 4, split_dim = "n", split_chunk = 8}
            : ... -> tensor<4 x G x K x F... x C x f32>          stage 1: f32 partial sums
    %s  = linalg.generic (reduce the leading k_batch dimension)  stage 2: sum in f32,
    %dw = truncf + transpose to dW's type and layout                     then convert (CK's TwoStage)

The reduction N * prod(output) is split along the batch (:func:`convbw_mlir.heuristics.plan_split`
says why not into chunks of output rows); an uneven split pads the last chunk with zero images, so no
work is ever dropped. A batch of 1 is not split. ``auto`` follows CK's occupancy rule
(:func:`convbw_mlir.heuristics.auto_k_batch`) for ``plan-for``; k_batch = 1 leaves the op alone.

``rows`` makes the batch and the first output loop parallel whole: one partial sum per image and
output row, with no reshape (:func:`convbw_mlir.heuristics.plan_rows_split`; left alone where it does
not apply). ``auto`` picks it on GPU targets for problems too thin for matrix cores (the SIMT strategy
of ``convbw-tile``) whose threads can hold a dW row (:func:`convbw_mlir.heuristics.simt_threads_fit`)
and whose partial sums stay small against the inputs (:func:`convbw_mlir.heuristics.rows_split_pays`),
where it measured fastest, and the batch split elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass

from convbw_mlir.dialects import convbw
from convbw_mlir.passes.framework import ConvbwPass, collect_ops, option, register
from convbw_mlir.passes.lower_to_linalg import PARALLEL, REDUCTION, as_value, finish_dw

from convbw_mlir.heuristics import plan_split_k
from convbw_mlir.ir_imports import arith_d, ir, linalg_d, tensor_d
from convbw_mlir.targets import TARGETS

__all__ = ["SplitK", "reduce_partials"]


def reduce_partials(partials: ir.Value) -> ir.Value:
    """Sum f32 partials ``[k_batch, ...]`` over the leading dimension (stage 2), in f32."""
    ptype = partials.type
    shape = list(ptype.shape[1:])
    f32 = ir.F32Type.get()
    empty = tensor_d.EmptyOp(shape, f32)
    zero = arith_d.ConstantOp(f32, ir.FloatAttr.get(f32, 0.0))
    init = as_value(linalg_d.fill(zero.result, outs=[empty.result]))
    rank = len(shape)
    # Loops (d0..d{rank-1} = the result, d{rank} = the split), reduction last as linalg prefers.
    dims = [ir.AffineDimExpr.get(i) for i in range(rank + 1)]
    in_map = ir.AffineMap.get(rank + 1, 0, [dims[rank], *dims[:rank]])
    out_map = ir.AffineMap.get(rank + 1, 0, dims[:rank])
    op = linalg_d.GenericOp(
        [ir.RankedTensorType.get(shape, f32)], [partials], [init],
        ir.ArrayAttr.get([ir.AffineMapAttr.get(in_map), ir.AffineMapAttr.get(out_map)]),
        ir.ArrayAttr.get([ir.Attribute.parse(PARALLEL)] * rank + [ir.Attribute.parse(REDUCTION)]),
    )  # fmt: skip
    block = op.regions[0].blocks.append(f32, f32)
    with ir.InsertionPoint(block):
        linalg_d.YieldOp([arith_d.AddFOp(block.arguments[1], block.arguments[0]).result])
    return op.result


@register
class SplitK(ConvbwPass):
    argument = "convbw-split-k"
    description = (
        "Split the reduction N*prod(output) of each convbw.conv_bwd_weight into k-batch f32 partial sums "
        "(stage 1, the op with k_batch) and a reduction plus conversion to dW's type and layout (stage 2). "
        "Uneven splits pad the last chunk with zeros; rows gives each image's each output row a partial; "
        "auto picks rows for thin problems on GPUs, else CK's occupancy rule for the target."
    )

    @dataclass
    class Options:
        k_batch: int | str = option(
            "auto", "number of batch splits, rows (one partial per image and output row), or auto", ("auto", "rows")
        )
        plan_for: str = option("host", "target whose CU count and tiles auto plans for", tuple(TARGETS))

    def __init__(self, options=None, **kwargs) -> None:
        super().__init__(options, **kwargs)
        kb, tgt = self.options.k_batch, self.options.plan_for
        if not (kb in ("auto", "rows") or (isinstance(kb, int) and not isinstance(kb, bool) and kb >= 1)):
            raise ValueError(f"k-batch: expected auto, rows or a positive integer, got {kb!r}")
        if tgt not in TARGETS:
            raise ValueError(f"plan-for: unknown target {tgt!r}; known: {', '.join(TARGETS)}")

    def run(self, module: ir.Operation) -> None:
        target = TARGETS[self.options.plan_for]
        for op in collect_ops(module, convbw.OP_NAME):
            problem = convbw.verify_op(op)
            if problem is None:
                raise self.fail(op, "invalid convbw.conv_bwd_weight op")
            if convbw.split_of(op):
                continue  # already split
            split = plan_split_k(problem, target, self.options.k_batch)
            if split is None:
                continue
            with ir.InsertionPoint(op), op.location:
                partial = convbw.build_op(problem, op.operands[0], op.operands[1], op.location, split)
                dw = finish_dw(problem, reduce_partials(partial.result))
            op.results[0].replace_all_uses_with(dw)
            op.erase()
