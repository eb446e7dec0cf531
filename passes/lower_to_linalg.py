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

x and dy are read in their own layout through the indexing maps, so no transposes appear on the
inputs. The orientation matters: IREE 3.13's GPU codegen rejects the convolution with dy as the first
operand ("failed to pack reduction dimensions for partial reduction"), and accepts input first, dy
second and dW with the filter channel innermost on every GPU target (measured, ../shared/DESIGN.md).

Loops of extent 1 (G=1, a 1x1 filter, K=1 or C=1 in depthwise, N=1) are left out of the generic, and
the unit dimensions of x and dy they would index are collapsed away (:func:`drop_unit_dims`); a GEMM's
reduction loops that both inputs read as adjacent dimensions are merged (:func:`merge_reduction_loops`).
IREE would do both itself, by rebuilding the generic without our ``compilation_info``; done here, the
loops that ``convbw-tile`` and ``convbw-map-mma`` configure are exactly the loops IREE compiles.

An op carrying a split (``k_batch``, from ``convbw-split-k``) yields the f32 partial sums
``[k_batch, g, k, f..., c]``: the split is one more parallel loop, outermost.

The contraction generic carries ``convbw.contraction``, a dictionary describing the problem and its
loops, which the GPU passes read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from convbw_mlir.dialects import convbw
from convbw_mlir.passes.framework import ConvbwPass, collect_ops, option, register

from convbw_mlir.heuristics import Split
from convbw_mlir.ir_imports import arith_d, element_type, ir, linalg_d, rewrite, tensor_d
from convbw_mlir.problem import ConvBwdWeightProblem

__all__ = [
    "CONTRACTION_ATTR",
    "LowerToLinalg",
    "accumulator_dims",
    "build_contraction",
    "contraction_loops",
    "as_value",
    "drop_unit_dims",
    "merge_reduction_loops",
    "convert",
    "pad_by_gather",
    "pad_zeros",
    "reassociation",
    "transpose",
    "finish_dw",
]

PARALLEL = "#linalg.iterator_type<parallel>"
REDUCTION = "#linalg.iterator_type<reduction>"
CONTRACTION_ATTR = "convbw.contraction"


def accumulator_dims(problem: ConvBwdWeightProblem) -> tuple[str, ...]:
    """Dimension letters of the f32 accumulator: ``G K <filter> C`` (no G for G-less layouts)."""
    return problem.dims("acc")


def _loop_of(problem: ConvBwdWeightProblem, letter: str) -> str:
    """Accumulator letter -> loop name (g, k, f0.., c)."""
    if letter in "ZYX":
        filt = [d for d in problem.dims("dw") if d in "ZYX"]
        return f"f{filt.index(letter)}"
    return letter.lower()


def contraction_loops(problem: ConvBwdWeightProblem, split: Split | None = None) -> tuple[dict[str, int], int]:
    """The generic's loops in order, name -> extent, and how many of them are parallel.

    Parallel: ``s`` (split) if any, then g, k, f0.., c; reduction: n, o0..; loops of extent 1 are left
    out. A split loop's extent is its chunk; a rows split puts its loops (n, o0) first among the parallel
    ones instead of ``s``.
    """
    extents = {"g": problem.groups, "k": problem.out_channels, "c": problem.in_channels, "n": problem.batch}
    extents |= {f"f{i}": f for i, f in enumerate(problem.filter_size)}
    extents |= {f"o{i}": o for i, o in enumerate(problem.output_size)}
    promoted = list(split.promoted) if split else []
    if split and not promoted:
        extents[split.dim] = split.chunk
    parallel = [_loop_of(problem, a) for a in accumulator_dims(problem)]
    reduction = [name for name in ["n"] + [f"o{i}" for i in range(problem.rank)] if name not in promoted]
    loops: dict[str, int] = {"s": split.k_batch} if split and not promoted else {}
    loops |= {name: extents[name] for name in promoted if extents[name] > 1}
    loops |= {name: extents[name] for name in parallel if extents[name] > 1}
    n_parallel = len(loops)
    loops |= {name: extents[name] for name in reduction if extents[name] > 1}
    return loops, n_parallel


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


