"""The ``convbw`` dialect: one op, ``convbw.conv_bwd_weight``.

    %dw = "convbw.conv_bwd_weight"(%x, %dy) {strides = array<i64: 1, 1>, dilations = array<i64: 1, 1>,
            pad_low = array<i64: 1, 1>, pad_high = array<i64: 1, 1>, groups = 2 : i64,
            layout = "NHWGC/GKYXC/NHWGK"} : (tensor<4x14x14x2x8xf16>, tensor<4x14x14x2x16xf16>)
            -> tensor<2x16x3x3x8xf16>

x and dy are operands, dW the result; the op's types carry N, C, K, the input and filter sizes and the
element types, its attributes the rest. A problem with an epilogue (:class:`convbw_mlir.problem.Epilogue`)
carries it as ``epilogue = {kind = "bilinear", alpha = 2.0 : f64, beta = 2.0 : f64}`` and, for bilinear
and accumulate, a third operand D in dW's layout (its element type is D's type); the split-K's first stage
never carries it (the epilogue belongs to the stage that writes dW).
``convbw-plan`` adds ``plan = {strategy = "mma", target = ...}`` (:class:`convbw_mlir.plan.Plan` as a
dictionary); ``convbw-split-k`` adds ``k_batch``, ``split_dim`` and ``split_chunk`` to the first stage
of a split. IREE's Python bindings register no IRDL, so the op lives as an
unregistered op in generic form: contexts that hold it allow unregistered dialects, and
:func:`verify_op` stands in for an ODS verifier, reporting through MLIR diagnostics at the op's location.
That detail stays inside this module: the rest of the code builds, reads and checks the op through it.
"""

from __future__ import annotations

from typing import Any

from convbw_mlir.ir_imports import func_d, ir
from convbw_mlir.loops import Split, check_split
from convbw_mlir.problem import ConvBwdWeightProblem

__all__ = [
    "EPILOGUE_ATTR",
    "OP_NAME",
    "PLAN_ATTR",
    "build_module",
    "build_op",
    "dict_attr",
    "dict_from_attr",
    "epilogue_attr",
    "epilogue_of",
    "is_conv_bwd_weight",
    "problem_attr",
    "problem_from_attr",
    "plan_of",
    "problem_of",
    "set_plan",
    "split_of",
    "tensor_type",
    "verify_op",
]

OP_NAME = "convbw.conv_bwd_weight"
PLAN_ATTR = "plan"
EPILOGUE_ATTR = "epilogue"
#: The argument attribute tying the accumulate epilogue's D to the result (the caller's buffer).
OUTPUT_ARG_ATTR = "iree.abi.output"
FUNC_NAME = "conv_bwd_weight"
_ARRAY_ATTRS = ("strides", "dilations", "pad_low", "pad_high")
_FIELDS = {"strides": "stride", "dilations": "dilation", "pad_low": "pad_low", "pad_high": "pad_high"}
_TYPE_NAMES = {"f16": "f16", "bf16": "bf16", "f32": "f32", "f8E4M3FN": "e4m3", "f8E5M2": "e5m2"}  # MLIR -> ours


class OpError(ValueError):
    """The op does not describe a valid problem; the message says why."""


def tensor_type(problem: ConvBwdWeightProblem, tensor: str) -> ir.RankedTensorType:
    """The tensor type of "x", "dy", "dw" or "d" (the epilogue's D: dW's shape, D's type) for ``problem``
    (in the current context)."""
    from convbw_mlir.ir_imports import element_type

    if tensor == "d":
        if problem.epilogue is None or not problem.epilogue.reads_d:
            raise ValueError(f"epilogue: problem {problem.name} reads no D")
        return ir.RankedTensorType.get(problem.shape("dw"), element_type(problem.epilogue.d_dtype))
    dtype = {"dw": problem.dw_dtype, "dy": problem.dy_type}.get(tensor, problem.dtype)
    return ir.RankedTensorType.get(problem.shape(tensor), element_type(dtype))


def epilogue_attr(epilogue) -> ir.DictAttr:  # epilogue: convbw_mlir.problem.Epilogue
    """The epilogue as the op prints it: kind, alpha (and beta where D is read) as f64; D's type is
    the D operand's."""
    f64 = ir.F64Type.get()
    entries = {"kind": ir.StringAttr.get(epilogue.kind), "alpha": ir.FloatAttr.get(f64, epilogue.alpha)}
    if epilogue.reads_d:
        entries["beta"] = ir.FloatAttr.get(f64, epilogue.beta)
    return ir.DictAttr.get(entries)


