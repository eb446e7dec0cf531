"""convbw-raise{remarks=false}: find each weight-gradient convolution written in linalg and replace it by
``convbw.conv_bwd_weight``; everything else stays as it is.

    %xp = tensor.pad %x low[0, 0, 0, 1, 1] high[0, 0, 0, 1, 1] { yield 0.0 }      (folded into the pads)
    %z  = linalg.fill ins(0.0) outs(tensor.empty)                                 (the zero accumulator)
    %dw = linalg.generic {maps: x (n, g, c, y*dil + o*stride, ...), dy (n, g, k, o...), dW (g, k, c, y...);
                          body: [extf], mulf, addf} ins(%xp, %dy) outs(%z)
    %h  = linalg.generic {truncf} ins(%dw)                                        (folded into dW's type)
  ->
    %h  = convbw.conv_bwd_weight(%x, %dy) {layout = "NGCHW/GKCYX/NGKHW", strides, dilations, pads, groups}

This is the form IREE's torch input conversion gives ``aten.convolution_backward``'s weight gradient
(DESIGN.md "what a frontend's weight gradient looks like in linalg"), and any generic whose maps and body are
a grouped weight gradient in one of our layouts (:data:`convbw_mlir.problem.LAYOUTS`). The match is
structural: the loops' roles come from where each loop appears (n and the output positions reduced, g/k/c and
the filter taps parallel, each tap added to its output position in x's map with the dilation and stride as
coefficients), and the layout from the order of the maps' results. A contraction that is not one (a forward
convolution or a data gradient reads its operands in an order none of our layouts has; a plain matmul has no
window) is left alone, and with ``remarks=true`` a remark at its location says why. A named convolution op
(``linalg.conv_*``, ``linalg.depthwise_conv_*``) is matched through its generalization, made on a copy: a weight
gradient written as a forward convolution of transposed x and dy (N and C swapped, the stride as the dilation),
between transposes, is raised; IREE's input conversion writes generics (docs/decisions.md#raise).
"""

from __future__ import annotations

from dataclasses import dataclass

from convbw_mlir.dialects import convbw
from convbw_mlir.passes.framework import ConvbwPass, collect_ops, option, register

from convbw_mlir.ir_imports import func_d, ir, passmanager
from convbw_mlir.problem import LAYOUTS, ConvBwdWeightProblem

__all__ = ["Match", "NotRaised", "RaisePass", "match_generic"]

_FOLDED = ("tensor.pad", "linalg.transpose", "linalg.fill")  # producers a raise may leave unused
_NAMED_CONVS = ("linalg.conv_", "linalg.depthwise_conv_")  # named ops matched through their generalization
_TYPES = {"f16": "f16", "bf16": "bf16", "f32": "f32"}  # MLIR element type -> ours (the types frontends write)


class NotRaised(Exception):
    """A contraction that is not a weight gradient we take; the message says why (the remark)."""


@dataclass(frozen=True)
class Match:
    """A raised contraction: the problem, the operands it reads (x before its pad and transpose) and the ops it
    replaces, users first: the first one's result is dW (the contraction, or the transpose and truncf after it)."""

    problem: ConvBwdWeightProblem
    x: ir.Value
    dy: ir.Value
    chain: tuple[ir.Operation, ...]


def _linear(expr: ir.AffineExpr) -> tuple[dict[int, int], int] | None:
    """``expr`` as ({dim: coefficient}, constant), or None if it is not a linear form of dims."""
    if isinstance(expr, ir.AffineDimExpr):
        return {expr.position: 1}, 0
    if isinstance(expr, ir.AffineConstantExpr):
        return {}, expr.value
    if isinstance(expr, ir.AffineAddExpr):
        add = expr
        lhs, rhs = _linear(add.lhs), _linear(add.rhs)
        if lhs is None or rhs is None:
            return None
        terms = dict(lhs[0])
        for d, c in rhs[0].items():
            terms[d] = terms.get(d, 0) + c
        return terms, lhs[1] + rhs[1]
    if isinstance(expr, ir.AffineMulExpr):
        mul = expr
        lhs, rhs = _linear(mul.lhs), _linear(mul.rhs)
        if lhs is None or rhs is None:
            return None
        if not lhs[0]:
            lhs, rhs = rhs, lhs
        if rhs[0]:
            return None  # a product of two dims
        return {d: c * rhs[1] for d, c in lhs[0].items()}, lhs[1] * rhs[1]
    return None


