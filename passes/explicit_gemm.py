"""convbw-explicit-gemm: a 1x1 filter is a batched GEMM; say so in the IR.

    %dw = convbw.conv_bwd_weight(%x, %dy)   x: N x H x W x G x C, filter 1 x 1, stride 1, pad 0
  ->
    %x1 = tensor.collapse_shape %x          N x (H*W) x G x C       (spatial dims are adjacent in
    %d1 = tensor.collapse_shape %dy         N x (H*W) x G x K        every layout family)
    %w1 = convbw.conv_bwd_weight(%x1, %d1)  the 1-D, filter-1 problem: G x K x 1 x C
    %dw = tensor.expand_shape %w1           G x K x 1 x 1 x C

A strided or padded 1x1 reads x only at o * stride - pad_low, and only some output positions read x
inside the image; those dy rows and that x window (each copied by a linalg.generic) are its GEMM
operands, so it becomes the stride-1, unpadded case. No im2col (CK's "explicit GEMM" for 1x1 bwd-weight).
Lowered, the 1-D op has no filter loop and an identity x map: a batched GEMM over groups with M = K,
N = C and the reduction N * prod(output), which IREE compiles as a contraction rather than a convolution.

The contraction it lowers to is a GEMM, given to IREE dy first (``convbw-lower-to-linalg``,
:func:`convbw_mlir.passes.lower_to_linalg.dy_first` says why). Which ops it rewrites is the plan's
decision (:func:`convbw_mlir.plan.as_gemm`); an op without a plan is rewritten by the same rule.
"""

from __future__ import annotations

from convbw_mlir.dialects import convbw
from convbw_mlir.passes.framework import ConvbwPass, collect_ops, register

from convbw_mlir.builders import PARALLEL, generic, reassociation, transpose
from convbw_mlir.ir_imports import ir, tensor_d, util_d
from convbw_mlir.plan import as_gemm, effective_problem, one_tap_window
from convbw_mlir.problem import ConvBwdWeightProblem

__all__ = ["ExplicitGemm", "window"]


def window(problem: ConvBwdWeightProblem, x: ir.Value, dy: ir.Value) -> tuple[ConvBwdWeightProblem, ir.Value, ir.Value]:
    """The x and dy a 1x1 reads inside the image (:func:`convbw_mlir.plan.one_tap_window`), each copied by a
    linalg.generic where it is not the whole tensor: x at ``(first + o) * stride - pad_low``, dy at
    ``first + o``; the problem of that window (stride 1, no padding). Unchanged for stride 1 and no padding.

    A copy of its own, not a strided tensor.extract_slice: IREE 3.13 fuses such a slice into the GEMM's
    loads, and that kernel gave wrong dW (docs/decisions.md#strided-1x1). A util.optimization_barrier keeps
    IREE from fusing it back.
    """
    spans = one_tap_window(problem)
    counts = tuple(count for _, count in spans)
    unit = problem.with_(input_size=counts, stride=1, dilation=1, pad_low=0, pad_high=0)
    x_start = [first * s - lo for (first, _), s, lo in zip(spans, problem.stride, problem.pad_low)]
    if any(s != 1 for s in problem.stride) or any(x_start) or counts != problem.input_size:
        x = _copy(x, problem.dims("x"), unit, "x", problem.stride, x_start)
    if counts != problem.output_size:
        dy = _copy(dy, problem.dims("dy"), unit, "dy", (1,) * problem.rank, [first for first, _ in spans])
    return unit, x, dy