def epilogue_of(op: ir.Operation | ir.OpView):  # -> convbw_mlir.problem.Epilogue | None
    """The epilogue an op carries (D's type from its third operand), or None.

    Raises:
        OpError: a malformed epilogue attribute, or operands that do not fit it.
    """
    from convbw_mlir.problem import Epilogue

    op = op.operation
    attrs = op.attributes
    if EPILOGUE_ATTR not in attrs:
        if len(op.operands) != 2:
            raise OpError(f"expected 2 operands (x, dy) without an epilogue, got {len(op.operands)}")
        return None
    attr = attrs[EPILOGUE_ATTR]
    if not isinstance(attr, ir.DictAttr):
        raise OpError(f"attribute '{EPILOGUE_ATTR}' must be a dictionary, got {attr}")
    data = dict_from_attr(attr)
    for name in ("alpha", "beta"):
        if name in data and not isinstance(data[name], float):
            raise OpError(f"epilogue: '{name}' must be a float (e.g. 2.0 : f64), got {data[name]!r}")
    try:
        epilogue = Epilogue.from_dict(data)
    except (ValueError, TypeError) as e:
        raise OpError(str(e)) from None
    want = 3 if epilogue.reads_d else 2
    if len(op.operands) != want:
        what = "(x, dy, D)" if epilogue.reads_d else "(x, dy)"
        raise OpError(f"a {epilogue.kind} epilogue takes {want} operands {what}, got {len(op.operands)}")
    if epilogue.reads_d:
        t = op.operands[2].type
        if not isinstance(t, ir.RankedTensorType) or str(t.element_type) not in ("f16", "bf16", "f32"):
            raise OpError(f"D: expected a ranked tensor of f16, bf16 or f32, got {t}")
        epilogue = Epilogue.from_dict({**data, "d_dtype": str(t.element_type)})
    return epilogue


def problem_location(problem: ConvBwdWeightProblem) -> ir.Location:
    """A NameLoc naming the problem, so diagnostics on ops built from it say which problem."""
    return ir.Location.name(f"conv_bwd_weight:{problem.name}")


def partial_type(problem: ConvBwdWeightProblem, split: Split) -> ir.RankedTensorType:
    """The result type of a split op: f32 partial sums ``[k_batch, g, k, f..., c]``."""
    return ir.RankedTensorType.get([split.k_batch, *problem.shape("acc")], ir.F32Type.get())


def build_op(
    problem: ConvBwdWeightProblem,
    x: ir.Value,
    dy: ir.Value,
    loc: ir.Location | None = None,
    split: Split | None = None,
    plan: ir.Attribute | None = None,
    d: ir.Value | None = None,
) -> ir.Operation:
    """Create ``convbw.conv_bwd_weight`` at the current insertion point.

    With ``split``, the op is the first stage of a split-K: it carries ``k_batch``, ``split_dim`` and
    ``split_chunk`` and yields f32 partial sums ``[k_batch, g, k, f..., c]`` instead of dW (and no
    epilogue: stage 2 applies it). ``plan`` (the attribute of the op this one replaces) is carried over.
    ``d`` is the epilogue's D, for a problem whose epilogue reads one.
    """
    epilogue = None if split else problem.epilogue
    if (epilogue is not None and epilogue.reads_d) != (d is not None):
        raise ValueError(f"D: problem {problem.name} {'takes' if d is None else 'takes no'} D operand")
    i64 = ir.IntegerType.get_signless(64)
    attrs = {name: ir.DenseI64ArrayAttr.get(list(getattr(problem, _FIELDS[name]))) for name in _ARRAY_ATTRS}
    attrs["groups"] = ir.IntegerAttr.get(i64, problem.groups)
    attrs["layout"] = ir.StringAttr.get(problem.layout)
    if split:
        attrs["k_batch"] = ir.IntegerAttr.get(i64, split.k_batch)
        attrs["split_dim"] = ir.StringAttr.get(split.dim)
        attrs["split_chunk"] = ir.IntegerAttr.get(i64, split.chunk)
    if plan is not None:
        attrs[PLAN_ATTR] = plan
    if epilogue is not None:
        attrs[EPILOGUE_ATTR] = epilogue_attr(epilogue)
    return ir.Operation.create(
        OP_NAME,
        results=[partial_type(problem, split) if split else tensor_type(problem, "dw")],
        operands=[x, dy] + ([d] if d is not None else []),
        attributes=attrs,
        loc=loc or problem_location(problem),
    )