def _is_zero_constant(value: ir.Value) -> bool:
    """Whether ``value`` is an ``arith.constant`` 0.0 (scalar) or a dense splat of zeros."""
    owner = value.owner
    if not isinstance(owner, ir.OpView) and not isinstance(owner, ir.Operation):
        return False
    op = owner.operation
    if op.name != "arith.constant":
        return False
    attr = op.attributes["value"]
    if isinstance(attr, ir.FloatAttr):
        return attr.value == 0.0
    if isinstance(attr, ir.DenseFPElementsAttr):
        dense = attr
        return dense.is_splat and dense.get_splat_value().value == 0.0
    return False


def _defining(value: ir.Value, name: str) -> ir.Operation | None:
    owner = value.owner
    if isinstance(owner, ir.Block):
        return None
    return owner.operation if owner.operation.name == name else None


def _body_types(op: ir.Operation) -> str:
    """Check the body is ``[extf a], [extf b], mulf, addf out, yield``; return the inputs' element type."""
    block = op.regions[0].blocks[0]
    a, b, out = block.arguments
    ops = list(block.operations)
    names = [o.operation.name for o in ops]
    extended: dict[ir.Value, ir.Value] = {}
    for o in ops[:-3]:
        if o.operation.name != "arith.extf" or o.operands[0] not in (a, b):
            raise NotRaised(f"the body is not a multiply-accumulate ({', '.join(names)})")
        extended[o.results[0]] = o.operands[0]
    if names[-3:] != ["arith.mulf", "arith.addf", "linalg.yield"]:
        raise NotRaised(f"the body is not a multiply-accumulate ({', '.join(names)})")
    mul, add, yld = ops[-3], ops[-2], ops[-1]
    if {extended.get(v, v) for v in mul.operands} != {a, b} or len(list(mul.operands)) != 2:
        raise NotRaised("the body's product does not multiply the two inputs")
    if set(add.operands) != {mul.results[0], out} or yld.operands[0] != add.results[0]:
        raise NotRaised("the body does not accumulate the product into the output")
    ta, tb, tout = (str(v.type) for v in (a, b, out))
    if ta != tb or ta not in _TYPES:
        raise NotRaised(f"inputs of types {ta} and {tb}: a weight gradient reads x and dy of one type (f16, bf16, f32)")
    if tout not in ("f32", ta):
        raise NotRaised(f"accumulates in {tout}, neither f32 nor the inputs' type {ta}")
    return ta


def _truncf_user(result: ir.Value, dtype: str) -> ir.Operation | None:
    """The elementwise generic that truncates ``result`` (f32) to ``dtype``, where that is its one use."""
    uses = list(result.uses)
    if dtype == "f32" or len(uses) != 1:
        return None
    user = uses[0].owner.operation
    if user.name != "linalg.generic" or len(user.operands) != 2 or user.operands[0] != result:
        return None
    maps = [m.value for m in user.attributes["indexing_maps"]]
    if not all(m.is_permutation and m == ir.AffineMap.get_identity(m.n_dims) for m in maps):
        return None
    body = [o.operation for o in user.regions[0].blocks[0].operations]
    if [o.name for o in body] != ["arith.truncf", "linalg.yield"] or str(body[0].results[0].type) != dtype:
        return None
    return user


