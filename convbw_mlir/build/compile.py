"""Build: a problem, its plan and a target to a :class:`~convbw_mlir.build.artifact.CompiledOp`, in this
process: the convbw op, the target's pipeline (:mod:`convbw_mlir.pipelines`), IREE. No cache, no selection
(those are the dispatcher's, :mod:`convbw_mlir.dispatch`); :mod:`convbw_mlir.build.isolate` runs it in a child.
"""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

from convbw_mlir.build.artifact import CompiledOp
from convbw_mlir.build.iree import CompileError, compile_module, iree_version
from convbw_mlir.plan import Overrides, Plan, computed_problem, decide, plan_properties
from convbw_mlir.problem import ConvBwdWeightProblem
from convbw_mlir.targets import Target

__all__ = ["build_op", "lowered_text", "run_pipeline", "with_output_arg"]


def build_op(problem: ConvBwdWeightProblem, target: Target, plan: Plan | None = None,
             extra_flags: list[str] | None = None, *, output_arg: bool = False,
             **options: Any) -> CompiledOp:  # fmt: skip
    """Compile ``problem`` for ``target``: the given ``plan`` carried out as it is, else the pipeline's
    plan pass decides one from ``options`` (pass options of :func:`convbw_mlir.pipelines.for_target`).
    The caller (:func:`convbw_mlir.compile_op`) has checked the problem's limits and the plan.

    Raises:
        ValueError: an unknown option. CompileError: a pass or IREE failed.
    """
    import iree.compiler

    from convbw_mlir.dialects import convbw
    from convbw_mlir.ir_imports import new_context
    from convbw_mlir.passes import format_pipeline
    from convbw_mlir.pipelines import for_target

    pipeline = for_target(target, **options)
    given = plan
    with new_context() as ctx:
        module = convbw.build_module(problem, plan)
        stages = {"convbw": str(module)}
        run_pipeline(module, pipeline, ctx)
        if output_arg:
            _add_output_arg(module)
        stages["linalg"] = str(module)
        bytecode = _bytecode(module)
        plan = _plan_carried_out(module)
        mapped = _tensor_maps_kernel(module)
    plan = plan_properties(problem, plan) if plan is not None else None  # its workspace and determinism
    plan = _with_decision(problem, target, plan, given, options)
    vmfb, launch = _compile_vmfb(bytecode, target, extra_flags)
    if mapped is not None and launch is not None and launch.refused is None:  # what the direct launch encodes
        from convbw_mlir.cuda_launch import TensorMap
        from convbw_mlir.policies import sm90, sm90_fp8

        if sm90_fp8.is_fp8(plan):
            maps = sm90_fp8.tensor_maps(problem, plan, mapped)
        else:  # the kernel's problem: a folded rank's 2-D twin (its maps are 2-D: docs/decisions.md#rank-fold)
            maps = sm90.tensor_maps(computed_problem(problem, plan), mapped)
        launch.tensor_maps = [TensorMap(**m) for m in maps]
    return CompiledOp(
        problem=problem,
        target=target.name,
        stages=stages,
        vmfb=vmfb,
        pipeline=format_pipeline(pipeline),
        flags=target.iree_flags() + list(extra_flags or []),
        iree_version=getattr(iree.compiler, "__version__", "") or iree_version(),
        plan=plan,
        launch=launch,
    )


def _with_decision(problem: ConvBwdWeightProblem, target: Target, plan: Plan | None, given: Plan | None,
                   options: dict[str, Any]) -> Plan | None:  # fmt: skip
    """The plan carried out (read back from the IR: no :attr:`~Plan.decision`) with the rule that made it: the
    given plan's, else the plan pass's own decision (decided again: cheap, pure)."""
    if plan is None:
        return None
    if given is None:
        names = {f.name for f in fields(Overrides)}
        try:
            given = decide(problem, target, **{k: v for k, v in options.items() if k in names})
        except ValueError:  # the pass decided, so this does not happen; the plan then goes without its rule
            return plan
    return replace(plan, decision=given.decision) if plan == given else plan


def run_pipeline(module: Any, pipeline: list, context: Any = None) -> None:
    """Run a parsed pipeline on ``module`` in place.

    Raises:
        CompileError: with MLIR's diagnostics when a pass fails.
    """
    from convbw_mlir.passes import build_pass_manager

    pm = build_pass_manager(pipeline, context or module.context)
    with _collect_diagnostics(module.context) as diags:
        try:
            pm.run(module.operation)
        except Exception as e:
            # An MLIRError carries its diagnostics itself; others went to our handler.
            for d in getattr(e, "error_diagnostics", []):
                diags.append(f"{d.location}: error: {d.message}")
                diags.extend(f"{n.location}: note: {n.message}" for n in d.notes)
            raise CompileError("\n".join(diags) or str(e)) from None


def lowered_text(problem: ConvBwdWeightProblem, pipeline: list) -> str:
    """The IR text of ``problem``'s convbw op after ``pipeline`` (a parsed pipeline, e.g. from
    :func:`convbw_mlir.pipelines.for_target`), in a context of its own.

    Raises:
        CompileError: a pass failed.
    """
    from convbw_mlir.dialects import convbw
    from convbw_mlir.ir_imports import new_context

    with new_context() as ctx:
        module = convbw.build_module(problem)
        run_pipeline(module, pipeline, ctx)
        return str(module)


