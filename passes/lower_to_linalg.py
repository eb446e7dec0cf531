"""convbw-lower-to-linalg: ``convbw.conv_bwd_weight`` -> linalg on tensors.

Each op becomes

    zero pad of x (and dy)  only where a pad is non-zero (dy only for an uneven split-K): an elementwise
                            linalg.generic reading through tensor.extract (:func:`pad_by_gather` says why),
                            or tensor.pad with ``frontend-form``
    linalg.fill 0.0         the f32 accumulator dW[g, k, f..., c] (filter channel innermost)
    linalg.generic          the contraction: ins(x, dy), parallel (g, k, f..., c), reduction (n, o...),
                            x indexed at o * stride + f * dilation, products accumulated in f32;
                            a GEMM (no filter loop) takes dy first (:func:`dy_first` says why)
    tensor.expand_shape     only where loops of extent 1 were left out (see below)
    linalg.generic          truncf to dW's element type, only where it is not f32
    linalg.transpose        to dW's layout, only where the filter channel is not innermost there
                            (with an epilogue, these last two are one generic: alpha * acc + beta * D,
                            converted and written in dW's layout; builders.apply_epilogue)

x and dy are read in their own layout through the indexing maps, so no transposes appear on the
inputs. The orientation matters: IREE 3.13's GPU codegen rejects the convolution with dy as the first
operand, and accepts input first, dy second and dW with the filter channel innermost on every GPU
target (docs/decisions.md#operand-order).

Loops of extent 1 (G=1, a 1x1 filter, K=1 or C=1 in depthwise, N=1) are left out of the generic, and
the unit dimensions of x and dy they would index are collapsed away (:func:`drop_unit_dims`); a GEMM's
reduction loops that both inputs read as adjacent dimensions are merged (:func:`merge_reduction_loops`).
IREE would do both itself, by rebuilding the generic without our ``compilation_info``; done here, the
loops that ``convbw-tile`` and ``convbw-map-mma`` configure are exactly the loops IREE compiles.

An op carrying a split (``k_batch``, from ``convbw-split-k``) yields the f32 partial sums
``[k_batch, g, k, f..., c]``: the split is one more parallel loop, outermost.

The contraction generic carries ``convbw.contraction`` (:mod:`convbw_mlir.contraction`: the problem,
its loops and the op's plan), which the GPU passes read. The shared IR pieces live in
:mod:`convbw_mlir.builders`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from convbw_mlir.dialects import convbw
from convbw_mlir.passes.framework import ConvbwPass, collect_ops, option, register

from convbw_mlir.builders import (
    PARALLEL,
    REDUCTION,
    as_value,
    drop_unit_dims,
    expand_dim,
    expand_units,
    finish_dw,
    generic,
    leading_slice,
    pad_by_gather,
    pad_zeros,
    reassociation,
    zero,
)
from convbw_mlir.contraction import CONTRACTION_ATTR, contraction_attr
from convbw_mlir.ir_imports import arith_d, ir, linalg_d, rewrite, tensor_d
from convbw_mlir.loops import Contraction, Split, input_pads
from convbw_mlir.problem import ConvBwdWeightProblem

__all__ = ["LowerToLinalg", "build_contraction", "dy_first", "merge_reduction_loops"]


def _maps(
    problem: ConvBwdWeightProblem, split: Split | None, loops: list[str], n_parallel: int, swap: bool
) -> list[ir.AffineMap]:
    """Indexing maps of (x, dy, accumulator), or (dy, x, accumulator) with ``swap``."""
    d = {name: ir.AffineDimExpr.get(i) for i, name in enumerate(loops)}
    zero = ir.AffineConstantExpr.get(0)

    def loop(name: str) -> ir.AffineExpr:
        """A loop's full index: its own variable, plus the split offset for the split loop."""
        expr = d.get(name, zero)
        if split and name == split.dim:
            offset = d["s"] * split.chunk if split.chunk != 1 else d["s"]
            expr = offset + expr if name in d else offset
        return expr

    def scaled(expr: ir.AffineExpr, factor: int) -> ir.AffineExpr:
        return expr * factor if factor != 1 else expr

    spatial_in = [s for s in problem.dims("x") if s in "DHW"]

    def x_exprs(letter: str) -> list[ir.AffineExpr]:
        if letter in "DHW":
            i = spatial_in.index(letter)
            return [scaled(loop(f"o{i}"), problem.stride[i]) + scaled(loop(f"f{i}"), problem.dilation[i])]
        if split and split.dim == "n" and letter == "N":  # x's batch is expanded to [k_batch, chunk] too
            return [d["s"], d.get("n", zero)]
        return [loop(letter.lower())]

    def dy_exprs(letter: str) -> list[ir.AffineExpr]:
        name = f"o{spatial_in.index(letter)}" if letter in "DHW" else letter.lower()
        if split and name == split.dim:  # dy's split dimension is expanded to [k_batch, chunk]
            return [d["s"], d.get(name, zero)]
        return [loop(name)]

    acc = [d[name] for name in loops[:n_parallel]]

    def amap(exprs: list[ir.AffineExpr]) -> ir.AffineMap:
        return ir.AffineMap.get(len(loops), 0, exprs)

    x_map = amap([e for s in problem.dims("x") for e in x_exprs(s)])
    dy_map = amap([e for s in problem.dims("dy") for e in dy_exprs(s)])
    return [dy_map, x_map, amap(acc)] if swap else [x_map, dy_map, amap(acc)]