def dy_first(problem: ConvBwdWeightProblem, loops: list[str]) -> bool:
    """Operand order of the contraction: dy first for a GEMM (no filter loop, stride 1), x first otherwise.

    A GEMM is given as M (k, from dy) by N (c, from x), the operand order matching the accumulator's.
    IREE 3.13's f16 kernels for the x-first GEMM (accumulator [k, c] from operands (x, dy)) gave wrong dW
    on the H200 from sm_80 code (max error 1.3x the largest value, half of all elements wrong, for
    P x K x C = 25088 x 128 x 128 and 784 x 1024 x 1024), the dy-first form matched float64
    (bench/results/h200_2026-11-22_gemm_order.md). Convolutions keep x first: IREE fails to
    compile the dy-first conv form on every GPU target ("failed to pack reduction dimensions"), and a
    strided 1x1 (x read at o * stride) given dy first lost its matrix instructions on gfx1100 (IREE
    compiled it as a plain reduction).
    """
    return not any(name.startswith("f") for name in loops) and all(s == 1 for s in problem.stride)


def _zero(etype: ir.Type) -> ir.Value:
    return arith_d.ConstantOp(etype, ir.FloatAttr.get(etype, 0.0)).result


def pad_zeros(value: ir.Value, low: list[int], high: list[int]) -> ir.Value:
    """tensor.pad with zeros; ``value`` itself when nothing is padded."""
    if not any(low) and not any(high):
        return value
    src = value.type
    shape = [s + lo + hi for s, lo, hi in zip(src.shape, low, high)]
    pad = tensor_d.PadOp(ir.RankedTensorType.get(shape, src.element_type), value, [], [], low, high)
    block = pad.regions[0].blocks.append(*[ir.IndexType.get()] * len(shape))
    with ir.InsertionPoint(block):
        tensor_d.YieldOp(_zero(src.element_type))
    return pad.result


def pad_by_gather(value: ir.Value, low: list[int], high: list[int]) -> ir.Value:
    """Zero padding as an elementwise linalg.generic that reads ``value`` with tensor.extract.

    out[i] = value[i - low] where every padded index is in range, else 0. Same result as tensor.pad;
    the reason is speed: IREE 3.13 lowers tensor.pad to a "slow_memcpy" dispatch, which took 494 us for
    a 64x56x56x256 f16 x on the H200 (sm_80 code) where this form took 135 us, and 187 us vs 77 us for
    32x56x56x144 (ncu, bench/results/h200_2026-11-22_pad.md).
    """
    if not any(low) and not any(high):
        return value
    src = value.type
    shape = [s + lo + hi for s, lo, hi in zip(src.shape, low, high)]
    out_t = ir.RankedTensorType.get(shape, src.element_type)
    identity = ir.AffineMap.get_identity(len(shape))
    generic = linalg_d.GenericOp(
        [out_t],
        [],
        [tensor_d.EmptyOp(shape, src.element_type).result],
        ir.ArrayAttr.get([ir.AffineMapAttr.get(identity)]),
        ir.ArrayAttr.get([ir.Attribute.parse(PARALLEL)] * len(shape)),
    )
    index_t = ir.IndexType.get()
    block = generic.regions[0].blocks.append(src.element_type)
    with ir.InsertionPoint(block):
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
        linalg_d.YieldOp([arith_d.SelectOp(inside, read, _zero(src.element_type)).result])
    return generic.result


