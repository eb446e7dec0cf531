"""convbw-lower-to-linalg: ``convbw.conv_bwd_weight`` -> linalg on tensors.

Each op becomes

    tensor.pad x            only where a pad is non-zero
    linalg.fill 0.0         the f32 accumulator, dW[g, k, f..., c] (filter channel innermost)
    linalg.generic          the contraction: ins(x, dy), parallel (g, k, f..., c), reduction (n, o...),
                            x indexed at o * stride + f * dilation, products accumulated in f32
    linalg.generic          extf/truncf to dW's element type, only where it is not f32
    linalg.transpose        to dW's layout, only where the filter channel is not innermost there

x and dy are read in their own layout through the indexing maps, so no transposes appear on the
inputs. The orientation matters: IREE 3.13's GPU codegen rejects the contraction with dy as the first
operand ("failed to pack reduction dimensions for partial reduction"), and accepts input first, dy
second and dW with the filter channel innermost on every GPU target (measured, ../shared/DESIGN.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from convbw_mlir.dialects import convbw
from convbw_mlir.passes.framework import ConvbwPass, collect_ops, register

from convbw_mlir.ir_imports import arith_d, element_type, ir, linalg_d, rewrite, tensor_d
from convbw_mlir.problem import ConvBwdWeightProblem

__all__ = ["LowerToLinalg", "accumulator_dims", "build_contraction"]

PARALLEL = "#linalg.iterator_type<parallel>"
REDUCTION = "#linalg.iterator_type<reduction>"


def accumulator_dims(problem: ConvBwdWeightProblem) -> tuple[str, ...]:
    """Dimension letters of the f32 accumulator: ``G K <filter> C`` (no G for G-less layouts)."""
    filt = tuple(d for d in problem.dims("dw") if d in "ZYX")
    g = ("G",) if "G" in problem.dims("dw") else ()
    return (*g, "K", *filt, "C")


def _iterator_dims(problem: ConvBwdWeightProblem) -> tuple[list[str], list[str]]:
    """Loop names, parallel then reduction: (g, k, f0.., c) and (n, o0..)."""
    r = problem.rank
    par = (["g"] if "G" in problem.dims("dw") else []) + ["k"] + [f"f{i}" for i in range(r)] + ["c"]
    red = ["n"] + [f"o{i}" for i in range(r)]
    return par, red


def _maps(problem: ConvBwdWeightProblem) -> list[ir.AffineMap]:
    par, red = _iterator_dims(problem)
    loops = par + red
    d = {name: ir.AffineDimExpr.get(i) for i, name in enumerate(loops)}
    spatial_in = [s for s in problem.dims("x") if s in "DHW"]

    def spatial(i: int, with_filter: bool) -> ir.AffineExpr:
        if not with_filter:
            return d[f"o{i}"]
        o = d[f"o{i}"] * problem.stride[i] if problem.stride[i] != 1 else d[f"o{i}"]
        f = d[f"f{i}"] * problem.dilation[i] if problem.dilation[i] != 1 else d[f"f{i}"]
        return o + f

    def expr(letter: str, with_filter: bool) -> ir.AffineExpr:
        if letter in "DHW":
            return spatial(spatial_in.index(letter), with_filter)
        if letter in "ZYX":
            return d[f"f{[s for s in problem.dims('dw') if s in 'ZYX'].index(letter)}"]
        return d[letter.lower()]

    def amap(letters: tuple[str, ...], with_filter: bool) -> ir.AffineMap:
        return ir.AffineMap.get(len(loops), 0, [expr(x, with_filter) for x in letters])

    return [
        amap(problem.dims("x"), True),
        amap(problem.dims("dy"), False),
        amap(accumulator_dims(problem), False),
    ]


def _pad(problem: ConvBwdWeightProblem, x: ir.Value) -> ir.Value:
    """tensor.pad of x's spatial dimensions; x itself when every pad is zero."""
    if not any(problem.pad_low) and not any(problem.pad_high):
        return x
    letters = problem.dims("x")
    spatial = [i for i, s in enumerate(letters) if s in "DHW"]
    low, high = [0] * len(letters), [0] * len(letters)
    for axis, pos in enumerate(spatial):
        low[pos], high[pos] = problem.pad_low[axis], problem.pad_high[axis]
    shape = list(problem.x_shape)
    for pos in spatial:
        shape[pos] += low[pos] + high[pos]
    etype = element_type(problem.dtype)
    pad = tensor_d.PadOp(ir.RankedTensorType.get(shape, etype), x, [], [], low, high)
    block = pad.regions[0].blocks.append(*[ir.IndexType.get()] * len(letters))
    with ir.InsertionPoint(block):
        zero = arith_d.ConstantOp(etype, ir.FloatAttr.get(etype, 0.0))
        tensor_d.YieldOp(zero)
    return pad.result


