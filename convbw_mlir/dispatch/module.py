"""The whole-module route: a model's IR in, one vmfb out, with our pipeline on every weight gradient.

    torch ExportedProgram (a training step) --fx_importer--> torch IR
        --IREE's input phase (--compile-to=input)--> linalg
        --convbw-raise--> each weight gradient as convbw.conv_bwd_weight, planned as compile_op plans it
            (:func:`convbw_mlir.dispatch.select`: the tuning database's variant, else the heuristic)
        --the target's pipeline (pipelines.for_target)--> our linalg (and kernels) in place of each op
        --IREE from the input phase on (--compile-from=input)--> one vmfb

Our lowering rewrites each op where it stands, so IREE compiles the rest of the module and our contractions
together: nothing is spliced in afterwards. A contraction the raise leaves alone is compiled by IREE as it
came, and its reason is in :attr:`CompiledModule.not_raised`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import partial
from typing import Any

from convbw_mlir.build.iree import CompileError
from convbw_mlir.build.iree import compile_module as iree_compile
from convbw_mlir.problem import ConvBwdWeightProblem
from convbw_mlir.targets import Target, resolve

__all__ = ["CompiledModule", "RaisedConv", "compile_module", "import_frozen", "input_phase"]

_REMARK = re.compile(r'Remark="(.*)", RemarkId')
_TORCH_IR = re.compile(r"\btorch\.(aten|vtensor|constant|prim)\b|!torch\.")


@dataclass(frozen=True)
class RaisedConv:
    """One weight gradient raised: its problem and the variant that computes it (name, and which path chose it)."""

    problem: ConvBwdWeightProblem
    variant: str
    why: str


@dataclass(frozen=True)
class CompiledModule:
    """The vmfb of a whole module and what our passes did to it.

    Attributes:
        vmfb: the compiled module (its functions are the source's: a torch program's is ``main``).
        target: the target's name.
        raised: the weight gradients our pipeline computes, in module order.
        not_raised: ``location: reason`` of each contraction left to IREE.
        input_ir: the module after IREE's input phase (linalg), before ours.
        lowered_ir: the module IREE compiled from the input phase on.
    """

    vmfb: bytes
    target: str
    raised: tuple[RaisedConv, ...]
    not_raised: tuple[str, ...]
    input_ir: str
    lowered_ir: str


def _decomposed(program: Any) -> Any:
    """``program`` in the ops IREE 3.13's torch input conversion legalizes: torch.export's default table, and
    batch norm (forward, eval and backward) and ``squeeze.dims`` decomposed, which it refuses
    ("failed to legalize operation 'torch.operator'": ``_native_batch_norm_legit_no_training``, ``squeeze.dims``);
    and the ops it has no lowering for: the pools' backwards (:func:`_pool_decompositions`),
    ``as_strided_scatter`` (:func:`_as_strided_scatter`), integer ``fmod`` (:func:`_integer_fmod`)."""
    import torch
    from torch._decomp import get_decompositions
    from torch.export import default_decompositions

    aten = torch.ops.aten
    table = default_decompositions()
    table.update(get_decompositions([
        aten._native_batch_norm_legit, aten._native_batch_norm_legit_no_training,
        aten._native_batch_norm_legit_functional, aten.native_batch_norm_backward, aten.squeeze.dims,
    ]))  # fmt: skip
    table.update(_pool_decompositions())
    table[aten.as_strided_scatter.default] = _as_strided_scatter
    table[aten.fmod.Scalar] = _integer_fmod
    return program.run_decompositions(table)


def _integer_fmod(x: Any, other: Any) -> Any:
    """Integer ``fmod`` (C's remainder: the sign of ``x``) as ``x - trunc(x / other) * other``: IREE 3.13 has no
    lowering for ``fmod.Scalar`` (Swin's ``roll``, which torch decomposes into it); a float one is left as it is,
    where that form is not exact."""
    import torch

    if x.dtype.is_floating_point or isinstance(other, float):
        return NotImplemented
    return x - torch.div(x, other, rounding_mode="trunc") * other


def _as_strided_scatter(x: Any, src: Any, size: list[int], stride: list[int], storage_offset: int | None = None) -> Any:
    """``as_strided_scatter`` where it writes all of a contiguous ``x`` in row-major order: ``src`` reshaped to
    ``x``'s shape (ConvNeXt's backward of its head's ``as_strided`` view; IREE 3.13 has no lowering for the op, and
    torch's own decomposition leaves ``prims.as_strided_scatter``, which it refuses too); else not decomposed."""
    dense, expected = True, 1  # (size, stride) row-major: each dim of more than one element at the next's extent
    for extent, step in reversed(list(zip(size, stride))):
        dense = dense and (extent == 1 or step == expected)
        expected *= extent
    if not (dense and not storage_offset and x.is_contiguous() and src.numel() == x.numel() == expected):
        return NotImplemented
    return src.reshape(x.shape).clone()  # a new tensor, as the op's result is


def _pool_decompositions() -> dict[Any, Any]:
    """Decompositions of the pools' backwards IREE 3.13 leaves unlegalized and torch has none for (its input phase
    then fails on the whole model, "failed to legalize operation 'torch.constant.bool'" or the op itself):
    ``avg_pool2d/3d_backward`` and ``_adaptive_avg_pool2d/3d_backward`` as one 0/1 window matrix a spatial dim
    (built from ``arange``: no constant tensor) applied to dy over each window's divisor; ``max_pool3d``'s as a
    ``scatter_add`` of dy at the forward's indices (torch's own decomposition of the 2-D one)."""
    import torch
    from torch._prims_common import suggest_memory_format

    aten = torch.ops.aten

    def windows(dy: Any, x: Any, sizes: list[int], starts: list[Any], ends: list[Any], divisor: Any) -> Any:
        # dx[.., i, ..] = sum over the windows o holding i of dy[.., o, ..] / divisor[o]: one matmul a spatial dim
        out = dy / divisor
        for d, (size, start, end) in enumerate(zip(sizes, starts, ends)):
            dim = d - len(sizes)
            i = torch.arange(size, device=dy.device).unsqueeze(1)
            window = ((i >= start) & (i < end)).to(dy.dtype)  # (in, out): 1 where input i is in window o
            out = torch.matmul(out.movedim(dim, -1), window.t()).movedim(-1, dim)
        # in the op's layout (x's), not movedim's: the graph's later views were traced on that one
        return out.contiguous(memory_format=suggest_memory_format(x))

    def per_dim(values: list[Any]) -> Any:  # the outer product of one vector a spatial dim, over dy's last dims
        total = None
        for d, v in enumerate(values):
            v = v.reshape([-1] + [1] * (len(values) - 1 - d))
            total = v if total is None else total * v
        return total

    def avg_pool_backward(n, dy, x, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override):  # noqa: ANN001, ANN202
        kernel, padding = list(kernel) * (n // len(kernel)), list(padding) * (n // len(padding))
        stride = list(stride) * (n // len(stride)) if stride else kernel  # [] is the kernel's
        sizes = list(x.shape[-n:])
        starts, ends, counts = [], [], []
        for size, out, k, s, p in zip(sizes, dy.shape[-n:], kernel, stride, padding):
            start = torch.arange(out, device=dy.device) * s - p
            starts.append(start)
            ends.append(start + k)
            if count_include_pad:  # the window clipped to the padded input (ceil_mode's last one may overhang it)
                counts.append(torch.clamp_max(start + k, size + p) - start)
            else:
                counts.append(torch.clamp_max(start + k, size) - torch.clamp_min(start, 0))
        divisor = divisor_override if divisor_override else per_dim(counts).to(dy.dtype)
        return windows(dy, x, sizes, starts, ends, divisor)

    def adaptive_avg_pool_backward(n, dy, x):  # noqa: ANN001, ANN202
        sizes = list(x.shape[-n:])
        starts, ends = [], []
        for size, out in zip(sizes, dy.shape[-n:]):  # torch's windows: [floor(o*in/out), ceil((o+1)*in/out))
            o = torch.arange(out, device=dy.device)
            starts.append(torch.div(o * size, out, rounding_mode="floor"))
            ends.append(torch.div((o + 1) * size + out - 1, out, rounding_mode="floor"))
        divisor = per_dim([e - s for s, e in zip(starts, ends)]).to(dy.dtype)
        return windows(dy, x, sizes, starts, ends, divisor)

    def max_pool3d_backward(dy, x, kernel, stride, padding, dilation, ceil_mode, indices):  # noqa: ANN001, ANN202
        # indices are each window's argmax flattened over (D, H, W): add dy there, as torch's 2-D decomposition
        # does, on 2-D operands (IREE 3.13 runs out of memory compiling a 3-D scatter_add)
        planes = x.numel() // (x.shape[-3] * x.shape[-2] * x.shape[-1])
        flat = torch.zeros((planes, x.numel() // planes), dtype=dy.dtype, device=dy.device)
        dx = flat.scatter_add(1, indices.reshape(planes, -1), dy.reshape(planes, -1)).reshape(x.shape)
        return dx.contiguous(memory_format=suggest_memory_format(x))

    return {
        aten.avg_pool2d_backward.default: partial(avg_pool_backward, 2),
        aten.avg_pool3d_backward.default: partial(avg_pool_backward, 3),
        aten._adaptive_avg_pool2d_backward.default: partial(adaptive_avg_pool_backward, 2),
        aten._adaptive_avg_pool3d_backward.default: partial(adaptive_avg_pool_backward, 3),
        aten.max_pool3d_with_indices_backward.default: max_pool3d_backward,
    }


def _torch_ir(program: Any) -> str:
    """The torch-dialect IR of an ``ExportedProgram`` (iree.compiler.extras.fx_importer, in iree-base-compiler)."""
    return import_frozen(_decomposed(program))


def import_frozen(program: Any) -> str:
    """The torch-dialect IR of an already decomposed ``ExportedProgram``, its buffers and constants frozen in.

    The importer puts each frozen tensor in place of its placeholder, and refuses one inside a list argument
    ("Heterogeneous lists are not supported: expected vtensor, got <class 'torch.Tensor'>": Swin's
    ``index.Tensor(table, [None, relative_position_index])``): such a use reads a ``clone`` of it instead.
    """
    import torch
    from iree.compiler.extras.fx_importer import FxImporter
    from torch.fx import Node

    sig = program.graph_signature
    frozen = {*sig.inputs_to_buffers, *sig.inputs_to_lifted_tensor_constants, *sig.inputs_to_parameters}
    graph = program.graph
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue

        def unlisted(arg: Any, node: Node = node) -> Any:
            if not isinstance(arg, (list, tuple)):
                return arg
            out = []
            for a in arg:
                if isinstance(a, Node) and a.op == "placeholder" and a.name in frozen:
                    with graph.inserting_before(node):
                        clone = graph.call_function(torch.ops.aten.clone.default, (a,))
                    clone.meta["val"] = a.meta.get("val")
                    a = clone
                out.append(a)
            return type(arg)(out)

        node.args = tuple(unlisted(a) for a in node.args)
        node.kwargs = {k: unlisted(v) for k, v in node.kwargs.items()}
    importer = FxImporter()
    importer.import_frozen_program(program)
    return str(importer.module)


def input_phase(source: Any, target: Target | str = "host", isolate: bool = False) -> str:
    """``source`` as linalg: IREE's input phase run on a torch ``ExportedProgram`` or torch-dialect text;
    other MLIR text is taken to be past the input phase already and returned as it is.

    Raises:
        TypeError: ``source`` is neither an ExportedProgram nor MLIR text.
        CompileError: the importer or IREE's input conversion failed.
    """
    if type(source).__name__ == "ExportedProgram":
        try:
            source = _torch_ir(source)
        except Exception as e:  # the importer's own errors (unsupported ops) are the user's to read
            raise CompileError(f"fx_importer: {type(e).__name__}: {e}") from None
    if isinstance(source, bytes):
        source = source.decode()
    if not isinstance(source, str):
        raise TypeError(f"source: expected a torch.export.ExportedProgram or MLIR text, got {type(source).__name__}")
    if not _TORCH_IR.search(source):
        return source
    flags = ["--iree-input-type=torch", "--compile-to=input"]
    if isolate:
        from convbw_mlir.build.isolate import call

        data = call(iree_compile, source, target, flags, source_name="torch.mlir", what="IREE's input phase")
    else:
        data = iree_compile(source, target, flags, source_name="torch.mlir")
    from convbw_mlir.ir_imports import ir, new_context

    with new_context():
        return str(ir.Module.parse(data))


def _lower(text: str, tgt: Target, use_database: bool) -> tuple[str, list[RaisedConv], list[str]]:
    """Raise, plan and lower every weight gradient of ``text``: (the module's text, what was raised, remarks)."""
    from convbw_mlir.dialects import convbw
    from convbw_mlir.dispatch.select import select
    from convbw_mlir.ir_imports import ir, new_context
    from convbw_mlir.passes import build_pass_manager, parse_pipeline
    from convbw_mlir.passes.framework import collect_ops
    from convbw_mlir.pipelines import for_target

    remarks: list[str] = []
    errors: list[str] = []

    def on_diagnostic(d: Any) -> bool:
        message = _REMARK.search(str(d.message))  # the remark engine's "[Missed] ... Remark="..."" form
        line = f"{d.location}: {message.group(1) if message else d.message}"
        (remarks if "remark" in str(d.severity).lower() else errors).append(line)
        return True

    with new_context() as ctx:
        handle = ctx.attach_diagnostic_handler(on_diagnostic)
        try:
            module = ir.Module.parse(text)
            attrs = module.operation.attributes
            if tgt.target_info and "hal.device.targets" not in attrs:  # a chip IREE has no flag for (sm_90a)
                attrs["hal.device.targets"] = ir.Attribute.parse(tgt.device_targets())
            build_pass_manager(parse_pipeline("convbw-raise{remarks=true}"), ctx).run(module.operation)
            raised = []
            for op in collect_ops(module.operation, convbw.OP_NAME):
                problem = convbw.problem_of(op)
                if use_database:
                    selection = select(problem, tgt)
                    if selection.variant.plan is not None:  # IREE's own form chosen: the heuristic's plan instead
                        convbw.set_plan(op, selection.variant.plan)
                    raised.append(RaisedConv(problem, selection.variant.name, f"{selection.path}: {selection.why}"))
                else:
                    raised.append(RaisedConv(problem, "convbw", "heuristic"))
            pipeline = for_target(tgt)
            assert pipeline[0].argument == "convbw-plan"  # each op's plan first: checked before any kernel is built
            build_pass_manager(pipeline[:1], ctx).run(module.operation)
            for op in collect_ops(module.operation, convbw.OP_NAME):
                _refuse_tensor_maps(convbw.problem_of(op), convbw.plan_of(op), tgt)
            build_pass_manager(pipeline[1:], ctx).run(module.operation)
            _unique_entries(module.operation)
            return str(module), raised, remarks
        except ir.MLIRError as e:
            lines = errors + [f"{d.location}: {d.message}" for d in e.error_diagnostics]
            raise CompileError("\n".join(lines) or str(e)) from None
        finally:
            handle.detach()


def _unique_entries(module: Any) -> None:
    """Name each of our kernels after its executable: they share one entry name (``passes/explicit_kernel.py``
    ENTRY), and IREE links a target's executables into one LLVM module, where two kernels of different shapes
    clash ("multiple public symbols with the name: gemm")."""
    from convbw_mlir.ir_imports import ir
    from convbw_mlir.passes.framework import collect_ops

    def sym(op: ir.Operation) -> str:
        return ir.StringAttr(op.attributes["sym_name"]).value

    renamed: set[str] = set()  # executables whose one export (and its function) now bears their name
    for executable in collect_ops(module, "hal.executable.source"):
        name, exports = sym(executable), collect_ops(executable, "hal.executable.export")
        if len(exports) != 1:
            continue
        entry = sym(exports[0])
        for op in (exports[0], *(f for f in collect_ops(executable, "func.func") if sym(f) == entry)):
            op.attributes["sym_name"] = ir.StringAttr.get(name)
        renamed.add(name)
    for dispatch in collect_ops(module, "flow.dispatch"):
        refs = [str(r) for r in ir.ArrayAttr(dispatch.attributes["entry_points"])]
        executables = [r.split("::")[0] for r in refs]
        if any(e[1:] in renamed for e in executables):
            dispatch.attributes["entry_points"] = ir.Attribute.parse(
                "[" + ", ".join(f"{e}::{e}" if e[1:] in renamed else r for e, r in zip(executables, refs)) + "]"
            )


def _refuse_tensor_maps(problem: ConvBwdWeightProblem, plan: Any, tgt: Target) -> None:
    """Refuse a plan whose kernel reads TMA tensor maps: IREE's runtime, which runs a whole module, cannot pass
    them (:func:`convbw_mlir.runtime.refuse_tensor_maps` says the same of a single kernel's module)."""
    from convbw_mlir.policies import sm90, sm90_fp8

    if plan is not None and (sm90.is_sm90(plan) or sm90_fp8.is_fp8(plan)):
        raise ValueError(
            f"target {tgt.name}: {problem.name} is planned for the Hopper kernel, whose TMA tensor maps IREE's "
            "runtime cannot pass, and a whole module runs through IREE's runtime; compile the module for sm_80 "
            "(its PTX runs on H100/H200), or run that weight gradient through convbw_mlir.torch's direct launch"
        )


def compile_module(
    source: Any,
    target: Target | str = "host",
    extra_flags: list[str] | None = None,
    *,
    use_database: bool = True,
    isolate: bool = False,
    timeout: float | None = None,
) -> CompiledModule:
    """Compile a whole module (a training step: forward and backward) with our pipeline on every weight gradient.

    Args:
        source: a ``torch.export.ExportedProgram``, torch-dialect MLIR text, or linalg MLIR text as IREE's
            input phase writes it.
        target: a target name or :class:`~convbw_mlir.targets.Target`.
        extra_flags: more IREE compiler flags for the final compile.
        use_database: plan each weight gradient as ``compile_op`` does (:func:`convbw_mlir.dispatch.select`:
            a tuned variant where the target's database has one); False: the heuristic's plan.
        isolate: run IREE's compiles in a child process (:mod:`convbw_mlir.build.isolate`), so that an IREE
            crash raises here instead of ending this process.
        timeout: with ``isolate``, seconds before a child is killed.

    Raises:
        TypeError: ``source`` of another kind.
        ValueError: an unknown target; on sm_90a, a weight gradient planned for the Hopper kernel (its TMA
            tensor maps need our direct launch, which a module IREE's runtime runs cannot have).
        CompileError: the importer, a pass or IREE failed (with its diagnostics).
    """
    if timeout is not None and not isolate:
        raise ValueError("timeout: applies to isolate=True compiles only")
    tgt = resolve(target)
    linalg = input_phase(source, tgt, isolate)
    lowered, raised, remarks = _lower(linalg, tgt, use_database)
    # IREE's input phase also wrapped the functions for its ABI (iree.abi.stub): resume after it; a module
    # of plain func.func (hand-written linalg) takes every phase
    from_input = ["--compile-from=input"] if "iree.abi.stub" in lowered else []
    flags = [*(extra_flags or []), *from_input]
    if isolate:
        from convbw_mlir.build.isolate import call

        vmfb = call(iree_compile, lowered, tgt, flags, what=f"the module for {tgt.name}", timeout=timeout)
    else:
        vmfb = iree_compile(lowered, tgt, flags)
    return CompiledModule(vmfb, tgt.name, tuple(raised), tuple(remarks), linalg, lowered)