def _copy(value: ir.Value, dims: tuple[str, ...], unit: ConvBwdWeightProblem, tensor: str,
          stride: tuple[int, ...], start: list[int]) -> ir.Value:  # fmt: skip
    """``value`` at ``o * stride + start`` in each spatial dimension, as ``unit``'s ``tensor``, kept its own dispatch.

    The rows from ``start`` on are sliced off first (a plain offset), so that the copy's map is ``o * stride``
    and linalg infers its loops from the output wherever the stride is 1.
    """
    spatial = [d for d in dims if d in "DHW"]
    out_t = convbw.tensor_type(unit, tensor)
    shape, offsets = list(value.type.shape), [0] * len(dims)
    for i, d in enumerate(dims):
        if d in spatial:
            k = spatial.index(d)
            offsets[i], shape[i] = start[k], (out_t.shape[i] - 1) * stride[k] + 1
    ones = [1] * len(dims)
    sliced_t = ir.RankedTensorType.get(shape, out_t.element_type)
    value = tensor_d.ExtractSliceOp(sliced_t, value, [], [], [], offsets, shape, ones).result
    loops = [ir.AffineDimExpr.get(i) for i in range(len(dims))]
    src = [loops[i] * stride[spatial.index(d)] if d in spatial else loops[i] for i, d in enumerate(dims)]
    maps = [ir.AffineMap.get(len(dims), 0, src), ir.AffineMap.get_identity(len(dims))]

    @generic([value], [tensor_d.EmptyOp(list(out_t.shape), out_t.element_type).result], maps, [PARALLEL] * len(dims))
    def copied(a: ir.Value, _out: ir.Value) -> ir.Value:
        return a

    # Keep the copy its own dispatch: fused into the GEMM, the GEMM became a SIMT reduction
    # (docs/decisions.md#strided-1x1).
    return util_d.OptimizationBarrierOp([out_t], [copied]).results[0]


def _reassociation(letters: tuple[str, ...], spatial: str) -> ir.ArrayAttr:
    """Groups for collapse/expand: the spatial letters together, every other dimension alone."""
    groups: list[list[int]] = []
    for i, letter in enumerate(letters):
        if letter in spatial and groups and letters[groups[-1][0]] in spatial:
            groups[-1].append(i)
        else:
            groups.append([i])
    return reassociation(groups)


@register
class ExplicitGemm(ConvbwPass):
    argument = "convbw-explicit-gemm"
    description = (
        "Rewrite each convbw.conv_bwd_weight with a 1x1 filter into a batched GEMM: copy the x and dy window "
        "that reads inside the image where strided or padded, collapse the spatial dimensions of x and dy, a 1-D "
        "filter-1 op, expand dW back."
    )

    def run(self, module: ir.Operation) -> None:
        for op in collect_ops(module, convbw.OP_NAME):
            problem = convbw.verify_op(op)
            if problem is None:
                raise self.fail(op, "invalid convbw.conv_bwd_weight op")
            plan = convbw.plan_of(op)
            flat = as_gemm(problem)
            if convbw.split_of(op) or flat is None or (plan is not None and not plan.gemm):
                continue
            gemm = effective_problem(problem, plan is not None and plan.reduction_innermost)
            with ir.InsertionPoint(op), op.location:
                unit, x_v, dy_v = window(problem, op.operands[0], op.operands[1])
                x_v = tensor_d.CollapseShapeOp(
                    convbw.tensor_type(flat, "x"), x_v, _reassociation(unit.dims("x"), "DHW")
                ).result
                dy_v = tensor_d.CollapseShapeOp(
                    convbw.tensor_type(flat, "dy"), dy_v, _reassociation(unit.dims("dy"), "DHW")
                ).result
                if gemm.layout != flat.layout:  # the plan's reduction-innermost form: [N, W, G, C] -> [N, G, C, W]
                    x_v = transpose(x_v, [flat.dims("x").index(d) for d in gemm.dims("x")])
                    dy_v = transpose(dy_v, [flat.dims("dy").index(d) for d in gemm.dims("dy")])
                plan_attr = op.attributes[convbw.PLAN_ATTR] if plan else None
                d_v = None
                if len(op.operands) > 2:  # the epilogue's D, collapsed like dW: the GEMM's write applies it
                    d_v = tensor_d.CollapseShapeOp(
                        convbw.tensor_type(gemm, "d"), op.operands[2], _reassociation(problem.dims("dw"), "ZYX")
                    ).result
                gemm_op = convbw.build_op(gemm, x_v, dy_v, op.location, plan=plan_attr, d=d_v)
                dw = tensor_d.ExpandShapeOp(
                    convbw.tensor_type(problem, "dw"),
                    gemm_op.result,
                    _reassociation(problem.dims("dw"), "ZYX"),
                    [],
                    list(problem.dw_shape),
                ).result
            op.results[0].replace_all_uses_with(dw)
            op.erase()
