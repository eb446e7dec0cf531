"""The one definition of what runs for each target, in order.

``compile_op``, ``convbw-opt --convbw-pipeline=<target>`` and the benchmarks all take their pipeline
from :func:`for_target`; nothing else decides which convbw passes run or in what order.
"""

from __future__ import annotations

from typing import Any

from convbw_mlir.passes import PASSES, PipelineElement, PipelineError, format_pipeline
from convbw_mlir.targets import get_target

__all__ = ["for_target", "pipeline_text"]


def for_target(target: str, **options: Any) -> list[PipelineElement]:
    """The ordered pipeline for ``target``.

    Args:
        target: a name from :data:`convbw_mlir.targets.TARGETS`.
        **options: pass options by field name, applied to every pass that has that option
            (e.g. ``k_batch=4``).

    Raises:
        ValueError: unknown target, or an option no pass of this pipeline takes.
    """
    tgt = get_target(target)
    # Target-independent rewrites run for every target, host included, so their numerics are tested on
    # the CPU; the GPU passes only annotate the contraction for IREE.
    stages: list[str | tuple[str, dict[str, Any]]] = [
        ("convbw-explicit-gemm", {}),
        ("convbw-split-k", {"plan_for": target}),
        ("convbw-lower-to-linalg", {}),
    ]
    if tgt.is_gpu:
        # Grouped convolutions and GEMMs: IREE's own tiles measured as fast or faster on the H200
        # (passes/tile.py); on RDNA IREE's tiles spill (ResNeXt G=32 C=8 on gfx1100: 984 B scratch; the
        # 1x1 GEMMs of CK's list: 428-492 B), ours do not.
        own = "mma" if tgt.family == "rdna" else "iree"
        tile = {"target": target, "grouped": own, "gemm": own}
        stages += [("convbw-tile", tile), ("convbw-map-mma", {"target": target})]
    stages += ["canonicalize", "cse"]
    used: set[str] = set()
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
        mine = {k: v for k, v in options.items() if k in names}
        used |= mine.keys()
        elements.append(PipelineElement(argument, cls(**{**fixed, **mine})))
    unknown = set(options) - used
    if unknown:
        raise PipelineError(f"options: {', '.join(sorted(unknown))} taken by no pass of the {target} pipeline")
    return elements


def pipeline_text(target: str, **options: Any) -> str:
    """The replayable pipeline string of :func:`for_target`."""
    return format_pipeline(for_target(target, **options))