def dy_first(problem: ConvBwdWeightProblem, contraction: Contraction) -> bool:
    """Operand order: dy first for a GEMM (no filter loop, stride 1), x first otherwise; IREE 3.13 is
    wrong on the x-first GEMM and fails on the dy-first convolution (docs/decisions.md#operand-order)."""
    return not contraction.is_convolution and all(s == 1 for s in problem.stride)


def _padded_inputs(
    problem: ConvBwdWeightProblem, split: Split | None, x: ir.Value, dy: ir.Value, frontend_form: bool = False
) -> tuple[ir.Value, ir.Value]:
    """Pad x by the problem's pads, and x and dy further where an uneven split reads past the end."""
    pads = input_pads(problem, split)
    x_dims, dy_dims = problem.dims("x"), problem.dims("dy")
    spatial = [s for s in x_dims if s in "DHW"]
    pad = pad_zeros if frontend_form else pad_by_gather
    x, dy = pad(x, list(pads.x_low), list(pads.x_high)), pad(dy, [0] * len(dy_dims), list(pads.dy_high))
    if pads.x_slice:
        x = leading_slice(x, dict(pads.x_slice))
    if split and not split.promoted:
        # The split dimension becomes [k_batch, chunk] in dy (and in x for a batch split), so that linalg
        # sees both loops as plain dimensions of an operand (loop ranges are inferred from operand shapes)
        # and, for a batch split, IREE still recognises a convolution (with s as one more batch loop).
        letter = "N" if split.dim == "n" else spatial[int(split.dim[1:])]
        dy = expand_dim(dy, dy_dims.index(letter), split.k_batch, split.chunk)
        if letter == "N":
            x = expand_dim(x, x_dims.index("N"), split.k_batch, split.chunk)
    return x, dy


def merge_reduction_loops(
    operands: list[ir.Value], maps: list[ir.AffineMap], contraction: Contraction
) -> tuple[list[ir.Value], list[ir.AffineMap], Contraction]:
    """Merge consecutive reduction loops that every input reads as adjacent plain dimensions.

    A GEMM's batch and output loops (``n``, ``o0``) are such a pair in channels-last layouts. IREE 3.13
    merges them itself, but by rebuilding the generic without our ``compilation_info``
    (docs/decisions.md#unit-dims); merged here, the op reaches codegen as built. The inputs are
    collapsed to match; ``maps`` ends with the accumulator's, which holds no reduction loop.
    """
    count = len(contraction.loops)
    inputs, acc_map = maps[:-1], maps[-1]
    for i in range(contraction.n_parallel, count - 1):
        a = ir.AffineDimExpr.get(i)
        if not all(_reads_adjacent(m, i) for m in inputs):
            continue
        values, results = [], []
        for value, amap in zip(operands, inputs):
            res = list(amap.results)
            j = res.index(a)
            shape = list(value.type.shape)
            groups = [[k] for k in range(j)] + [[j, j + 1]] + [[k] for k in range(j + 2, len(shape))]
            out_t = ir.RankedTensorType.get([*shape[:j], shape[j] * shape[j + 1], *shape[j + 2 :]],
                                            value.type.element_type)  # fmt: skip
            values.append(tensor_d.CollapseShapeOp(out_t, value, reassociation(groups)).result)
            results.append(res[: j + 1] + res[j + 2 :])
        # d_{i+1} disappears into d_i: later loops move down by one
        shift = ir.AffineMap.get(count, 0, [ir.AffineDimExpr.get(k - (k > i)) for k in range(count)])
        new_maps = [ir.AffineMap.get(count - 1, 0, [e.compose(shift) for e in res])
                    for res in [*results, list(acc_map.results)]]  # fmt: skip
        return merge_reduction_loops(values, new_maps, contraction.merge(i))
    return operands, maps, contraction


def _reads_adjacent(amap: ir.AffineMap, i: int) -> bool:
    """Whether ``amap`` reads loops i and i + 1 as two adjacent plain results (d_i, d_i+1) and nowhere else."""
    res = list(amap.results)
    a, b = ir.AffineDimExpr.get(i), ir.AffineDimExpr.get(i + 1)
    if a not in res or res.index(a) + 1 >= len(res) or res[res.index(a) + 1] != b:
        return False
    used = re.compile(rf"\bd({i}|{i + 1})\b")
    return sum(len(used.findall(str(e))) for e in res) == 2


