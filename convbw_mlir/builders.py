"""IR building blocks the passes and the benchmark's contender forms share: linalg on tensors, built at
the current insertion point with the dialect builders (``linalg_d.generic`` for generics)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from convbw_mlir.ir_imports import arith_d, element_type, ir, linalg_d, tensor_d
from convbw_mlir.problem import ConvBwdWeightProblem

__all__ = [
    "PARALLEL",
    "REDUCTION",
    "apply_epilogue",
    "as_value",
    "convert",
    "drop_unit_dims",
    "expand_dim",
    "expand_units",
    "finish_dw",
    "generic",
    "leading_slice",
    "pad_by_gather",
    "pad_zeros",
    "reassociation",
    "reduce_partials",
    "transpose",
    "unit_groups",
    "zero",
]

PARALLEL = linalg_d.IteratorType.parallel
REDUCTION = linalg_d.IteratorType.reduction


def generic(
    inputs: Sequence[ir.Value], outputs: Sequence[ir.Value], maps: Sequence[ir.AffineMap],
    iterators: Sequence[linalg_d.IteratorType],
) -> Callable[[Callable[..., ir.Value]], ir.Value]:  # fmt: skip
    """``linalg.generic`` through the bindings' region builder: decorate the body, get the result."""
    return linalg_d.generic(list(inputs), list(outputs), list(maps), list(iterators))


def zero(etype: ir.Type) -> ir.Value:
    return arith_d.ConstantOp(etype, ir.FloatAttr.get(etype, 0.0)).result


def as_value(v: ir.Value | ir.OpView) -> ir.Value:
    """The single result of a builder that returns the op (or already the value)."""
    return v if isinstance(v, ir.Value) else v.operation.results[0]


def reassociation(groups: list[list[int]]) -> ir.ArrayAttr:
    """The reassociation attribute of tensor.expand_shape / collapse_shape."""
    i64 = ir.IntegerType.get_signless(64)
    return ir.ArrayAttr.get([ir.ArrayAttr.get([ir.IntegerAttr.get(i64, i) for i in g]) for g in groups])


def pad_zeros(value: ir.Value, low: list[int], high: list[int]) -> ir.Value:
    """tensor.pad with zeros; ``value`` itself when nothing is padded."""
    if not any(low) and not any(high):
        return value
    src = value.type
    shape = [s + lo + hi for s, lo, hi in zip(src.shape, low, high)]
    pad = tensor_d.PadOp(ir.RankedTensorType.get(shape, src.element_type), value, [], [], low, high)
    block = pad.regions[0].blocks.append(*[ir.IndexType.get()] * len(shape))
    with ir.InsertionPoint(block):
        tensor_d.YieldOp(zero(src.element_type))
    return pad.result


def pad_by_gather(value: ir.Value, low: list[int], high: list[int]) -> ir.Value:
    """Zero padding as an elementwise linalg.generic that reads ``value`` with tensor.extract.

    out[i] = value[i - low] where every padded index is in range, else 0: tensor.pad's result, in a
    form IREE compiles 2.4-3.7x faster (docs/decisions.md#gather-pad).
    """
    if not any(low) and not any(high):
        return value
    src = value.type
    shape = [s + lo + hi for s, lo, hi in zip(src.shape, low, high)]
    identity = ir.AffineMap.get_identity(len(shape))
    index_t = ir.IndexType.get()

    @generic([], [tensor_d.EmptyOp(shape, src.element_type).result], [identity], [PARALLEL] * len(shape))
    def padded(_out: ir.Value) -> ir.Value:
        zero_i = arith_d.ConstantOp(index_t, 0).result
        inside = None
        indices = []
        for dim, (size, lo, hi) in enumerate(zip(src.shape, low, high)):
            idx = linalg_d.IndexOp(dim).result
            if not lo and not hi:
                indices.append(idx)
                continue
            if lo:
                idx = arith_d.SubIOp(idx, arith_d.ConstantOp(index_t, lo).result).result
            # one unsigned compare covers both ends: idx - lo < 0 wraps to a huge value
            ok = arith_d.CmpIOp(arith_d.CmpIPredicate.ult, idx, arith_d.ConstantOp(index_t, size).result).result
            inside = ok if inside is None else arith_d.AndIOp(inside, ok).result
            indices.append(idx)
        # out-of-range lanes read element 0 (always valid), then select zero
        safe = [arith_d.SelectOp(inside, i, zero_i).result if lo or hi else i
                for i, lo, hi in zip(indices, low, high)]  # fmt: skip
        read = tensor_d.ExtractOp(value, safe).result
        return arith_d.SelectOp(inside, read, zero(src.element_type)).result

    return padded