def _padded_inputs(
    problem: ConvBwdWeightProblem, split: Split | None, x: ir.Value, dy: ir.Value, frontend_form: bool = False
) -> tuple[ir.Value, ir.Value]:
    """Pad x by the problem's pads, and x and dy further where an uneven split reads past the end."""
    x_dims, dy_dims = problem.dims("x"), problem.dims("dy")
    x_low, x_high = [0] * len(x_dims), [0] * len(x_dims)
    dy_high = [0] * len(dy_dims)
    spatial = [s for s in x_dims if s in "DHW"]
    for i, letter in enumerate(spatial):
        pos = x_dims.index(letter)
        x_low[pos], x_high[pos] = problem.pad_low[i], problem.pad_high[i]
        out = problem.output_size[i]
        if split and split.dim == f"o{i}":
            out = split.padded_extent
            dy_high[dy_dims.index(letter)] = out - problem.output_size[i]
        # The last x row read, + 1, against the padded extent (an uneven split reads further).
        needed = (out - 1) * problem.stride[i] + (problem.filter_size[i] - 1) * problem.dilation[i] + 1
        have = problem.input_size[i] + problem.pad_low[i] + problem.pad_high[i]
        x_high[pos] += max(0, needed - have)
    if split and split.dim == "n":
        extra = split.padded_extent - problem.batch
        x_high[x_dims.index("N")] += extra
        dy_high[dy_dims.index("N")] += extra
    pad = pad_zeros if frontend_form else pad_by_gather
    x, dy = pad(x, x_low, x_high), pad(dy, [0] * len(dy_dims), dy_high)
    if split and not split.promoted:
        # The split dimension becomes [k_batch, chunk] in dy (and in x for a batch split), so that linalg
        # sees both loops as plain dimensions of an operand (loop ranges are inferred from operand shapes)
        # and, for a batch split, IREE still recognises a convolution (with s as one more batch loop).
        letter = "N" if split.dim == "n" else spatial[int(split.dim[1:])]
        dy = _expand_dim(dy, dy_dims.index(letter), split)
        if letter == "N":
            x = _expand_dim(x, x_dims.index("N"), split)
    return x, dy


def _expand_dim(value: ir.Value, pos: int, split: Split) -> ir.Value:
    """tensor.expand_shape of dimension ``pos`` into [k_batch, chunk]."""
    shape = list(value.type.shape)
    rank = len(shape)
    shape[pos : pos + 1] = [split.k_batch, split.chunk]
    groups = [[i] for i in range(pos)] + [[pos, pos + 1]] + [[i + 1] for i in range(pos + 1, rank)]
    out_t = ir.RankedTensorType.get(shape, value.type.element_type)
    return tensor_d.ExpandShapeOp(out_t, value, reassociation(groups), [], shape).result


def drop_unit_dims(value: ir.Value, amap: ir.AffineMap) -> tuple[ir.Value, ir.AffineMap]:
    """Collapse away the operand's unit dimensions indexed by the constant 0 (G=1, a chunk of 1, ...).

    IREE folds such dimensions itself, but by rebuilding the linalg.generic, and the rebuilt op has
    lost every attribute of ours, ``compilation_info`` included: 39 kernels of the 2026-11-22 ISA matrix
    ran IREE's own tile for that reason (bench/results/isa_2026-11-22.md, the ``i`` cells). Without
    unit dimensions there is nothing to fold and the op reaches codegen as built.
    """
    shape = list(value.type.shape)
    exprs = list(amap.results)
    zero = ir.AffineConstantExpr.get(0)
    keep = [not (size == 1 and e == zero) for size, e in zip(shape, exprs)]
    if all(keep):
        return value, amap
    out_t = ir.RankedTensorType.get([s for s, k in zip(shape, keep) if k], value.type.element_type)
    collapsed = tensor_d.CollapseShapeOp(out_t, value, reassociation(_unit_groups(keep))).result
    return collapsed, ir.AffineMap.get(amap.n_dims, amap.n_symbols, [e for e, k in zip(exprs, keep) if k])


def _unit_groups(kept: list[bool]) -> list[list[int]]:
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


def merge_reduction_loops(
    operands: list[ir.Value], maps: list[ir.AffineMap], loops: dict[str, int], n_parallel: int
) -> tuple[list[ir.Value], list[ir.AffineMap], dict[str, int]]:
    """Merge consecutive reduction loops that every input reads as adjacent plain dimensions.

    A GEMM's batch and output loops (``n``, ``o0``) are such a pair in channels-last layouts. IREE 3.13
    merges them itself (dimension collapsing at dispatch creation), but by rebuilding the generic, which
    drops ``compilation_info`` (CK's ck1d_a for gfx1100 ran IREE's own tile and spilled 492 B).
    Merged here, the op reaches codegen as built. The merged loop is named ``a*b`` (``n*o0``) and the
    inputs are collapsed to match; ``maps`` ends with the accumulator's, which holds no reduction loop.
    """
    names = list(loops)
    inputs, acc_map = maps[:-1], maps[-1]
    for i in range(n_parallel, len(names) - 1):
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
        shift = ir.AffineMap.get(len(names), 0, [ir.AffineDimExpr.get(k - (k > i)) for k in range(len(names))])
        new_maps = [ir.AffineMap.get(len(names) - 1, 0, [e.compose(shift) for e in res])
                    for res in [*results, list(acc_map.results)]]  # fmt: skip
        merged = {name: loops[name] for name in names[:i]}
        merged[f"{names[i]}*{names[i + 1]}"] = loops[names[i]] * loops[names[i + 1]]
        merged |= {name: loops[name] for name in names[i + 2 :]}
        return merge_reduction_loops(values, new_maps, merged, n_parallel)
    return operands, maps, loops