def _through_transpose(value: ir.Value, read: ir.AffineMap) -> tuple[ir.Value, ir.AffineMap]:
    """``(source, map)`` where ``value`` is a ``linalg.transpose`` of source: the generic's reads of the
    transposed tensor as reads of its source (the copy only relayouts); else ``(value, read)``."""
    transpose = _defining(value, "linalg.transpose")
    if transpose is None:
        return value, read
    perm = list(transpose.attributes["permutation"])  # result dim i is source dim perm[i]
    results = [None] * len(perm)
    for i, j in enumerate(perm):
        results[j] = read.results[i]
    return transpose.operands[0], ir.AffineMap.get(read.n_dims, read.n_symbols, results)


def _into_transpose(op: ir.Operation, write: ir.AffineMap) -> tuple[ir.Operation, ir.AffineMap] | None:
    """``(transpose, map)`` where ``op``'s one use is a ``linalg.transpose``: the contraction's writes as writes
    of the transposed tensor; else None."""
    uses = list(op.results[0].uses)
    if len(uses) != 1 or uses[0].owner.operation.name != "linalg.transpose" or uses[0].operand_number != 0:
        return None
    transpose = uses[0].owner.operation
    perm = list(transpose.attributes["permutation"])  # result dim i is the contraction's dim perm[i]
    return transpose, ir.AffineMap.get(write.n_dims, write.n_symbols, [write.results[j] for j in perm])


def match_generic(op: ir.Operation, structure: ir.Operation | None = None) -> Match:
    """The weight gradient ``op`` computes, reading x and dy through the ``linalg.transpose`` ops that produce
    them and writing dW through the one that transposes its result, where that gives one of our layouts.

    Args:
        op: a ``linalg.generic``, or a named convolution op.
        structure: the ``linalg.generic`` that describes a named ``op`` (its generalization); None for a generic.

    Raises:
        NotRaised: a contraction that is not one we take, saying why (as written, transposes not folded).
    """
    structure = structure or op
    if len(op.operands) != 3 or len(op.results) != 1:
        inputs = len(op.operands) - len(op.results)
        raise NotRaised(f"takes {inputs} inputs and gives {len(op.results)} results, not x, dy -> dW")
    maps = [m.value for m in structure.attributes["indexing_maps"]]
    values = list(op.operands)
    read = [_through_transpose(values[i], maps[i]) for i in (0, 1)]
    ins = ([v for v, _ in read], [m for _, m in read]) if any(v != values[i] for i, (v, _) in enumerate(read)) else None
    written = _into_transpose(op, maps[2])
    tries = []  # most folded first: each folded transpose is a copy fewer; as written last
    for in_fold in (ins, None) if ins else (None,):
        for out_fold in (written, None) if written else (None,):
            tries.append((in_fold, out_fold))
    for in_fold, out_fold in tries:
        in_values, in_maps = in_fold if in_fold else (values[:2], maps[:2])
        out_op, out_map = out_fold if out_fold else (op, maps[2])
        try:
            return _match(structure, out_op, [*in_values, values[2]], [*in_maps, out_map], op)
        except NotRaised:
            if (in_fold, out_fold) == tries[-1]:
                raise
    raise AssertionError("unreachable")  # the last try raises


