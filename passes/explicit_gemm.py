"""convbw-explicit-gemm: a 1x1 filter with stride 1 and no padding is a batched GEMM; say so in the IR.

    %dw = convbw.conv_bwd_weight(%x, %dy)   x: N x H x W x G x C, filter 1 x 1, stride 1, pad 0
  ->
    %x1 = tensor.collapse_shape %x          N x (H*W) x G x C       (spatial dims are adjacent in
    %d1 = tensor.collapse_shape %dy         N x (H*W) x G x K        every layout family)
    %w1 = convbw.conv_bwd_weight(%x1, %d1)  the 1-D, filter-1 problem: G x K x 1 x C
    %dw = tensor.expand_shape %w1           G x K x 1 x 1 x C

No im2col (CK's "explicit GEMM" for 1x1 bwd-weight). Lowered, the 1-D op has no filter loop and an
identity x map: a batched GEMM over groups with M = K, N = C and the reduction N * H * W, which IREE
compiles as a contraction rather than a convolution.

The contraction it lowers to is a GEMM, given to IREE dy first (``convbw-lower-to-linalg``,
:func:`convbw_mlir.passes.lower_to_linalg.dy_first` says why).
"""

from __future__ import annotations

from dataclasses import dataclass

from convbw_mlir.dialects import convbw
from convbw_mlir.passes.framework import ConvbwPass, collect_ops, option, register
from convbw_mlir.passes.lower_to_linalg import reassociation, transpose

from convbw_mlir.ir_imports import ir, tensor_d
from convbw_mlir.problem import ConvBwdWeightProblem

__all__ = ["ExplicitGemm", "as_gemm"]


def as_gemm(problem: ConvBwdWeightProblem) -> ConvBwdWeightProblem | None:
    """The equivalent 1-D problem with the spatial dimensions flattened, or None if not a plain 1x1."""
    plain = all(f == 1 for f in problem.filter_size) and all(s == 1 for s in problem.stride)
    if not plain or any(problem.pad_low) or any(problem.pad_high) or problem.rank == 1:
        return None
    flat = 1
    for size in problem.input_size:
        flat *= size
    return problem.with_(input_size=(flat,), filter_size=(1,), stride=1, dilation=1, pad_low=0, pad_high=0)


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
        "Rewrite each convbw.conv_bwd_weight with a 1x1 filter, stride 1 and no padding into a batched GEMM: "
        "collapse the spatial dimensions of x and dy, a 1-D filter-1 op, expand dW back (no im2col)."
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
                x = tensor_d.CollapseShapeOp(
                    convbw.tensor_type(gemm, "x"), op.operands[0], _reassociation(problem.dims("x"), "DHW")
                )
                dy = tensor_d.CollapseShapeOp(
                    convbw.tensor_type(gemm, "dy"), op.operands[1], _reassociation(problem.dims("dy"), "DHW")
                )
                x_v, dy_v = x.result, dy.result
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
