"""The explicit sm_80 kernel in layout 2 (NHWGC/GKYXC/NHWGK) and the plan's tiling rule.

Numerics without a GPU: ``tests/sm80_emulator.py`` runs the kernel's IR (every thread of a workgroup,
nvgpu's ldmatrix and mma.sync with the PTX ISA's fragment layouts) against the float64 reference; the
same emulator reproduces the layout-4 kernel that was checked on the H100. The GPU numbers:
bench/explicit_conv.py, docs/explicit-kernels.md."""

from __future__ import annotations

import pytest
from sm80_emulator import module_error

from convbw_mlir import compile_op
from convbw_mlir.build.iree import executable_intermediates
from convbw_mlir.kernels import nvgpu
from convbw_mlir.plan import PlanError, decide, explicit_tiling
from convbw_mlir.policies.sm80 import GemmTiling, choose_tiling, gemm_shape, tiling_cost
from convbw_mlir.problem import ConvBwdWeightProblem as P

PADDED_K36 = P.from_ck("2 1 2 36 16 3 3 7 7 1 1 1 1 1 1 1 1")  # K = 36: 8-byte copies of dy; N ragged


def emulated_error(p: P, **options) -> float:
    """Max error of the emulated module (kernel and tensor ops) against float64, relative to the largest entry."""
    from convbw_mlir.passes.explicit_kernel import ExplicitKernel

    return module_error(p, decide(p, "sm_80", strategy="explicit", **options), [ExplicitKernel()], seed=3)


@pytest.mark.parametrize(
    ("ck", "options"),
    [
        ("2 1 2 36 16 3 3 7 7 1 1 1 1 1 1 1 1", {}),  # padded 3x3, K = 36 (4-element copies), 64x128
        ("2 1 2 16 8 3 3 9 9 2 2 2 2 1 1 1 1", {}),  # stride 2, dilation 2
        ("2 1 3 16 24 1 1 6 6 1 1 1 1 0 0 0 0", {"k_batch": 2}),  # a plain 1x1 GEMM, split in 2
        ("2 2 4 36 16 3 3 7 7 1 1 1 1 1 1 1 1", {"k_batch": 3}),  # 2 groups, 3 splits
        ("2 1 2 40 16 3 3 7 7 1 1 1 1 1 1 1 1", {"tile_m": 128, "tile_n": 64, "subgroups_m": 2, "subgroups_n": 2}),
        ("2 1 2 16 8 3 3 10 10 1 1 1 1 1 1 1 1", {"tile_m": 64, "tile_n": 64, "subgroups_m": 2, "subgroups_n": 2}),
        ("2 1 4 36 16 3 3 7 7 1 1 1 1 1 1 1 1", {"tile_n": 256}),  # the 8-warp 128x256 recipe
    ],
)  # fmt: skip
def test_layout2_kernel_matches_float64_under_emulation(ck, options):
    assert emulated_error(P.from_ck(ck), **options) < 2e-3


def test_emulator_reproduces_the_layout4_kernel_checked_on_the_gpu():
    assert emulated_error(PADDED_K36.with_(layout=4)) < 2e-3


def test_layout2_needs_the_transposed_ldmatrix(monkeypatch):
    """Both operands are reduction-outer in layout 2: without .trans the fragments are wrong."""
    plain = nvgpu.ldmatrix
    monkeypatch.setattr(nvgpu, "ldmatrix", lambda *a, transpose=False: plain(*a, transpose=False))
    assert emulated_error(PADDED_K36) > 0.1


def test_layout2_binds_dy_and_x_as_they_are_and_copies_both_by_cp_async():
    text = compile_op(P.from_ck("2 1 4 64 32 3 3 14 14 1 1 1 1 1 1 1 1"), "sm_80", strategy="explicit",
                      cache=False).stages["linalg"]  # fmt: skip
    assert "memref<784x1x64xf16>" in text and "memref<4x14x14x1x32xf16>" in text  # no im2col buffer
    assert "memref.load" not in text and "transpose = true" in text  # both operands by cp.async; ldmatrix.trans
    assert "tensor<1x64x3x3x32xf16>" in text  # GKYXC


def test_layout2_kernel_compiles_for_sm80_in_a_child_with_transposed_ldmatrix():
    p = P.from_ck("2 1 4 64 32 3 3 14 14 1 1 1 1 1 1 1 1")
    op = compile_op(p, "sm_80", strategy="explicit", isolate=True, cache=False)
    assert op.plan == decide(p, "sm_80", strategy="explicit") and len(op.vmfb) > 10_000
    llvm = executable_intermediates(op.stages["linalg"], "sm_80").isa
    for instruction in ("llvm.nvvm.cp.async.cg.shared.global.16.s", "llvm.nvvm.ldmatrix.sync.aligned.m8n8.x4.trans.b16",
                        "llvm.nvvm.mma.m16n8k16.row.col.f32.f32"):  # fmt: skip
        assert instruction in llvm


@pytest.mark.parametrize(
    ("problem", "message"),
    [
        (P(1, 1, 64, 64, (8, 8), (1, 1), layout=3), "layout: NGCHW/GKYXC/NGKHW"),  # a 1x1 stays layout 3
        (P(1, 1, 64, 64, (8, 8), (3, 3), dtype="f32"), "dtype: f32 (f16 or bf16)"),
    ],
)  # fmt: skip
def test_layout2_refusals_name_the_field_and_value(problem, message):
    with pytest.raises(PlanError) as e:
        decide(problem, "sm_80", strategy="explicit")
    assert message in str(e.value)


def test_tiling_rule_takes_64_rows_for_few_out_channels_and_the_recipe_for_large_gemms():
    small_m = gemm_shape(P.from_ck("2 1 2 36 256 3 3 25 25 1 1 1 1 1 1 1 1"))
    assert (choose_tiling(small_m, 108).bm, choose_tiling(small_m, 108).bn) == (64, 128)
    big = gemm_shape(P.from_ck("2 1 256 256 256 3 3 14 14 1 1 1 1 1 1 1 1"))
    assert choose_tiling(big, 108) == GemmTiling()  # 128x256x64, 3 stages, 8 warps
    # the cost model pays padding: K = 36 in 128-row tiles costs more than in 64-row ones
    assert tiling_cost(small_m, GemmTiling(64, 128, 64, 3, 32, 64), 108) < tiling_cost(small_m, GemmTiling(), 108)


def test_plan_takes_the_rules_tiling_unless_tile_options_are_given():
    p = P.from_ck("2 1 2 36 256 3 3 13 13 1 1 1 1 1 1 1 1")
    t = explicit_tiling(decide(p, "sm_80", strategy="explicit"))
    assert (t.bm, t.bn, t.threads) == (64, 128, 128)
    t = explicit_tiling(decide(p, "sm_80", strategy="explicit", tile_n=256))
    assert (t.bm, t.bn, t.threads) == (128, 256, 256)