def expand_dim(value: ir.Value, pos: int, outer: int, inner: int) -> ir.Value:
    """tensor.expand_shape of dimension ``pos`` into [outer, inner]."""
    shape = list(value.type.shape)
    rank = len(shape)
    shape[pos : pos + 1] = [outer, inner]
    groups = [[i] for i in range(pos)] + [[pos, pos + 1]] + [[i + 1] for i in range(pos + 1, rank)]
    out_t = ir.RankedTensorType.get(shape, value.type.element_type)
    return tensor_d.ExpandShapeOp(out_t, value, reassociation(groups), [], shape).result


def leading_slice(value: ir.Value, sizes: dict[int, int]) -> ir.Value:
    """tensor.extract_slice keeping the first ``sizes[d]`` entries of each dimension ``d`` given."""
    shape = list(value.type.shape)
    new = [sizes.get(d, s) for d, s in enumerate(shape)]
    out_t = ir.RankedTensorType.get(new, value.type.element_type)
    return tensor_d.ExtractSliceOp(out_t, value, [], [], [], [0] * len(shape), new, [1] * len(shape)).result


def unit_groups(kept: list[bool]) -> list[list[int]]:
    """Reassociation groups joining each dropped dimension to the next kept one (trailing ones to the
    last kept one); a shape with none kept has no groups (a 0-d tensor)."""
    groups: list[list[int]] = []
    pending: list[int] = []
    for i, k in enumerate(kept):
        pending.append(i)
        if k:
            groups.append(pending)
            pending = []
    if pending and groups:
        groups[-1].extend(pending)
    return groups


def drop_unit_dims(value: ir.Value, amap: ir.AffineMap) -> tuple[ir.Value, ir.AffineMap]:
    """Collapse away the operand's unit dimensions indexed by the constant 0 (G=1, a chunk of 1, ...).

    IREE folds such dimensions itself, but by rebuilding the linalg.generic without our
    ``compilation_info`` (docs/decisions.md#unit-dims); without them the op reaches codegen as built.
    """
    shape = list(value.type.shape)
    exprs = list(amap.results)
    zero_e = ir.AffineConstantExpr.get(0)
    keep = [not (size == 1 and e == zero_e) for size, e in zip(shape, exprs)]
    if all(keep):
        return value, amap
    out_t = ir.RankedTensorType.get([s for s, k in zip(shape, keep) if k], value.type.element_type)
    collapsed = tensor_d.CollapseShapeOp(out_t, value, reassociation(unit_groups(keep))).result
    return collapsed, ir.AffineMap.get(amap.n_dims, amap.n_symbols, [e for e, k in zip(exprs, keep) if k])


def expand_units(value: ir.Value, full_shape: list[int]) -> ir.Value:
    """tensor.expand_shape re-inserting the unit dimensions left out of ``value`` (exactly the 1s)."""
    if list(value.type.shape) == full_shape:
        return value
    out_t = ir.RankedTensorType.get(full_shape, value.type.element_type)
    groups = unit_groups([size > 1 for size in full_shape])
    return tensor_d.ExpandShapeOp(out_t, value, reassociation(groups), [], full_shape).result


def transpose(value: ir.Value, perm: list[int]) -> ir.Value:
    """linalg.transpose of ``value`` into a new tensor, result dimension i = source dimension perm[i]."""
    shape = [value.type.shape[i] for i in perm]
    out = tensor_d.EmptyOp(shape, value.type.element_type)
    return as_value(linalg_d.transpose(value, outs=[out.result], permutation=perm))


def convert(src: ir.Value, to: ir.Type) -> ir.Value:
    """Elementwise float conversion (arith.truncf or extf) as its own linalg.generic; ``src`` if equal."""
    src_t = src.type
    if src_t.element_type == to:
        return src
    ident = ir.AffineMap.get_identity(src_t.rank)
    widen = ir.FloatType(to).width > ir.FloatType(src_t.element_type).width
    cast = arith_d.ExtFOp if widen else arith_d.TruncFOp

    @generic([src], [tensor_d.EmptyOp(src_t.shape, to).result], [ident, ident], [PARALLEL] * src_t.rank)
    def converted(a: ir.Value, _out: ir.Value) -> ir.Value:
        return cast(to, a).result

    return converted