def build_contraction(
    problem: ConvBwdWeightProblem,
    x: ir.Value,
    dy: ir.Value,
    split: Split | None = None,
    frontend_form: bool = False,
    plan: dict | None = None,
    d: ir.Value | None = None,
) -> ir.Value:
    """Build the linalg form at the current insertion point.

    Returns dW in its layout and type, or with a split, the f32 partial sums ``[k_batch, g, k, f..., c]``.
    The problem's epilogue (with ``d``, its D) is applied in the generic that writes dW
    (:func:`convbw_mlir.builders.finish_dw`); a split's stage 1 has none.
    ``frontend_form``: tensor.pad and x first for every contraction, the plain form a frontend would hand
    IREE (the benchmark's IREE-default contender and the GPU reference), instead of the gather pad and
    the dy-first GEMM. ``plan`` (the op's, as a dictionary) is recorded on the contraction.
    """
    f32 = ir.F32Type.get()
    full_problem, problem = problem, problem.plain  # the contraction computes the plain product
    contraction = Contraction.build(problem, split).with_plan(plan)
    names, n_parallel = contraction.names, contraction.n_parallel
    sizes = dict(zip(problem.dims("dw"), problem.dw_shape))
    full_acc = ([split.k_batch] if split else []) + [sizes[a] for a in problem.dims("acc")]
    acc_shape = contraction.extents[:n_parallel]
    empty = tensor_d.EmptyOp(acc_shape, f32)
    init = as_value(linalg_d.fill(zero(f32), outs=[empty.result]))
    x_in, dy_in = _padded_inputs(problem, split, x, dy, frontend_form)
    swap = dy_first(problem, contraction) and not frontend_form
    first_map, second_map, acc_map = _maps(problem, split, names, n_parallel, swap)
    first, first_map = drop_unit_dims(dy_in if swap else x_in, first_map)
    second, second_map = drop_unit_dims(x_in if swap else dy_in, second_map)
    (first, second), maps, contraction = merge_reduction_loops(
        [first, second], [first_map, second_map, acc_map], contraction
    )
    iterators = [PARALLEL] * n_parallel + [REDUCTION] * (len(contraction.loops) - n_parallel)

    @generic([first, second], [init], maps, iterators)
    def result(a: ir.Value, b: ir.Value, acc: ir.Value) -> ir.Value:
        if problem.dtype != "f32":
            a, b = arith_d.ExtFOp(f32, a).result, arith_d.ExtFOp(f32, b).result
        return arith_d.AddFOp(acc, arith_d.MulFOp(a, b).result).result

    result.owner.attributes[CONTRACTION_ATTR] = contraction_attr(contraction)
    if split and sum(dict(contraction.loops).get(name, 1) > 1 for name in split.promoted) > 1:
        shape = list(result.type.shape)  # [n, o0, ...] -> [n * o0, ...]
        flat = ir.RankedTensorType.get([shape[0] * shape[1], *shape[2:]], f32)
        groups = [[0, 1]] + [[i] for i in range(2, len(shape))]
        result = tensor_d.CollapseShapeOp(flat, result, reassociation(groups)).result
    result = expand_units(result, full_acc)
    return result if split else finish_dw(full_problem, result, d)


@register
class LowerToLinalg(ConvbwPass):
    argument = "convbw-lower-to-linalg"
    description = (
        "Replace each convbw.conv_bwd_weight with a zero pad (only for non-zero pads), one linalg.generic "
        "contraction (x first, dy second; dy first for a GEMM; f32 accumulator with the filter channel innermost, "
        "loops of extent 1 left out), the cast to dW's type and a transpose to dW's layout where needed; a split "
        "op yields its f32 partial sums."
    )

    @dataclass
    class Options:
        frontend_form: bool = option(
            False, "tensor.pad and x first everywhere: the plain form a frontend would hand IREE (for baselines)"
        )

    def run(self, module: ir.Operation) -> None:
        ops = collect_ops(module, convbw.OP_NAME)
        if not all([convbw.verify_op(op) is not None for op in ops]):
            raise self.fail(module, "invalid convbw.conv_bwd_weight op (see the errors above)")

        def lower(op: ir.Operation, rewriter: rewrite.PatternRewriter) -> bool:
            problem, split, plan = convbw.problem_of(op), convbw.split_of(op), convbw.plan_of(op)
            d = op.operands[2] if len(op.operands) > 2 else None  # the epilogue's D
            with rewriter.ip, op.location:
                dw = build_contraction(problem, op.operands[0], op.operands[1], split, self.options.frontend_form,
                                       plan.to_dict() if plan else None, d)  # fmt: skip
            rewriter.replace_op(op, [dw])
            return False  # matched

        patterns = rewrite.RewritePatternSet()
        patterns.add(convbw.OP_NAME, lower)
        rewrite.apply_patterns_and_fold_greedily(module, patterns.freeze())
