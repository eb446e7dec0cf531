"""``compile_op``, the call users make: the target resolved once, the limits and a given plan checked, then
the variant chosen (the given plan, the plan of the given options, or :func:`~convbw_mlir.dispatch.select`'s
choice) and taken from the kernel cache or built (:mod:`convbw_mlir.build`) on a miss.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

from convbw_mlir.build.artifact import CompiledOp
from convbw_mlir.build.compile import build_op
from convbw_mlir.dispatch.build import cached_build
from convbw_mlir.dispatch.cache import KernelCache
from convbw_mlir.dispatch.select import check_requests, select
from convbw_mlir.dispatch.variants import Variant
from convbw_mlir.limits import check_limits
from convbw_mlir.plan import Decision, Plan, PlanError, check_plan, decide, plan_properties
from convbw_mlir.problem import ConvBwdWeightProblem
from convbw_mlir.targets import Target, resolve

__all__ = ["compile_op"]


def compile_op(
    problem: ConvBwdWeightProblem,
    target: Target | str = "host",
    extra_flags: list[str] | None = None,
    *,
    plan: Plan | dict[str, Any] | None = None,
    isolate: bool = False,
    timeout: float | None = None,
    output_arg: bool = False,
    cache: Any = None,
    deterministic: bool = False,
    max_workspace_bytes: int | None = None,
    **options: Any,
) -> CompiledOp:
    """Compile ``problem`` for ``target`` through the target's pipeline and IREE.

    Args:
        problem: the problem.
        target: ``host``, an AMD ``gfx*`` or an NVIDIA ``sm_*`` name (see :data:`convbw_mlir.targets.TARGETS`).
        extra_flags: more IREE compiler flags. A compile with any runs in a child process, as with ``isolate``:
            IREE ends the process that compiles on some flag values (``LLVM ERROR``), and no check of ours knows
            every flag's values.
        plan: a plan to carry out as it is (e.g. one a tuner stored, or its dictionary) instead of
            deciding one; it must be for ``target`` and takes no ``options``.
        isolate: compile in a child process (:mod:`convbw_mlir.build.isolate`), so that an IREE crash raises
            :class:`CompileError` here instead of ending this process (a cache hit starts no child); always
            so with ``extra_flags``.
        timeout: with ``isolate`` (or ``extra_flags``), seconds before the child is killed (None: no limit).
        output_arg: give the function a third argument, the buffer dW is written into
            (``{iree.abi.output = 0}``): the caller owns the output (:class:`convbw_mlir.runtime.PreparedCall`).
            Cached apart from the same kernel without it.
        cache: the kernel cache (:class:`convbw_mlir.dispatch.KernelCache` or its folder; None: the user's,
            ``$CONVBW_CACHE_DIR`` or the platform's cache folder); False compiles without it. With no
            ``plan`` and no ``options``, :func:`convbw_mlir.dispatch.select` picks the variant (a tuned
            one where a tuning database has it); ``op.selection`` says which path chose it.
        deterministic: only a plan whose dW is bitwise the same run after run (``op.plan.deterministic``).
        max_workspace_bytes: only a plan needing at most this many bytes of device memory beyond x, dy and
            dW (``op.plan.workspace_bytes``: split-K partials, StreamK partials and flags, padded copies).
            Both restrict :func:`~convbw_mlir.dispatch.select` to the variants that meet them (a tuned winner
            that does not is passed over); a given ``plan`` or ``options`` must meet them.
        **options: pass options for the target pipeline (see :func:`convbw_mlir.pipelines.for_target`).

    Raises:
        ValueError: unknown target or option; no plan meets ``deterministic`` / ``max_workspace_bytes``, or
            the given plan or options do not (naming the request, the value and what the plan needs).
        TypeError: a request of the wrong type, ``extra_flags`` not a list of strings.
        CompileError: a pass or IREE failed; with ``isolate`` or ``extra_flags``, also IREE crashed or timed out
            (:class:`convbw_mlir.build.isolate.CompilerCrash`).
    """
    if extra_flags is not None and (
        isinstance(extra_flags, str) or not all(isinstance(f, str) for f in _iterable(extra_flags))
    ):
        raise TypeError(f"extra_flags: expected a list of IREE flags (strings), got {extra_flags!r:.80}")
    # a bad flag value makes IREE abort the compiling process: the user's flags are tried in a child
    isolate = isolate or bool(extra_flags)
    if timeout is not None and not isolate:
        raise ValueError("timeout: applies to isolate=True compiles (and those with extra_flags) only")
    extra_flags = list(extra_flags) if extra_flags else None
    tgt = resolve(target)  # the one lookup: the Target goes down from here (a bad name fails before a child)
    check_limits(problem, tgt)
    if isinstance(plan, dict):  # a stored plan's plain data (as Plan.to_dict writes it)
        plan = Plan.from_dict(plan)
    if plan is not None and not isinstance(plan, Plan):
        raise TypeError(f"plan: expected a Plan, its dictionary or None, got {plan!r}")
    if plan is not None and (options or plan.target != tgt.name):
        why = f"options {', '.join(options)} given too" if options else f"it is for {plan.target}"
        raise PlanError(f"plan: a given plan is carried out as it is, for its own target; here {why}")
    if plan is not None:
        check_plan(problem, plan)
        if plan.decision is None:  # no rule made it: op.plan says where it came from
            plan = replace(plan, decision=Decision("given", "carried out as given (compile_op plan=...): a stored or "
                                                   "hand-written plan, checked, not decided"))  # fmt: skip
    check_requests(deterministic, max_workspace_bytes)
    wants = {"deterministic": deterministic, "max_workspace_bytes": max_workspace_bytes}
    constrained = deterministic or max_workspace_bytes is not None
    if constrained and (plan is not None or options):
        given = plan_properties(problem, plan if plan is not None else _decided(problem, tgt, options))
        _check_meets(given, "the given plan" if plan is not None else "the plan of the given options", **wants)
    if cache is False and constrained and plan is None and not options:  # the heuristic's, or the first that meets them
        plan = select(problem, tgt, dbs=[], **wants).variant.plan
    if cache is False:
        if not isolate:
            return build_op(problem, tgt, plan, extra_flags, output_arg=output_arg, **options)
        from convbw_mlir.build.isolate import call

        return call(build_op, problem, tgt, plan, extra_flags, output_arg=output_arg,
                    what=f"{problem.name} for {tgt.name}", timeout=timeout, **options)  # fmt: skip
    if not (cache is None or isinstance(cache, (KernelCache, str, os.PathLike))) or isinstance(cache, bool):
        raise TypeError(f"cache: expected a KernelCache, a folder, None or False, got {cache!r:.60}")
    if isinstance(cache, (str, os.PathLike)) and not os.fspath(cache):
        raise ValueError("cache: expected a folder, got ''")
    selection = None
    if plan is not None:
        variant = Variant("convbw", plan)
    elif options:
        variant = Variant("convbw", _decided(problem, tgt, options))
    else:
        selection = select(problem, tgt, **wants)
        variant = selection.variant
    op, _ = cached_build(problem, tgt, variant, cache, extra_flags, output_arg=output_arg, isolate=isolate,
                         timeout=timeout)  # fmt: skip
    op.selection = selection
    if variant.plan is not None and op.plan == variant.plan and op.plan.decision is None:  # a cached kernel's plan
        op.plan = replace(op.plan, decision=variant.plan.decision)
    return op


def _iterable(value: Any) -> list[Any]:
    try:
        return list(value)
    except TypeError:
        return [None]  # not iterable: refused as not a list of strings


def _decided(problem: ConvBwdWeightProblem, tgt: Target, options: dict[str, Any]) -> Plan:
    from convbw_mlir.pipelines import for_target

    for_target(tgt, **options)  # the pipeline's own errors for unknown options and bad values
    return decide(problem, tgt, **options)


def _check_meets(plan: Plan, what: str, deterministic: bool, max_workspace_bytes: int | None) -> None:
    """Refuse a given plan (or the plan of given options) that does not meet the requests.

    Raises:
        ValueError: naming the request, its value and what the plan needs.
    """
    if deterministic and not plan.deterministic:
        raise ValueError(f"deterministic: True, but {what} is not deterministic")
    if max_workspace_bytes is not None and plan.workspace_bytes > max_workspace_bytes:
        raise ValueError(f"max_workspace_bytes: {max_workspace_bytes}, but {what} needs {plan.workspace_bytes} bytes "
                         "of workspace")  # fmt: skip
