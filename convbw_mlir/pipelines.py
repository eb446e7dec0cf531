"""The one definition of what runs for each target, in order.

``compile_op``, ``convbw-opt --convbw-pipeline=<target>`` and the benchmarks all take their pipeline
from :func:`for_target`; nothing else decides which convbw passes run or in what order.
"""

from __future__ import annotations

from typing import Any

from convbw_mlir.passes import PASSES, PipelineElement, PipelineError, format_pipeline
from convbw_mlir.targets import Target, resolve

__all__ = ["for_target", "pipeline_text"]


def for_target(target: Target | str, **options: Any) -> list[PipelineElement]:
    """The ordered pipeline for ``target``.

    Args:
        target: a :class:`~convbw_mlir.targets.Target` or a name from :data:`convbw_mlir.targets.TARGETS`.
        **options: pass options by field name, applied to every pass that has that option (the plan's
            overrides, e.g. ``k_batch=4``, ``tile_m=64``; see :class:`convbw_mlir.plan.Overrides`).

    Raises:
        ValueError: unknown target, an option no pass of this pipeline takes, or a value the plan refuses.
    """
    tgt = resolve(target)
    # The plan decides everything; the target-independent rewrites that carry it out run for every
    # target, host included, so their numerics are tested on the CPU; the GPU passes only annotate the
    # contraction for IREE.
    stages: list[str | tuple[str, dict[str, Any]]] = [
        ("convbw-plan", {"target": tgt.name}),
        ("convbw-relayout", {}),  # the plan's layout (plan.relayout), before any kernel is built
        *([("convbw-explicit-kernel", {})] if tgt.family in ("nvidia", "cdna", "rdna") else []),  # strategy explicit
        ("convbw-explicit-gemm", {}),
        ("convbw-split-k", {}),
        ("convbw-lower-to-linalg", {}),
    ]
    if tgt.is_gpu:
        stages += [("convbw-tile", {}), ("convbw-map-mma", {})]
    stages += ["canonicalize", "cse"]
    used: set[str] = set()
    known: set[str] = set()
    elements = []
    for stage in stages:
        if isinstance(stage, str):
            elements.append(PipelineElement(stage))
            continue
        argument, fixed = stage
        if argument not in PASSES:  # a pass of this list not written yet must not pass silently
            raise PipelineError(f"pipeline: {argument} is not registered")
        cls = PASSES[argument]
        names = {f.name for f in cls.option_fields()}
        known |= names - fixed.keys()
        mine = {k: v for k, v in options.items() if k in names}
        used |= mine.keys()
        elements.append(PipelineElement(argument, cls(**{**fixed, **mine})))
    unknown = set(options) - used
    if unknown:
        raise PipelineError(f"options: {', '.join(sorted(unknown))} taken by no pass of the {tgt.name} pipeline; "
                            f"known: {', '.join(sorted(known))}")  # fmt: skip
    return elements


def pipeline_text(target: str, **options: Any) -> str:
    """The replayable pipeline string of :func:`for_target`."""
    return format_pipeline(for_target(target, **options))
