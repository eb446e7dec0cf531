"""What :func:`convbw_mlir.compiler.compile_op` calls: select the variant, then get it from the cache."""

from __future__ import annotations

from typing import Any

from convbw_mlir.compiler import CompiledOp, get_target
from convbw_mlir.dispatch.build import cached_build
from convbw_mlir.dispatch.cache import KernelCache
from convbw_mlir.dispatch.select import select
from convbw_mlir.dispatch.variants import Variant
from convbw_mlir.plan import PlanError, decide
from convbw_mlir.problem import ConvBwdWeightProblem


def compile_cached(problem: ConvBwdWeightProblem, target: str, extra_flags: list[str] | None, plan: Any,
                   options: dict[str, Any], cache: Any) -> CompiledOp:  # fmt: skip
    """compile_op's work through the cache: the given plan, the plan of the given options, or select's choice."""
    from convbw_mlir.limits import check_limits

    check_limits(problem, get_target(target))
    selection = None
    if plan is not None:
        if options or plan.target != target:
            why = f"options {', '.join(options)} given too" if options else f"it is for {plan.target}"
            raise PlanError(f"plan: a given plan is carried out as it is, for its own target; here {why}")
        variant = Variant("convbw", plan)
    elif options:
        from convbw_mlir.pipelines import for_target

        for_target(target, **options)  # the pipeline's own errors for unknown options and bad values
        variant = Variant("convbw", decide(problem, target, **options))
    else:
        selection = select(problem, target)
        variant = selection.variant
    root = cache.root if isinstance(cache, KernelCache) else cache
    op, _ = cached_build(problem, target, variant, None if root is None else str(root), extra_flags)
    op.selection = selection
    return op
