"""convbw-mlir: grouped convolution weight gradients compiled through MLIR and IREE.

The problem model, the reference and the runtime import with only ``iree-base-runtime`` and numpy;
``compile_op`` loads the IREE compiler on first use.
"""

from typing import Any

from convbw_mlir.problem import LAYOUTS, ConvBwdWeightProblem, Epilogue, Layout

__all__ = ["LAYOUTS", "CompiledOp", "ConvBwdWeightProblem", "Epilogue", "Layout", "compile_op"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # Lazy, so that `import convbw_mlir` works on a machine with only the IREE runtime.
    if name == "compile_op":
        from convbw_mlir.dispatch.api import compile_op

        return compile_op
    if name == "CompiledOp":
        from convbw_mlir.build.artifact import CompiledOp

        return CompiledOp
    raise AttributeError(f"module 'convbw_mlir' has no attribute {name!r}")