def _reads_adjacent(amap: ir.AffineMap, i: int) -> bool:
    """Whether ``amap`` reads loops i and i + 1 as two adjacent plain results (d_i, d_i+1) and nowhere else."""
    res = list(amap.results)
    a, b = ir.AffineDimExpr.get(i), ir.AffineDimExpr.get(i + 1)
    if a not in res or res.index(a) + 1 >= len(res) or res[res.index(a) + 1] != b:
        return False
    used = re.compile(rf"\bd({i}|{i + 1})\b")
    return sum(len(used.findall(str(e))) for e in res) == 2


def as_value(v: ir.Value | ir.OpView) -> ir.Value:
    """The single result of a builder that returns the op (or already the value)."""
    return v if isinstance(v, ir.Value) else v.operation.results[0]


def reassociation(groups: list[list[int]]) -> ir.ArrayAttr:
    """The reassociation attribute of tensor.expand_shape / collapse_shape."""
    i64 = ir.IntegerType.get_signless(64)
    return ir.ArrayAttr.get([ir.ArrayAttr.get([ir.IntegerAttr.get(i64, i) for i in g]) for g in groups])


def transpose(value: ir.Value, perm: list[int]) -> ir.Value:
    """linalg.transpose of ``value`` into a new tensor, result dimension i = source dimension perm[i]."""
    shape = [value.type.shape[i] for i in perm]
    out = tensor_d.EmptyOp(shape, value.type.element_type)
    return as_value(linalg_d.transpose(value, outs=[out.result], permutation=perm))


def _expand_units(value: ir.Value, full_shape: list[int]) -> ir.Value:
    """tensor.expand_shape re-inserting the unit dimensions left out of ``value`` (exactly the 1s)."""
    if list(value.type.shape) == full_shape:
        return value
    out_t = ir.RankedTensorType.get(full_shape, value.type.element_type)
    groups = _unit_groups([size > 1 for size in full_shape])
    return tensor_d.ExpandShapeOp(out_t, value, reassociation(groups), [], full_shape).result


def convert(src: ir.Value, to: ir.Type) -> ir.Value:
    """Elementwise float conversion (arith.truncf or extf) as its own linalg.generic; ``src`` if equal."""
    src_t = src.type
    if src_t.element_type == to:
        return src
    empty = tensor_d.EmptyOp(src_t.shape, to)
    ident = ir.AffineMapAttr.get(ir.AffineMap.get_identity(src_t.rank))
    op = linalg_d.GenericOp(
        [empty.result.type], [src], [empty.result], ir.ArrayAttr.get([ident, ident]),
        ir.ArrayAttr.get([ir.Attribute.parse(PARALLEL)] * src_t.rank),
    )  # fmt: skip
    block = op.regions[0].blocks.append(src_t.element_type, to)
    widen = ir.FloatType(to).width > ir.FloatType(src_t.element_type).width
    with ir.InsertionPoint(block):
        cast = arith_d.ExtFOp if widen else arith_d.TruncFOp
        linalg_d.YieldOp([cast(to, block.arguments[0]).result])
    return op.result


def finish_dw(problem: ConvBwdWeightProblem, acc: ir.Value) -> ir.Value:
    """The f32 accumulator ``[g, k, f..., c]`` -> dW: truncf where needed, transpose to dW's layout."""
    dw = acc
    if problem.dw_dtype != "f32":
        dw = convert(dw, element_type(problem.dw_dtype))
    letters = accumulator_dims(problem)
    perm = [letters.index(letter) for letter in problem.dims("dw")]
    if perm != list(range(len(perm))):
        dw = transpose(dw, perm)
    return dw