def _elementwise_cast(src: ir.Value, to: ir.Type) -> ir.Value:
    """f32 -> dW's element type, as one elementwise linalg.generic (arith.truncf)."""
    src_t = ir.RankedTensorType(src.type)
    out_t = ir.RankedTensorType.get(src_t.shape, to)
    empty = tensor_d.EmptyOp(src_t.shape, to)
    ident = ir.AffineMap.get_identity(src_t.rank)
    op = linalg_d.GenericOp(
        [out_t], [src], [empty.result], ir.ArrayAttr.get([ir.AffineMapAttr.get(ident)] * 2),
        ir.ArrayAttr.get([ir.Attribute.parse(PARALLEL)] * src_t.rank),
    )  # fmt: skip
    block = op.regions[0].blocks.append(src_t.element_type, to)
    with ir.InsertionPoint(block):
        linalg_d.YieldOp([arith_d.TruncFOp(to, block.arguments[0]).result])
    return op.result


def _as_value(v: ir.Value | ir.OpView) -> ir.Value:
    """The single result of a builder that returns the op (or already the value)."""
    return v if isinstance(v, ir.Value) else v.operation.results[0]


def build_contraction(problem: ConvBwdWeightProblem, x: ir.Value, dy: ir.Value) -> ir.Value:
    """Build the linalg form of ``problem`` at the current insertion point; returns dW (in its layout)."""
    f32 = ir.F32Type.get()
    acc_letters = accumulator_dims(problem)
    sizes = dict(zip(problem.dims("dw"), problem.dw_shape))
    acc_shape = [sizes[a] for a in acc_letters]
    empty = tensor_d.EmptyOp(acc_shape, f32)
    zero = arith_d.ConstantOp(f32, ir.FloatAttr.get(f32, 0.0))
    init = _as_value(linalg_d.fill(zero.result, outs=[empty.result]))
    par, red = _iterator_dims(problem)
    iterators = [ir.Attribute.parse(PARALLEL)] * len(par) + [ir.Attribute.parse(REDUCTION)] * len(red)
    generic = linalg_d.GenericOp(
        [ir.RankedTensorType.get(acc_shape, f32)],
        [_pad(problem, x), dy],
        [init],
        ir.ArrayAttr.get([ir.AffineMapAttr.get(m) for m in _maps(problem)]),
        ir.ArrayAttr.get(iterators),
    )
    in_t = element_type(problem.dtype)
    block = generic.regions[0].blocks.append(in_t, in_t, f32)
    with ir.InsertionPoint(block):
        a, b, acc = block.arguments
        if problem.dtype != "f32":
            a, b = arith_d.ExtFOp(f32, a).result, arith_d.ExtFOp(f32, b).result
        linalg_d.YieldOp([arith_d.AddFOp(acc, arith_d.MulFOp(a, b).result).result])
    dw = generic.result
    if problem.dw_dtype != "f32":
        dw = _elementwise_cast(dw, element_type(problem.dw_dtype))
    perm = [acc_letters.index(letter) for letter in problem.dims("dw")]
    if perm != list(range(len(perm))):
        out_t = ir.RankedTensorType.get(problem.dw_shape, element_type(problem.dw_dtype))
        out = tensor_d.EmptyOp(problem.dw_shape, out_t.element_type)
        dw = _as_value(linalg_d.transpose(dw, outs=[out.result], permutation=perm))
    return dw


@register
class LowerToLinalg(ConvbwPass):
    argument = "convbw-lower-to-linalg"
    description = (
        "Replace each convbw.conv_bwd_weight with tensor.pad (only for non-zero pads), one linalg.generic "
        "contraction (x first, dy second, f32 accumulator with the filter channel innermost), the cast to "
        "dW's type and a transpose to dW's layout where needed."
    )

    @dataclass
    class Options:
        pass

    def run(self, module: ir.Operation) -> None:
        ops = collect_ops(module, convbw.OP_NAME)
        if not all([convbw.verify_op(op) is not None for op in ops]):
            raise self.fail(module, "invalid convbw.conv_bwd_weight op (see the errors above)")

        def lower(op: ir.Operation, rewriter: rewrite.PatternRewriter) -> bool:
            problem = convbw.problem_of(op)
            with rewriter.ip, op.location:
                dw = build_contraction(problem, op.operands[0], op.operands[1])
            rewriter.replace_op(op, [dw])
            return False  # matched

        patterns = rewrite.RewritePatternSet()
        patterns.add(convbw.OP_NAME, lower)
        rewrite.apply_patterns_and_fold_greedily(module, patterns.freeze())
