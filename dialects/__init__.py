"""MLIR dialects of convbw-mlir (installed as ``convbw_mlir.dialects``)."""
