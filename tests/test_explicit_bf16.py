"""bf16 in the explicit sm_80 kernel and its StreamK and wave-specialized forms (issue 23, item 5).

bf16 moves as f16 does (16-bit elements: the same ``cp.async`` and ``ldmatrix``); only ``mma.sync``'s type
changes (m16n8k16 ``.bf16`` -> f32, f16's fragment layouts). Numerics without a GPU: the sm_80 emulator
holds bf16 as ``ml_dtypes.bfloat16`` (rounding as the GPU does) and runs the module against float64.
The GPU numbers are still to be measured (bench/explicit_conv.py --types bf16): until then the plan takes
the kernel for bf16 only where the strategy asks for it."""

from __future__ import annotations

import pytest
from sm80_emulator import module_error

from convbw_mlir import compile_op
from convbw_mlir.build.iree import executable_intermediates
from convbw_mlir.plan import PlanError, decide
from convbw_mlir.policies import amd
from convbw_mlir.policies.sm80 import INTRINSICS, takes_by_default
from convbw_mlir.problem import ConvBwdWeightProblem as P

# Rounding dW to bf16 (8 significant bits) costs up to half an ulp of the largest entry: 2^-9 relative.
BF16_DW = 2.0**-8
F32_DW = 1e-4  # bf16 products are exact in f32: only the f32 sums' rounding remains


def emulated_error(p: P, **options) -> float:
    from convbw_mlir.passes.explicit_kernel import ExplicitKernel

    return module_error(p, decide(p, "sm_80", strategy="explicit", **options), [ExplicitKernel()], seed=3)


def bf16(ck: str, layout: int = 2, dw: str = "bf16") -> P:
    return P.from_ck(ck, layout=layout).with_(dtype="bf16", dw_dtype=dw)


@pytest.mark.parametrize(
    ("ck", "layout", "options"),
    [
        ("2 1 2 36 16 3 3 7 7 1 1 1 1 1 1 1 1", 2, {}),  # padded 3x3, K = 36: ragged M and N, 8-byte copies
        ("2 1 2 16 8 3 3 9 9 2 2 2 2 1 1 1 1", 2, {}),  # stride 2, dilation 2, padded
        ("2 2 4 36 16 3 3 7 7 1 1 1 1 1 1 1 1", 2, {"k_batch": 3}),  # 2 groups, split-K: stage 2 rounds to bf16
        ("2 1 3 16 24 1 1 6 6 1 1 1 1 0 0 0 0", 2, {"k_batch": 2}),  # a plain 1x1 GEMM
        ("2 1 2 16 8 3 3 11 11 2 2 2 2 2 2 0 0", 4, {}),  # layout 4: x gathered by element loads
        ("2 1 4 16 8 3 3 8 8 1 1 1 1 1 1 1 1", 2, {"producers": 4}),  # wave specialization
        ("2 2 2 16 8 1 1 16 16 1 1 1 1 0 0 0 0", 4, {"streamk": 3}),  # StreamK (layout 4)
    ],
)  # fmt: skip
def test_bf16_kernels_match_float64_under_emulation(ck, layout, options):
    assert emulated_error(bf16(ck, layout), **options) < BF16_DW


@pytest.mark.parametrize("options", [{}, {"k_batch": 2}])
def test_bf16_in_f32_dw_out_keeps_the_f32_accumulation(options):
    """ckProfiler's type 2 (bf16 in, f32 dW): nothing rounds to bf16 after the products."""
    assert emulated_error(bf16("2 1 2 36 16 3 3 7 7 1 1 1 1 1 1 1 1", dw="f32"), **options) < F32_DW


def test_bf16_plan_names_the_bf16_mma_and_compiles_to_it():
    p = bf16("2 1 4 64 32 3 3 14 14 1 1 1 1 1 1 1 1")
    op = compile_op(p, "sm_80", strategy="explicit", cache=False)
    assert op.plan.tile.intrinsic == INTRINSICS["bf16"] == "NV_MMA_SYNC_F32_16x8x16_BF16"
    isa = executable_intermediates(op.stages["linalg"], "sm_80").isa
    assert "llvm.nvvm.mma.m16n8k16.row.col.bf16" in isa and "row.col.f32.f32" not in isa


@pytest.mark.parametrize(
    ("problem", "message"),
    [
        (P(1, 1, 64, 64, (8, 8), (3, 3), layout=2, dtype="f32"), "dtype: f32 (f16 or bf16)"),
        (P(1, 1, 64, 64, (8, 8), (3, 3), layout=2, dtype="bf16", dw_dtype="f16"), "dw_dtype: f16 (f32 or bf16"),
    ],
)  # fmt: skip
def test_bf16_refusals_name_the_field_and_value(problem, message):
    with pytest.raises(PlanError) as e:
        decide(problem, "sm_80", strategy="explicit")
    assert message in str(e.value)


def test_a_stored_f16_amd_plan_is_refused_for_the_bf16_problem_naming_the_instruction():
    """The AMD forms take bf16 too (their own bf16 instruction): an f16 plan replayed on bf16 is refused."""
    f16 = P(1, 1, 64, 64, (8, 8), (3, 3), layout=4)
    stored = decide(f16, "gfx942", strategy="explicit")
    assert amd.refusals(f16.with_(dtype="bf16", dw_dtype="bf16"), stored) == [
        "tile: intrinsic MFMA_F32_16x16x16_F16 is not one of gfx942's for bf16"
    ]
    assert decide(f16.with_(dtype="bf16"), "gfx942", strategy="explicit").tile.intrinsic == "MFMA_F32_16x16x16_BF16"


def test_plan_takes_the_kernel_for_bf16_by_itself_as_for_f16():
    """bf16 was measured faster than codegen on all 24 dense problems (docs/decisions.md#explicit-by-default):
    the plan takes it as for f16; strategy=codegen still asks for IREE's."""
    f16 = P(8, 1, 64, 64, (16, 16), (3, 3), pad_low=1, pad_high=1, layout=2)
    assert takes_by_default(f16) and decide(f16, "sm_80").strategy == "explicit"
    for dw in ("bf16", "f32"):
        p = f16.with_(dtype="bf16", dw_dtype=dw)
        assert takes_by_default(p) and decide(p, "sm_80").strategy == "explicit"
        assert decide(p, "sm_80", strategy="codegen").strategy != "explicit"