def contraction_attr(problem: ConvBwdWeightProblem, split: Split | None, loops: dict[str, int]) -> ir.Attribute:
    """``convbw.contraction``: the problem, its loops (names and extents, in order) and ``k_batch``."""
    i64 = ir.IntegerType.get_signless(64)
    entries = {
        "problem": convbw.problem_attr(problem),
        "loops": ir.ArrayAttr.get([ir.StringAttr.get(n) for n in loops]),
        "extents": ir.DenseI64ArrayAttr.get(list(loops.values())),
        "k_batch": ir.IntegerAttr.get(i64, split.k_batch if split else 1),
    }
    return ir.DictAttr.get(entries)


def build_contraction(
    problem: ConvBwdWeightProblem, x: ir.Value, dy: ir.Value, split: Split | None = None, frontend_form: bool = False
) -> ir.Value:
    """Build the linalg form at the current insertion point.

    Returns dW in its layout and type, or with a split, the f32 partial sums ``[k_batch, g, k, f..., c]``.
    ``frontend_form``: tensor.pad and x first for every contraction, the plain form a frontend would hand
    IREE (the benchmark's IREE-default contender and the GPU reference), instead of the gather pad and
    the dy-first GEMM.
    """
    f32 = ir.F32Type.get()
    loops, n_parallel = contraction_loops(problem, split)
    names = list(loops)
    sizes = dict(zip(problem.dims("dw"), problem.dw_shape))
    full_acc = ([split.k_batch] if split else []) + [sizes[a] for a in accumulator_dims(problem)]
    acc_shape = [loops[n] for n in names[:n_parallel]]
    empty = tensor_d.EmptyOp(acc_shape, f32)
    init = as_value(linalg_d.fill(_zero(f32), outs=[empty.result]))
    x_in, dy_in = _padded_inputs(problem, split, x, dy, frontend_form)
    swap = dy_first(problem, names) and not frontend_form
    iterators = [PARALLEL] * n_parallel + [REDUCTION] * (len(names) - n_parallel)
    first_map, second_map, acc_map = _maps(problem, split, names, n_parallel, swap)
    first, first_map = drop_unit_dims(dy_in if swap else x_in, first_map)
    second, second_map = drop_unit_dims(x_in if swap else dy_in, second_map)
    (first, second), (first_map, second_map, acc_map), loops = merge_reduction_loops(
        [first, second], [first_map, second_map, acc_map], loops, n_parallel
    )
    iterators = iterators[: len(loops)]
    generic = linalg_d.GenericOp(
        [ir.RankedTensorType.get(acc_shape, f32)],
        [first, second],
        [init],
        ir.ArrayAttr.get([ir.AffineMapAttr.get(m) for m in (first_map, second_map, acc_map)]),
        ir.ArrayAttr.get([ir.Attribute.parse(it) for it in iterators]),
    )
    generic.operation.attributes[CONTRACTION_ATTR] = contraction_attr(problem, split, loops)
    in_t = element_type(problem.dtype)
    block = generic.regions[0].blocks.append(in_t, in_t, f32)
    with ir.InsertionPoint(block):
        a, b, acc = block.arguments
        if problem.dtype != "f32":
            a, b = arith_d.ExtFOp(f32, a).result, arith_d.ExtFOp(f32, b).result
        linalg_d.YieldOp([arith_d.AddFOp(acc, arith_d.MulFOp(a, b).result).result])
    result = generic.result
    if split and sum(loops.get(name, 1) > 1 for name in split.promoted) > 1:  # [n, o0, ...] -> [n * o0, ...]
        shape = list(result.type.shape)
        flat = ir.RankedTensorType.get([shape[0] * shape[1], *shape[2:]], f32)
        groups = [[0, 1]] + [[i] for i in range(2, len(shape))]
        result = tensor_d.CollapseShapeOp(flat, result, reassociation(groups)).result
    result = _expand_units(result, full_acc)
    return result if split else finish_dw(problem, result)


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
            problem, split = convbw.problem_of(op), convbw.split_of(op)
            with rewriter.ip, op.location:
                dw = build_contraction(problem, op.operands[0], op.operands[1], split, self.options.frontend_form)
            rewriter.replace_op(op, [dw])
            return False  # matched

        patterns = rewrite.RewritePatternSet()
        patterns.add(convbw.OP_NAME, lower)
        rewrite.apply_patterns_and_fold_greedily(module, patterns.freeze())
