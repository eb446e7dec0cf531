"""What :func:`convbw_mlir.compiler.compile_op` calls: select the variant, then get it from the cache."""

from __future__ import annotations

import os
from typing import Any

from convbw_mlir.compiler import CompiledOp
from convbw_mlir.dispatch.build import cached_build
from convbw_mlir.dispatch.cache import KernelCache
from convbw_mlir.dispatch.select import select
from convbw_mlir.dispatch.variants import Variant
from convbw_mlir.plan import decide
from convbw_mlir.problem import ConvBwdWeightProblem


def compile_cached(problem: ConvBwdWeightProblem, target: str, extra_flags: list[str] | None, plan: Any,
                   options: dict[str, Any], cache: Any, *, output_arg: bool = False, isolate: bool = False,
                   timeout: float | None = None) -> CompiledOp:  # fmt: skip
    """compile_op's work through the cache: the given plan, the plan of the given options, or select's choice.
    (compile_op has checked the limits and a given plan.) With ``isolate`` only a miss starts a child."""
    if not (cache is None or isinstance(cache, (KernelCache, str, os.PathLike))) or isinstance(cache, bool):
        raise TypeError(f"cache: expected a KernelCache, a folder, None or False, got {cache!r:.60}")
    if isinstance(cache, (str, os.PathLike)) and not os.fspath(cache):
        raise ValueError("cache: expected a folder, got ''")
    selection = None
    if plan is not None:
        variant = Variant("convbw", plan)
    elif options:
        from convbw_mlir.pipelines import for_target

        for_target(target, **options)  # the pipeline's own errors for unknown options and bad values
        variant = Variant("convbw", decide(problem, target, **options))
    else:
        selection = select(problem, target)
        variant = selection.variant
    op, _ = cached_build(problem, target, variant, cache, extra_flags, output_arg=output_arg, isolate=isolate,
                         timeout=timeout)  # fmt: skip
    op.selection = selection
    return op