def build_module(problem: ConvBwdWeightProblem, plan=None) -> ir.Module:
    """A module with ``func.func @conv_bwd_weight(%x, %dy) -> dW`` holding one op (current context),
    carrying ``plan`` (a :class:`convbw_mlir.plan.Plan`) where given.

    An epilogue that reads D adds the argument ``%d``; for ``accumulate`` it is tied to the result
    (``{iree.abi.output = 0 : index}``): IREE writes dW into D's buffer, the caller's.
    """
    loc = problem_location(problem)
    module = ir.Module.create(loc=loc)
    epilogue = problem.epilogue
    reads_d = epilogue is not None and epilogue.reads_d
    with ir.InsertionPoint(module.body), loc:
        names = ("x", "dy", "dw", *(("d",) if reads_d else ()))
        x_t, dy_t, dw_t, *d_t = (tensor_type(problem, t) for t in names)
        fn = func_d.FuncOp(FUNC_NAME, ir.FunctionType.get([x_t, dy_t, *d_t], [dw_t]))
        if epilogue is not None and epilogue.kind == "accumulate":
            no_attrs = ir.DictAttr.get({})
            tied = ir.DictAttr.get({OUTPUT_ARG_ATTR: ir.IntegerAttr.get(ir.IndexType.get(), 0)})
            fn.arg_attrs = ir.ArrayAttr.get([no_attrs, no_attrs, tied])
        block = fn.add_entry_block()
        with ir.InsertionPoint(block):
            d = block.arguments[2] if reads_d else None
            op = build_op(problem, block.arguments[0], block.arguments[1], loc, d=d)
            if plan is not None:
                set_plan(op, plan)
            func_d.ReturnOp([op.result])
    module.operation.verify()
    return module


def is_conv_bwd_weight(op: ir.Operation | ir.OpView) -> bool:
    return op.operation.name == OP_NAME


def _shape_and_type(value_type: ir.Type, what: str) -> tuple[tuple[int, ...], str]:
    if not isinstance(value_type, ir.RankedTensorType):
        raise OpError(f"{what}: expected a ranked tensor, got {value_type}")
    t = value_type
    if not t.has_static_shape:
        raise OpError(f"{what}: expected a static shape, got {t}")
    name = str(t.element_type)
    if name not in _TYPE_NAMES:
        raise OpError(f"{what}: element type {name} is not one of f16, bf16, f32, f8E4M3FN, f8E5M2")
    return tuple(t.shape), _TYPE_NAMES[name]


