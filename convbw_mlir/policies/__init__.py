"""Our kernels' policies, one module per family of kernels our passes write: which problems it takes, its
tiling and its rule, its split rule, its refusals (pure Python, no MLIR). The plan asks the target's family
once (:func:`for_target`), for a plan (``plan``) or why a given plan cannot be carried out (``refusals``);
the kernels' builders read their tiling from the same module (``tiling``).

    sm80   NVIDIA: the implicit GEMM with cp.async, ldmatrix, mma.sync; its StreamK and wave-specialized forms
    sm90   sm_90a (Hopper): the implicit GEMM with TMA im2col and wgmma where it takes the problem, else sm80's
    amd    AMD: MFMA (CDNA) and WMMA (RDNA 3 and 4) forms
    depthwise  NVIDIA: the depthwise kernel (and its grouped form for thin groups); the plan asks it before
           sm80 for the problems it takes (``convbw_mlir.plan``)
    gemv   NVIDIA: the split-reduction GEMV kernel (K or C small); the plan asks it where codegen would have no
           matrix-core tile
    switches   the plan's ``*_BY_DEFAULT`` switches, in one table

What :func:`for_target` returns is a :class:`KernelPolicy` (each family's module is one).
"""

from __future__ import annotations

from typing import Any, Protocol

from convbw_mlir.plan_data import Overrides, Plan
from convbw_mlir.policies import amd, sm80, sm90
from convbw_mlir.targets import Target

__all__ = ["FAMILIES", "KernelPolicy", "for_target"]


class KernelPolicy(Protocol):
    """What the plan asks a family of our kernels (:mod:`~convbw_mlir.policies.sm80`, ``sm90``, ``amd``)."""

    def takes_by_default(self, problem: Any) -> bool:
        """Whether the plan may choose the kernel by itself (where it was measured the fastest correct one)."""
        ...

    def plan(self, problem: Any, tgt: Target, opts: Overrides) -> Plan:
        """The kernel's plan for ``problem`` with ``opts``; PlanError where it cannot carry them out."""
        ...

    def refusals(self, problem: Any, plan: Plan) -> list[str]:
        """Why the kernel cannot carry ``plan`` out ("field: value" lines; empty: it can)."""
        ...

    def tiling(self, plan: Plan) -> Any:
        """The kernel tiling a plan's tile stands for."""
        ...


# Target family -> the policy of the kernels written for it.
FAMILIES: dict[str, KernelPolicy] = {"nvidia": sm80, "cdna": amd, "rdna": amd}


def for_target(target: Target) -> KernelPolicy | None:
    """The policy of the explicit kernels written for ``target``'s family, or None (no kernel of ours there);
    a target with wgmma (sm_90a) asks :mod:`~convbw_mlir.policies.sm90` first."""
    return sm90 if target.wgmma_n else FAMILIES.get(target.family)