def _match(structure: ir.Operation, out_op: ir.Operation, values: list[ir.Value], maps: list[ir.AffineMap],
           op: ir.Operation) -> Match:  # fmt: skip
    """``structure``'s loops and body, with ``values`` read through ``maps``; dW is ``out_op``'s result."""
    iterators = [str(t) for t in structure.attributes["iterator_types"]]
    reduction = {i for i, t in enumerate(iterators) if "reduction" in t}
    if not reduction:
        raise NotRaised("no reduction loop")
    dtype = _body_types(structure)
    out_map = maps[2]
    if not out_map.is_projected_permutation:
        raise NotRaised("the output map is not a projection of the loops")
    out_dims = [e.position for e in out_map.results]
    if set(out_dims) != set(range(out_map.n_dims)) - reduction:
        raise NotRaised("the output is not indexed by exactly the parallel loops")
    forms = [[_linear(e) for e in m.results] for m in maps[:2]]
    if any(f is None for fs in forms for f in fs):
        raise NotRaised("an input map is not linear in the loops")
    windowed = [i for i in (0, 1) if any(len(t) > 1 or any(c != 1 for c in t.values()) for t, _ in forms[i])]
    if len(windowed) != 1:
        why = "no input reads a sliding window (a plain contraction)" if not windowed else "both inputs read windows"
        raise NotRaised(why)
    xi = windowed[0]
    dyi = 1 - xi
    if not maps[dyi].is_projected_permutation:
        raise NotRaised("dy's map is not a projection of the loops")
    dy_dims = [e.position for e in maps[dyi].results]
    x_plain, pairs = [], []  # pairs: (filter loop, dilation, output loop, stride) in x's order
    for terms, const in forms[xi]:
        if const:
            raise NotRaised(f"x's map adds a constant offset {const}")
        if len(terms) == 1 and list(terms.values()) == [1]:
            x_plain.append(next(iter(terms)))
            continue
        par = [(d, c) for d, c in terms.items() if d not in reduction]
        red = [(d, c) for d, c in terms.items() if d in reduction]
        if len(par) != 1 or len(red) != 1 or par[0][1] <= 0 or red[0][1] <= 0:
            raise NotRaised(
                "an x index is not one filter tap times the dilation plus one output position times the stride"
            )
        pairs.append((par[0][0], par[0][1], red[0][0], red[0][1]))
    rank = len(pairs)
    if rank not in (1, 2, 3):
        raise NotRaised(f"{rank} window dimensions (a convolution has 1 to 3)")
    filters, outputs = [p[0] for p in pairs], [p[2] for p in pairs]
    if len(set(filters)) != rank or len(set(outputs)) != rank:
        raise NotRaised("a filter tap or output position loop indexes two window dimensions of x")
    roles: dict[int, str] = {}
    for i, f in enumerate(filters):
        roles[f] = "ZYX"[3 - rank + i]
    for i, o in enumerate(outputs):
        roles[o] = "DHW"[3 - rank + i]
    for d in range(out_map.n_dims):
        if d in roles:
            if d in x_plain or (d in filters and d in dy_dims) or (d in outputs and d not in dy_dims):
                raise NotRaised(f"loop d{d} of the window is read as a plain index too")
            continue
        in_x, in_dy, in_out = d in x_plain, d in dy_dims, d in out_dims
        role = {(True, True, False): "N", (True, True, True): "G", (False, True, True): "K",
                (True, False, True): "C"}.get((in_x, in_dy, in_out))  # fmt: skip
        if role is None:
            raise NotRaised(f"loop d{d} is not a batch, group, channel or window loop of a weight gradient")
        if role in roles.values():
            raise NotRaised(f"two loops play the role {role}")
        roles[d] = role
    for role in "NKC":
        if role not in roles.values():
            raise NotRaised(f"no loop plays the role {role}")
    window_of = {o: "DHW"[3 - rank + i] for i, o in enumerate(outputs)}
    x_letters = []
    spatial = iter("DHW"[3 - rank :])
    for terms, _ in forms[xi]:
        x_letters.append(roles[next(iter(terms))] if len(terms) == 1 and list(terms.values()) == [1] else next(spatial))
    x_name = "".join(x_letters)
    dy_name = "".join(roles[d] if d not in window_of else window_of[d] for d in dy_dims)
    w_name = "".join(roles[d] for d in out_dims)
    name = f"{x_name}/{w_name}/{dy_name}"
    if not any(layout.spelled(rank) == name for layout in LAYOUTS.values()):
        raise NotRaised(f"x/dW/dy read as {name}, not a weight-gradient layout (a forward convolution or a data "
                        "gradient reads this way)")  # fmt: skip
    return _problem(op, out_op, values, maps, xi, dyi, roles, pairs, name, dtype)


