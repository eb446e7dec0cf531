"""Our kernels' policies, one module per family of kernels our passes write: which problems it takes, its
tiling and its rule, its split rule, its refusals (pure Python, no MLIR). The plan asks the target's family
once (:func:`for_target`), for a plan (``plan``) or why a given plan cannot be carried out (``refusals``);
the kernels' builders read their tiling from the same module (``tiling``).

    sm80   NVIDIA: the implicit GEMM with cp.async, ldmatrix, mma.sync; its StreamK and wave-specialized forms
    sm90   sm_90a (Hopper): the implicit GEMM with TMA im2col and wgmma where it takes the problem, else sm80's
    amd    AMD: MFMA (CDNA) and WMMA (RDNA 3 and 4) forms
    depthwise  NVIDIA: the depthwise kernel (and its grouped form for thin groups); the plan asks it before
           sm80 for the problems it takes (``convbw_mlir.plan``)
"""

from __future__ import annotations

from types import ModuleType

from convbw_mlir.policies import amd, sm80, sm90
from convbw_mlir.targets import Target

__all__ = ["FAMILIES", "for_target"]

# Target family -> the policy module of the kernels written for it.
FAMILIES: dict[str, ModuleType] = {"nvidia": sm80, "cdna": amd, "rdna": amd}


def for_target(target: Target) -> ModuleType | None:
    """The policy of the explicit kernels written for ``target``'s family, or None (no kernel of ours there);
    a target with wgmma (sm_90a) asks :mod:`~convbw_mlir.policies.sm90` first."""
    return sm90 if target.wgmma_n else FAMILIES.get(target.family)
