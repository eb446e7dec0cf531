"""Our kernels' builders (MLIR, through the bindings' dialect builders): the sm_80 implicit GEMM
(``gemm_sm80``) with its StreamK and wave-specialized forms, the AMD MFMA/WMMA forms (``gemm_cdna``,
``gemm_rdna``), and the dispatch they are wrapped in (``entry``). What each family takes and how it tiles
is its policy's (:mod:`convbw_mlir.policies`); nothing here decides."""
