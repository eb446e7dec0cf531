"""convbw-explicit-gemm: a 1x1 filter with no padding is a batched GEMM; say so in the IR.

    %dw = convbw.conv_bwd_weight(%x, %dy)   x: N x H x W x G x C, filter 1 x 1, stride 1, pad 0
  ->
    %x1 = tensor.collapse_shape %x          N x (H*W) x G x C       (spatial dims are adjacent in
    %d1 = tensor.collapse_shape %dy         N x (H*W) x G x K        every layout family)
    %w1 = convbw.conv_bwd_weight(%x1, %d1)  the 1-D, filter-1 problem: G x K x 1 x C
    %dw = tensor.expand_shape %w1           G x K x 1 x 1 x C

A strided 1x1 reads x only at o * stride; that subsample (copied by a linalg.generic) is its GEMM
operand, so it becomes the stride-1 case. No im2col (CK's "explicit GEMM" for 1x1 bwd-weight).
Lowered, the 1-D op has no filter loop and an identity x map: a batched GEMM over groups with M = K,
N = C and the reduction N * prod(output), which IREE compiles as a contraction rather than a convolution.

The contraction it lowers to is a GEMM, given to IREE dy first (``convbw-lower-to-linalg``,
:func:`convbw_mlir.passes.lower_to_linalg.dy_first` says why).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from convbw_mlir.dialects import convbw
from convbw_mlir.passes.framework import ConvbwPass, collect_ops, option, register
from convbw_mlir.passes.lower_to_linalg import PARALLEL, reassociation, transpose

from convbw_mlir.ir_imports import ir, linalg_d, tensor_d, util_d
from convbw_mlir.problem import ConvBwdWeightProblem

__all__ = ["ExplicitGemm", "as_gemm"]


def as_gemm(problem: ConvBwdWeightProblem) -> ConvBwdWeightProblem | None:
    """The equivalent 1-D problem with the spatial dimensions flattened, or None if not an unpadded 1x1.

    A strided 1x1 reads x only at o * stride: its GEMM takes that subsample of x (:func:`subsample`).
    """
    one = all(f == 1 for f in problem.filter_size)
    if not one or any(problem.pad_low) or any(problem.pad_high):
        return None
    if problem.rank == 1 and problem.stride == (1,):
        return None  # already the GEMM form
    flat = math.prod(problem.output_size)
    return problem.with_(input_size=(flat,), filter_size=(1,), stride=1, dilation=1, pad_low=0, pad_high=0)


def subsample(problem: ConvBwdWeightProblem, x: ir.Value) -> tuple[ConvBwdWeightProblem, ir.Value]:
    """x at the positions a strided 1x1 reads (o * stride), copied by a linalg.generic; the problem with
    stride 1 on it. Unchanged for stride 1.

    A copy of its own, not a strided tensor.extract_slice: IREE 3.13 fuses such a slice into the GEMM's
    loads, and that kernel gave wrong dW on the H200 for a 1-D strided 1x1 (CK's ck1d_a, sm_80 code;
    bench/results/h200_2026-11-22_gemm_order.md). A util.optimization_barrier keeps IREE from fusing it back.
    """
    if all(s == 1 for s in problem.stride):
        return problem, x
    dims = problem.dims("x")
    spatial = [d for d in dims if d in "DHW"]
    p1 = problem.with_(input_size=problem.output_size, stride=1)
    loops = [ir.AffineDimExpr.get(i) for i in range(len(dims))]
    src = [loops[i] * problem.stride[spatial.index(d)] if d in spatial else loops[i] for i, d in enumerate(dims)]
    maps = [ir.AffineMap.get(len(dims), 0, src), ir.AffineMap.get_identity(len(dims))]
    out_t = convbw.tensor_type(p1, "x")
    copy = linalg_d.GenericOp(
        [out_t], [x], [tensor_d.EmptyOp(list(out_t.shape), out_t.element_type).result],
        ir.ArrayAttr.get([ir.AffineMapAttr.get(m) for m in maps]),
        ir.ArrayAttr.get([ir.Attribute.parse(PARALLEL)] * len(dims)),
    )  # fmt: skip
    block = copy.regions[0].blocks.append(out_t.element_type, out_t.element_type)
    with ir.InsertionPoint(block):
        linalg_d.YieldOp([block.arguments[0]])
    # Keep the copy its own dispatch: fused into the GEMM (as IREE does when no reshape separates them,
    # the 1-D case), the GEMM became a SIMT reduction: 5336 us for CK's ck1d_a on the H200, 86 us for
    # the 2-D ck2d_b whose collapse_shape keeps them apart; 101 us with the barrier
    # (bench/results/h200_2026-11-22_gemm_order.md).
    return p1, util_d.OptimizationBarrierOp([out_t], [copy.result]).results[0]


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
        "Rewrite each convbw.conv_bwd_weight with a 1x1 filter and no padding into a batched GEMM: subsample "
        "x where strided, collapse the spatial dimensions of x and dy, a 1-D filter-1 op, expand dW back."
    )

    @dataclass
    class Options:
        reduction_innermost: bool = option(
            False, "transpose channels-last x and dy so the reduction is innermost (layout NGCW) before the GEMM"
        )

    def run(self, module: ir.Operation) -> None:
        for op in collect_ops(module, convbw.OP_NAME):
            problem = convbw.verify_op(op)
            if problem is None:
                raise self.fail(op, "invalid convbw.conv_bwd_weight op")
            if convbw.split_of(op):
                continue
            gemm = as_gemm(problem)
            if gemm is None:
                continue
            with ir.InsertionPoint(op), op.location:
                unit_stride, x_v = subsample(problem, op.operands[0])
                x_v = tensor_d.CollapseShapeOp(
                    convbw.tensor_type(gemm, "x"), x_v, _reassociation(unit_stride.dims("x"), "DHW")
                ).result
                dy_v = tensor_d.CollapseShapeOp(
                    convbw.tensor_type(gemm, "dy"), op.operands[1], _reassociation(problem.dims("dy"), "DHW")
                ).result
                if self.options.reduction_innermost and gemm.layout_family.x in ("NHWGC", "GNHWC"):
                    # [N, W, G, C] -> [N, G, C, W]: the family NGCHW/GKYXC/NGKHW (same dW layout)
                    gemm_t = gemm.with_(layout=3)
                    x_v = transpose(x_v, [gemm.dims("x").index(d) for d in gemm_t.dims("x")])
                    dy_v = transpose(dy_v, [gemm.dims("dy").index(d) for d in gemm_t.dims("dy")])
                    gemm = gemm_t
                flat = convbw.build_op(gemm, x_v, dy_v, op.location)
                dw = tensor_d.ExpandShapeOp(
                    convbw.tensor_type(problem, "dw"),
                    flat.result,
                    _reassociation(problem.dims("dw"), "ZYX"),
                    [],
                    list(problem.dw_shape),
                ).result
            op.results[0].replace_all_uses_with(dw)
            op.erase()