def _problem(op, out_op, values, maps, xi, dyi, roles, pairs, name, dtype) -> Match:  # noqa: ANN001 - _match's
    x, dy = values[xi], values[dyi]
    init = values[2]
    fill = _defining(init, "linalg.fill")
    if not (fill is not None and _is_zero_constant(fill.operands[0])) and not _is_zero_constant(init):
        raise NotRaised("accumulates onto a tensor that is not zero-filled")
    rank = len(pairs)
    pad_low, pad_high = [0] * rank, [0] * rank
    pad = _defining(x, "tensor.pad")
    x_shape = list(x.type.shape)
    spatial_at = [i for i, e in enumerate(maps[xi].results) if not isinstance(e, ir.AffineDimExpr)]
    if pad is not None and len(pad.operands) == 1:
        low, high = (list(pad.attributes[a]) for a in ("static_low", "static_high"))
        body = [o.operation for o in pad.regions[0].blocks[0].operations]
        zero_pad = len(body) == 1 and body[0].name == "tensor.yield" and _is_zero_constant(body[0].operands[0])
        plain_padded = any(low[i] or high[i] for i in range(len(low)) if i not in spatial_at)
        if zero_pad and not plain_padded:
            pad_low = [low[i] for i in spatial_at]
            pad_high = [high[i] for i in spatial_at]
            x = pad.operands[0]
            x_shape = list(x.type.shape)
    dy_shape = list(dy.type.shape)
    w_shape = list(out_op.results[0].type.shape)
    size = {}
    for shape, m in ((x_shape, maps[xi]), (dy_shape, maps[dyi]), (w_shape, maps[2])):
        for extent, e in zip(shape, m.results):
            if isinstance(e, ir.AffineDimExpr):
                size[roles[e.position]] = extent
    input_size = [x_shape[i] for i in spatial_at]
    filters = [size[roles[f]] for f, _, _, _ in pairs]
    for i, (_, dil, o, stride) in enumerate(pairs):
        out = size[roles[o]]
        span = dil * (filters[i] - 1) + 1
        total = input_size[i] + pad_low[i] + pad_high[i]
        excess = total - ((out - 1) * stride + span) - (stride - 1)  # rows past the last window
        if excess > 0:
            if excess > pad_high[i]:
                raise NotRaised(f"x holds {excess - pad_high[i]} more elements along {name.split('/')[0]}'s "
                                f"window {i} than the windows read")  # fmt: skip
            pad_high[i] -= excess
    out_type = str(out_op.results[0].type.element_type)
    chain = (out_op, op) if out_op != op else (op,)
    trunc = _truncf_user(out_op.results[0], dtype) if out_type == "f32" else None
    if trunc is not None:
        chain, out_type = (trunc, *chain), dtype
    try:
        problem = ConvBwdWeightProblem(
            groups=size.get("G", 1), batch=size["N"], in_channels=size["C"], out_channels=size["K"],
            input_size=input_size, filter_size=filters, stride=[p[3] for p in pairs],
            dilation=[p[1] for p in pairs], pad_low=pad_low, pad_high=pad_high, dtype=dtype,
            dw_dtype=out_type, layout=name,
        )  # fmt: skip
    except (ValueError, TypeError) as e:
        raise NotRaised(f"not a valid problem: {e}") from None
    if problem.output_size != tuple(size[roles[p[2]]] for p in pairs):
        raise NotRaised(f"dy's window sizes {[size[roles[p[2]]] for p in pairs]} are not the convolution's "
                        f"output {list(problem.output_size)}")  # fmt: skip
    return Match(problem, x, dy, chain)


