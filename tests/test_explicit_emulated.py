"""The explicit kernels' whole modules run on the CPU against float64: the kernel under the sm_80
emulator and the module's own tensor ops around it (the reshapes, a split's stage 2 from
``passes/explicit_kernel.py: _sum_splits``, StreamK's workspace and flags), so each test runs the
product's code, not a copy of its rules. The GPU numbers: docs/explicit-kernels.md.

Each test here kills a mutant the suite once let through (docs/mutation.md, issue 28)."""

from __future__ import annotations

import pytest
from sm80_emulator import module_error

from convbw_mlir.plan import decide
from convbw_mlir.problem import ConvBwdWeightProblem as P


def emulated_error(p: P, **options) -> float:
    """Max error of the emulated module (kernel and tensor ops) against float64, relative to the largest entry."""
    from convbw_mlir.passes.explicit_kernel import ExplicitKernel

    return module_error(p, decide(p, "sm_80", strategy="explicit", **options), [ExplicitKernel()], seed=3)


@pytest.mark.parametrize(
    "ck",
    [
        "2 1 2 16 8 3 3 9 9 2 2 1 1 1 1 1 1",  # stride 2
        "2 1 2 16 8 3 3 9 9 1 1 2 2 1 1 1 1",  # dilation 2
        "2 1 2 16 8 3 3 11 11 2 2 2 2 2 2 0 0",  # both, padded low only
    ],
)
def test_layout4_gather_matches_float64_with_stride_dilation_and_padding(ck):
    assert emulated_error(P.from_ck(ck, layout=4)) < 2e-3


@pytest.mark.parametrize(("dw_dtype", "k_batch"), [("f32", 3), ("f16", 2)])
def test_split_partials_are_summed_by_the_modules_own_stage_two(dw_dtype, k_batch):
    """``_sum_splits`` (zero-filled f32 sum, then rounding to dW's type) runs as the module has it."""
    p = P.from_ck("2 2 4 36 16 3 3 7 7 1 1 1 1 1 1 1 1", layout=4).with_(dw_dtype=dw_dtype)
    assert emulated_error(p, k_batch=k_batch) < 2e-3


@pytest.mark.parametrize(
    ("ck", "workgroups", "fixup"),
    [
        ("2 2 2 16 8 1 1 16 16 1 1 1 1 0 0 0 0", 3, "linear"),  # 2 tiles x 8 k tiles: both tiles split
        ("2 2 2 16 8 1 1 16 16 1 1 1 1 0 0 0 0", 5, "tree"),  # 5 contributors: levels 1 and 2 of the tree
        ("2 1 2 16 8 1 1 16 16 1 1 1 1 0 0 0 0", 7, "tree"),  # one tile, 7 ranks: a rank with two children
        ("2 1 2 16 8 1 1 16 16 1 1 1 1 0 0 0 0", 4, "linear"),  # one tile: the finisher adds 3 partials
        ("2 1 2 16 8 3 3 9 9 2 2 1 1 1 1 1 1", 3, "linear"),  # gathered (strided, padded) x
    ],
)
def test_streamk_partition_and_fixup_match_float64_under_emulation(ck, workgroups, fixup):
    """The persistent loop, the partial stores, the flag waits and the fixup of the kernel as built;
    workgroups run in order, so a wait on a later workgroup spins out (``Deadlock``)."""
    p = P.from_ck(ck, layout=4)
    assert emulated_error(p, streamk=workgroups, streamk_fixup=fixup) < 2e-3