class _collect_diagnostics:  # noqa: N801 - used as a context manager, reads like a function
    """Capture the diagnostics emitted in ``context`` as ``loc: severity: message`` lines."""

    def __init__(self, context: Any) -> None:
        self.context = context
        self.lines: list[str] = []

    def __enter__(self) -> list[str]:
        def handler(d: Any) -> bool:
            sev = str(d.severity).rsplit(".", 1)[-1].lower()
            self.lines.append(f"{d.location}: {sev}: {d.message}")
            for note in d.notes:
                self.lines.append(f"{note.location}: note: {note.message}")
            return True

        self._handler = self.context.attach_diagnostic_handler(handler)
        return self.lines

    def __exit__(self, *exc: Any) -> None:
        self._handler.detach()


def _compile_vmfb(bytecode: bytes, tgt: Target, extra_flags: list[str] | None) -> tuple[bytes, Any]:
    """The vmfb and, for CUDA and HIP targets, the direct launch's schedule read at the ``hal`` phase of the same
    compile (split in two there; the vmfb is the one-shot compile's, byte for byte: tests/test_hip_launch.py)."""
    if tgt.driver == "cuda":
        from convbw_mlir.build.cuda_schedule import compile_with_launch

        return compile_with_launch(bytecode, tgt, extra_flags)
    if tgt.driver == "hip":
        from convbw_mlir.build.hip_schedule import compile_with_hip_launch

        return compile_with_hip_launch(bytecode, tgt, extra_flags)
    return compile_module(bytecode, tgt, extra_flags), None


def _add_output_arg(module: Any) -> None:
    """Append ``%out: !hal.buffer {iree.abi.output = 0 : index}`` to the entry function: IREE then
    writes result 0 into that caller-owned buffer instead of allocating one per call (iree-org/iree#17012)."""
    from convbw_mlir.dialects.convbw import FUNC_NAME
    from convbw_mlir.ir_imports import ir

    (fn,) = [op for op in module.body.operations if ir.StringAttr(op.attributes["sym_name"]).value == FUNC_NAME]
    with module.context, ir.Location.unknown():
        buffer_t = ir.Type.parse("!hal.buffer")
        fn.regions[0].blocks[0].add_argument(buffer_t, ir.Location.unknown())
        ftype = ir.FunctionType(ir.TypeAttr(fn.attributes["function_type"]).value)
        fn.attributes["function_type"] = ir.TypeAttr.get(
            ir.FunctionType.get([*ftype.inputs, buffer_t], list(ftype.results))
        )
        old = list(ir.ArrayAttr(fn.attributes["arg_attrs"])) if "arg_attrs" in fn.attributes else []
        old += [ir.DictAttr.get({})] * (len(ftype.inputs) - len(old))
        tie = ir.DictAttr.get({"iree.abi.output": ir.IntegerAttr.get(ir.IndexType.get(), 0)})
        fn.attributes["arg_attrs"] = ir.ArrayAttr.get([*old, tie])


def with_output_arg(text: str) -> str:
    """``text`` (a module whose entry function is ``conv_bwd_weight(x, dy) -> dW``) with the caller-owned
    output argument of :func:`_add_output_arg`: IREE's own forms get the same ABI as ours."""
    from convbw_mlir.ir_imports import ir, new_context

    with new_context():
        module = ir.Module.parse(text)
        _add_output_arg(module)
        return str(module)


def _tensor_maps_kernel(module: Any) -> str | None:
    """The kernel whose tensor maps the caller encodes, as the entry function's reflection names it, or None."""
    from convbw_mlir.dialects.convbw import FUNC_NAME
    from convbw_mlir.ir_imports import ir
    from convbw_mlir.runtime import TENSOR_MAPS_KEY

    for op in module.body.operations:
        if "sym_name" in op.attributes and ir.StringAttr(op.attributes["sym_name"]).value == FUNC_NAME:
            info = op.attributes["iree.reflection"] if "iree.reflection" in op.attributes else None
            if info is not None and TENSOR_MAPS_KEY in ir.DictAttr(info):
                return ir.StringAttr(ir.DictAttr(info)[TENSOR_MAPS_KEY]).value
    return None


def _plan_carried_out(module: Any) -> Plan | None:
    """The plan the lowered module's contraction records (one contraction per problem)."""
    from convbw_mlir.contraction import contractions, read_contraction

    found = [read_contraction(op).plan for op in contractions(module.operation)]
    if not found:  # an explicit kernel has no contraction; its dispatch carries the plan
        from convbw_mlir.passes.explicit_kernel import carried_plan

        return carried_plan(module)
    return Plan.from_dict(found[0]) if found and found[0] else None


def _bytecode(module: Any) -> bytes:
    import io

    buf = io.BytesIO()
    module.operation.write_bytecode(buf)
    return buf.getvalue()
