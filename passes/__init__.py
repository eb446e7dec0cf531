"""convbw-mlir's passes (installed as ``convbw_mlir.passes``), one module per pass.

Importing this package registers every pass under its pipeline argument in :data:`PASSES`.
"""

from convbw_mlir.passes import lower_to_linalg  # noqa: F401  (registers convbw-lower-to-linalg)
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