def problem_of(op: ir.Operation | ir.OpView) -> ConvBwdWeightProblem:
    """Read the problem an op describes.

    Raises:
        OpError: missing or malformed attributes, wrong operand count, shapes that disagree.
    """
    op = op.operation
    if len(op.operands) not in (2, 3) or len(op.results) != 1:
        raise OpError(
            f"expected 2 operands (x, dy), or 3 with an epilogue's D, and 1 result (dw), "
            f"got {len(op.operands)} and {len(op.results)}"
        )
    epilogue = epilogue_of(op)
    attrs = {}
    for name in (*_ARRAY_ATTRS, "groups", "layout"):
        if name not in op.attributes:
            raise OpError(f"missing attribute '{name}'")
        attrs[name] = op.attributes[name]
    for name in _ARRAY_ATTRS:
        if not isinstance(attrs[name], ir.DenseI64ArrayAttr):
            raise OpError(f"attribute '{name}' must be array<i64: ...>, got {attrs[name]}")
    arrays = {name: tuple(attrs[name]) for name in _ARRAY_ATTRS}
    if not isinstance(attrs["groups"], ir.IntegerAttr):
        raise OpError(f"attribute 'groups' must be an integer, got {attrs['groups']}")
    if not isinstance(attrs["layout"], ir.StringAttr):
        raise OpError(f"attribute 'layout' must be a string, got {attrs['layout']}")
    groups = attrs["groups"].value
    layout = attrs["layout"].value
    (x_shape, x_type), (dy_shape, dy_type) = (_shape_and_type(v.type, n) for v, n in zip(op.operands, ("x", "dy")))
    dw_shape, dw_type = _shape_and_type(op.results[0].type, "dw")
    if x_type != dy_type and not {x_type, dy_type} <= {"e4m3", "e5m2"}:  # fp8's x and dy may differ
        raise OpError(f"x and dy must share an element type, got {x_type} and {dy_type}")
    split = split_of(op)
    plan_of(op)  # a malformed plan is an invalid op
    if split and dw_type != "f32":
        raise OpError(f"a split op (k_batch = {split.k_batch}) yields f32 partial sums, got {dw_type}")
    if split and epilogue is not None:
        raise OpError(f"a split op (k_batch = {split.k_batch}) yields partial sums: its epilogue belongs to stage 2")
    rank = len(arrays["strides"])
    try:
        from convbw_mlir.problem import resolve_layout

        family = resolve_layout(layout, rank if rank in (1, 2, 3) else None)
        x_dims, w_dims = family.dims("x", rank), family.dims("w", rank)
        if split:  # partial sums: [k_batch, g, k, f..., c]
            w_dims = ("S", *(("G",) if "G" in w_dims else ()), "K", *(d for d in w_dims if d in "ZYX"), "C")
        if len(x_shape) != len(x_dims) or len(dw_shape) != len(w_dims):
            raise OpError(
                f"x rank {len(x_shape)} / dw rank {len(dw_shape)} do not fit layout {family.spelled(rank)} "
                f"with {rank} spatial dimensions"
            )
        xs, ws = dict(zip(x_dims, x_shape)), dict(zip(w_dims, dw_shape))
        spatial_in = [xs[d] for d in x_dims if d in "DHW"]
        spatial_f = [ws[d] for d in w_dims if d in "ZYX"]
        problem = ConvBwdWeightProblem(
            groups=groups,
            batch=xs["N"],
            in_channels=xs["C"],
            out_channels=ws["K"],
            input_size=tuple(spatial_in),
            filter_size=tuple(spatial_f),
            stride=arrays["strides"],
            dilation=arrays["dilations"],
            pad_low=arrays["pad_low"],
            pad_high=arrays["pad_high"],
            dtype=x_type,
            dy_dtype=dy_type,
            dw_dtype=dw_type,
            layout=family.name,
            epilogue=epilogue,
        )
    except (ValueError, TypeError) as e:
        if isinstance(e, OpError):
            raise
        raise OpError(str(e)) from None
    if split:
        if ws["S"] != split.k_batch:
            raise OpError(f"partial sums: leading dimension {ws['S']} must equal k_batch = {split.k_batch}")
        try:
            check_split(problem, split)
        except ValueError as e:
            raise OpError(str(e)) from None
    shapes = [("x", x_shape), ("dy", dy_shape), ("dw", dw_shape)]
    if epilogue is not None and epilogue.reads_d:
        shapes.append(("D", tuple(op.operands[2].type.shape)))
    for name, got in shapes:
        tensor = "dw" if name == "D" else name
        want = (split.k_batch, *problem.shape("acc")) if (name == "dw" and split) else problem.shape(tensor)
        if got != want:
            raise OpError(
                f"{name}: expected shape {'x'.join(map(str, want))} for this problem, got {'x'.join(map(str, got))}"
            )
    return problem


def problem_attr(problem: ConvBwdWeightProblem) -> ir.DictAttr:
    """The whole problem as a dictionary attribute (carried by the linalg form for the GPU passes)."""
    i64 = ir.IntegerType.get_signless(64)
    entries = {}
    for key, value in problem.to_dict().items():
        if isinstance(value, dict):  # the epilogue
            entries[key] = dict_attr(value)
        elif isinstance(value, tuple):
            entries[key] = ir.DenseI64ArrayAttr.get(list(value))
        elif isinstance(value, int):
            entries[key] = ir.IntegerAttr.get(i64, value)
        else:
            entries[key] = ir.StringAttr.get(value)
    return ir.DictAttr.get(entries)