def finish_dw(problem: ConvBwdWeightProblem, acc: ir.Value, d: ir.Value | None = None) -> ir.Value:
    """The f32 accumulator ``[g, k, f..., c]`` -> dW: truncf where needed, transpose to dW's layout.

    With an epilogue, one elementwise generic does all of it: ``alpha * acc (+ beta * D)`` in f32, the
    conversion, and the transpose (acc read through the permutation), so the epilogue rides in the
    write IREE fuses into the producing dispatch, never a pass of its own (docs/epilogues.md).
    ``d`` is the epilogue's D (dW's layout), for an epilogue that reads one.
    """
    if problem.epilogue is not None:
        return apply_epilogue(problem, acc, d)
    dw = acc
    if problem.dw_dtype != "f32":
        dw = convert(dw, element_type(problem.dw_dtype))
    letters = problem.dims("acc")
    perm = [letters.index(letter) for letter in problem.dims("dw")]
    if perm != list(range(len(perm))):
        dw = transpose(dw, perm)
    return dw


def apply_epilogue(problem: ConvBwdWeightProblem, acc: ir.Value, d: ir.Value | None) -> ir.Value:
    """``alpha * acc + beta * D`` (or ``alpha * acc``) -> dW's type and layout, as one elementwise generic.

    Loops follow dW's layout; the f32 accumulator ``[g, k, f..., c]`` is read through the permutation,
    D and dW with the identity. Multiplications by 1 are left out; D is widened to f32 first.
    """
    ep = problem.epilogue
    assert ep is not None
    if ep.reads_d != (d is not None):
        raise ValueError(f"epilogue: {ep.kind} {'needs' if ep.reads_d else 'takes no'} D operand")
    f32 = ir.F32Type.get()
    dw_letters, acc_letters = problem.dims("dw"), problem.dims("acc")
    rank = len(dw_letters)
    loops = [ir.AffineDimExpr.get(i) for i in range(rank)]
    ident = ir.AffineMap.get_identity(rank)
    acc_map = ir.AffineMap.get(rank, 0, [loops[dw_letters.index(a)] for a in acc_letters])
    out_t = element_type(problem.dw_dtype)
    out = tensor_d.EmptyOp(list(problem.dw_shape), out_t).result
    inputs, maps = [acc], [acc_map]
    if d is not None:
        inputs.append(d)
        maps.append(ident)

    def const(value: float) -> ir.Value:
        return arith_d.ConstantOp(f32, ir.FloatAttr.get(f32, value)).result

    @generic(inputs, [out], [*maps, ident], [PARALLEL] * rank)
    def epilogue(a: ir.Value, *rest: ir.Value) -> ir.Value:
        v = a if ep.alpha == 1.0 else arith_d.MulFOp(const(ep.alpha), a).result
        if d is not None:
            dv = rest[0]
            if dv.type != f32:
                dv = arith_d.ExtFOp(f32, dv).result
            if ep.beta != 1.0:
                dv = arith_d.MulFOp(const(ep.beta), dv).result
            v = arith_d.AddFOp(v, dv).result
        return v if out_t == f32 else arith_d.TruncFOp(out_t, v).result

    return epilogue


def reduce_partials(partials: ir.Value) -> ir.Value:
    """Sum f32 partials ``[k_batch, ...]`` over the leading dimension (split-K's stage 2), in f32."""
    shape = list(partials.type.shape[1:])
    f32 = ir.F32Type.get()
    empty = tensor_d.EmptyOp(shape, f32)
    init = as_value(linalg_d.fill(zero(f32), outs=[empty.result]))
    rank = len(shape)
    # Loops (d0..d{rank-1} = the result, d{rank} = the split), reduction last as linalg prefers.
    dims = [ir.AffineDimExpr.get(i) for i in range(rank + 1)]
    in_map = ir.AffineMap.get(rank + 1, 0, [dims[rank], *dims[:rank]])
    out_map = ir.AffineMap.get(rank + 1, 0, dims[:rank])

    @generic([partials], [init], [in_map, out_map], [PARALLEL] * rank + [REDUCTION])
    def summed(part: ir.Value, acc: ir.Value) -> ir.Value:
        return arith_d.AddFOp(acc, part).result

    return summed
