"""convbw-mlir's passes (installed as ``convbw_mlir.passes``), one module per pass.

Importing this package registers every pass under its pipeline argument in :data:`PASSES`.
"""

from convbw_mlir.passes import (  # noqa: F401  (each module registers its pass)
    explicit_gemm,
    explicit_kernel,
    lower_to_linalg,
    map_mma,
    plan,
    raise_linalg,
    relayout,
    split_k,
    tile,
)
from convbw_mlir.passes.framework import (
    PASSES,
    ConvbwPass,
    PipelineElement,
    PipelineError,
    build_pass_manager,
    format_pipeline,
    parse_pipeline,
)

__all__ = [
    "PASSES",
    "ConvbwPass",
    "PipelineElement",
    "PipelineError",
    "build_pass_manager",
    "format_pipeline",
    "parse_pipeline",
]