def problem_from_attr(attr: ir.Attribute) -> ConvBwdWeightProblem:
    """The inverse of :func:`problem_attr`."""
    return ConvBwdWeightProblem.from_dict(dict_from_attr(attr))


def dict_attr(data: dict[str, Any]) -> ir.DictAttr:
    """Plain data (str, bool, int, float, nested dicts) as a dictionary attribute that prints and parses."""
    i64 = ir.IntegerType.get_signless(64)

    def attr(value: Any) -> ir.Attribute:
        if isinstance(value, dict):
            return dict_attr(value)
        if isinstance(value, bool):
            return ir.BoolAttr.get(value)
        if isinstance(value, int):
            return ir.IntegerAttr.get(i64, value)
        if isinstance(value, str):
            return ir.StringAttr.get(value)
        if isinstance(value, float):
            return ir.FloatAttr.get(ir.F64Type.get(), value)
        raise TypeError(f"dict_attr: no attribute for {type(value).__name__} {value!r}")

    return ir.DictAttr.get({key: attr(value) for key, value in data.items()})


def dict_from_attr(attr: ir.Attribute) -> dict[str, Any]:
    """The inverse of :func:`dict_attr` (integer arrays become tuples).

    Raises:
        OpError: an entry of another kind of attribute.
    """
    data: dict[str, Any] = {}
    for named in ir.DictAttr(attr):
        v = named.attr
        if isinstance(v, ir.DictAttr):
            data[named.name] = dict_from_attr(v)
        elif isinstance(v, ir.BoolAttr):
            data[named.name] = v.value
        elif isinstance(v, ir.DenseI64ArrayAttr):
            data[named.name] = tuple(v)
        elif isinstance(v, ir.IntegerAttr):
            data[named.name] = v.value
        elif isinstance(v, ir.StringAttr):
            data[named.name] = v.value
        elif isinstance(v, ir.FloatAttr):
            data[named.name] = v.value
        else:
            raise OpError(f"entry '{named.name}': unexpected attribute {v}")
    return data


def plan_of(op: ir.Operation | ir.OpView):  # -> convbw_mlir.plan.Plan | None
    """The plan ``convbw-plan`` attached to the op, or None.

    Raises:
        OpError: a malformed plan attribute.
    """
    from convbw_mlir.plan import Plan, PlanError

    attrs = op.operation.attributes
    if PLAN_ATTR not in attrs:
        return None
    if not isinstance(attrs[PLAN_ATTR], ir.DictAttr):
        raise OpError(f"attribute '{PLAN_ATTR}' must be a dictionary, got {attrs[PLAN_ATTR]}")
    try:
        return Plan.from_dict(dict_from_attr(attrs[PLAN_ATTR]))
    except PlanError as e:
        raise OpError(str(e)) from None


def set_plan(op: ir.Operation | ir.OpView, plan) -> None:
    """Attach ``plan`` (a :class:`convbw_mlir.plan.Plan`) to the op."""
    op.operation.attributes[PLAN_ATTR] = dict_attr(plan.to_dict())


def split_of(op: ir.Operation | ir.OpView) -> Split | None:
    """The split-K of an op (its ``k_batch``, ``split_dim``, ``split_chunk``), or None.

    Raises:
        OpError: an incomplete or malformed set of split attributes.
    """
    attrs = op.operation.attributes
    present = [n for n in ("k_batch", "split_dim", "split_chunk") if n in attrs]
    if not present:
        return None
    if len(present) != 3:
        raise OpError("a split op needs all of 'k_batch', 'split_dim' and 'split_chunk'")
    kb, dim, chunk = attrs["k_batch"], attrs["split_dim"], attrs["split_chunk"]
    if not (isinstance(kb, ir.IntegerAttr) and isinstance(chunk, ir.IntegerAttr) and isinstance(dim, ir.StringAttr)):
        raise OpError("'k_batch' and 'split_chunk' must be integers and 'split_dim' a string")
    try:
        return Split(dim.value, kb.value, chunk.value)
    except ValueError as e:
        raise OpError(str(e)) from None


def verify_op(op: ir.Operation | ir.OpView) -> ConvBwdWeightProblem | None:
    """Check an op; on error emit it at the op's location and return None (an ODS verifier's role)."""
    try:
        return problem_of(op)
    except OpError as e:
        op.operation.location.emit_error(f"'{OP_NAME}' op {e}")
        return None
