"""The plan's switches, in one table: whether ``decide`` without options chooses a kernel of ours by itself
where it was measured the fastest correct one (each switch names its measurement). The rules that read them
are in :data:`convbw_mlir.plan.RULES`; the policies read them from here, at call time (a test may flip one).

With every switch off, the plan's own choices are its codegen's (and the sm_80 kernel's by its class rule,
``policies.sm80.takes_by_default``); ``strategy=explicit`` and ``merge-groups`` reach the kernels either way.
"""

from __future__ import annotations

__all__ = [
    "DEPTHWISE_BY_DEFAULT",
    "FOLD_RANK_BY_DEFAULT",
    "GEMV_BY_DEFAULT",
    "GROUPED_BY_DEFAULT",
    "MERGE_BY_DEFAULT",
    "SHORT_REDUCTION_CODEGEN",
    "SWITCHES",
    "WGMMA_MERGE_BY_DEFAULT",
    "WGMMA_PAD_BY_DEFAULT",
    "current",
]

# The depthwise kernel (and its grouped form) for depthwise problems and groups of at most GROUPED_BY_DEFAULT
# channels: measured faster than codegen there (docs/decisions.md#depthwise-by-default).
DEPTHWISE_BY_DEFAULT = True
# The widest group (in and out channels) the grouped form takes where the implicit GEMM does not merge the groups
# (odd channels): beyond it the merged GEMM wins (docs/decisions.md#thin-groups).
GROUPED_BY_DEFAULT = 4
# Thin groups merged into one implicit GEMM by the rule (policies.sm80.merge_rule; strategy=explicit applies it
# either way): faster than one group a GEMM on every layer measured (docs/decisions.md#thin-groups).
MERGE_BY_DEFAULT = True
# The split-reduction GEMV kernel for GEMV-like problems (K or C small) codegen would compute by SIMT
# (docs/decisions.md#gemv-by-default).
GEMV_BY_DEFAULT = True
# IREE's codegen for a plain GEMM of a very short reduction on sm_90a (an SE block's 1x1 at batch 32): measured faster
# than our kernels there (docs/decisions.md#short-reduction-codegen).
SHORT_REDUCTION_CODEGEN = True
# Thin groups (C within policies.sm90.MERGE_RULE_CHANNELS, 4-16) on sm_90a in the wgmma kernel's boxed form by its
# rule (policies.sm90.merge_rule; wgmma-merge asks for it either way): 2.0-3.1x the sm_80 kernel by width on an H100
# (docs/decisions.md#wgmma-groups).
WGMMA_MERGE_BY_DEFAULT = True
# Dense layers with C % 8 == 0, C % 64 != 0 on sm_90a in the wgmma kernel with channels padded to whole 64-channel
# boxes (policies.sm90.PADDED_CHANNELS; wgmma-pad-channels asks for it either way), where the sm_80 kernel took them:
# 0.98-2.12x it on the held rows of an H100 (docs/decisions.md#short-reduction-dense item 4).
WGMMA_PAD_BY_DEFAULT = True
# A 3-D problem with a unit filter extent (1 x kh x kw, or kd x 1 x 1 with H and W unstrided, unpadded) planned and
# computed as its 2-D twin by reshapes on NVIDIA (problem.fold_rank; fold-rank=true asks for it either way): off
# until measured side by side with the 3-D plan (docs/decisions.md#rank-fold; the pack .art/rankfold measures it).
FOLD_RANK_BY_DEFAULT = False

# name -> what it switches (for ``convbw select`` and the docs; the values are the module's names above)
SWITCHES: dict[str, str] = {
    "DEPTHWISE_BY_DEFAULT": "the depthwise kernel for depthwise problems and thin groups on NVIDIA",
    "GROUPED_BY_DEFAULT": "the widest group (channels) the depthwise kernel's grouped form takes by default",
    "MERGE_BY_DEFAULT": "thin groups merged into one implicit GEMM on NVIDIA",
    "GEMV_BY_DEFAULT": "the split-reduction GEMV kernel for K or C small where codegen's plan is SIMT",
    "SHORT_REDUCTION_CODEGEN": "IREE's codegen for a plain GEMM of a very short reduction on sm_90a",
    "WGMMA_MERGE_BY_DEFAULT": "thin and medium groups in the sm_90a wgmma kernel's boxed form (its rule's widths)",
    "WGMMA_PAD_BY_DEFAULT": "dense layers with C % 64 != 0 in the sm_90a wgmma kernel, channels padded to 64-boxes",
    "FOLD_RANK_BY_DEFAULT": "3-D problems with a unit filter extent as their 2-D twin by reshapes on NVIDIA",
}


def current() -> dict[str, bool | int]:
    """Each switch's value now (a test may have flipped one)."""
    return {name: globals()[name] for name in SWITCHES}