@register
class RaisePass(ConvbwPass):
    argument = "convbw-raise"
    description = (
        "Replace each linalg.generic or named convolution op that computes a grouped convolution's weight gradient "
        "(as IREE's torch input conversion writes it, or any layout of ours; a zero tensor.pad of x folded into the "
        "pads, relayout transposes and a truncf into dW's type) by convbw.conv_bwd_weight; leave everything else "
        "untouched."
    )

    @dataclass
    class Options:
        remarks: bool = option(False, "emit a remark at each contraction left alone, saying why")

    def run(self, module: ir.Operation) -> None:
        ctx = module.context
        if self.options.remarks and not ctx.remarks_enabled:  # printed as MLIR remark diagnostics
            ctx.enable_remarks(missed_filter=self.argument)
        for op in _candidates(module):
            structure = None
            try:
                if op.name != "linalg.generic":
                    scratch, structure = _generalized(op)
                match = match_generic(op, structure)
            except NotRaised as e:
                if self.options.remarks and _is_contraction(structure or op):
                    op.location.emit_remark(ir.RemarkKind.MISSED, "not-raised", category=self.argument,
                                            message=f"not raised: {e}")  # fmt: skip
                continue
            self._replace(op, match)

    def _replace(self, op: ir.Operation, match: Match) -> None:
        dw = match.chain[0]
        with ir.InsertionPoint(dw), op.location:
            new = convbw.build_op(match.problem, match.x, match.dy, op.location)
        dw.results[0].replace_all_uses_with(new.results[0])
        producers: list[ir.Operation] = []
        for found in (_defining(v, name) for v in op.operands for name in _FOLDED):
            if found is not None and not any(found == p for p in producers):  # one op may feed two operands
                producers.append(found)
        for o in match.chain:  # users first: the truncf, the transpose, then the contraction
            o.erase()
        for producer in producers:  # what the match folded (pad, transposes, the zero fill), where now unused
            if not any(True for _ in producer.results[0].uses):
                producer.erase()


def _candidates(module: ir.Operation) -> list[ir.Operation]:
    """The generics and named convolution ops of ``module``, in pre-order."""
    found: list[ir.Operation] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        name = op.name
        if name == "linalg.generic" or name.startswith(_NAMED_CONVS):
            found.append(op.operation)
        return ir.WalkResult.ADVANCE

    module.walk(visit, ir.WalkOrder.PRE_ORDER)
    return found


def _generalized(op: ir.Operation) -> tuple[ir.Module, ir.Operation]:
    """A scratch module holding ``op``'s generalization (``linalg-generalize-named-ops`` on a copy): its maps and
    body say what the named op computes; the module must outlive the generic. ``op`` is not touched."""
    scratch = ir.Module.create(op.location)
    with ir.InsertionPoint(scratch.body), op.location:
        types = [v.type for v in op.operands]
        fn = func_d.FuncOp("scratch", ir.FunctionType.get(types, [r.type for r in op.results]))
        block = fn.add_entry_block()
        with ir.InsertionPoint(block):
            copy = op.clone()
            for i, arg in enumerate(block.arguments):
                copy.operands[i] = arg
            func_d.ReturnOp(list(copy.results))
    try:
        passmanager.PassManager.parse("builtin.module(func.func(linalg-generalize-named-ops))").run(scratch.operation)
    except ir.MLIRError as e:
        raise NotRaised(f"{op.name} does not generalize: {e}") from None
    generics = collect_ops(scratch.operation, "linalg.generic")
    if len(generics) != 1:
        raise NotRaised(f"{op.name} generalizes to {len(generics)} generics")
    return scratch, generics[0]


def _is_contraction(op: ir.Operation) -> bool:
    """A generic (or a named op's generalization) with a reduction loop and two inputs: worth a remark."""
    iterators = [str(t) for t in op.attributes["iterator_types"]]
    return len(op.operands) == 3 and any("reduction" in t for t in iterators)
