"""Any channel count in the explicit sm_80 kernel (issue 23, item 2): odd C or K in layout 2.

A row of x or dy that is not 4-byte aligned (odd C or K: 2-byte rows) cannot go by ``cp.async``; such an
operand goes by the register path (``gemm_sm80._load_tile_cl``: masked element loads, stored to shared
memory as the copies would have filled it). Numerics under the sm_80 emulator against float64; the GPU
numbers: bench/first_layers.py, docs/explicit-kernels.md "Odd channels and first layers"."""

from __future__ import annotations

import pytest
from sm80_emulator import module_error

from convbw_mlir.plan import PlanError, decide
from convbw_mlir.policies.sm80 import GemmTiling, gemm_shape, register_rounds
from convbw_mlir.problem import ConvBwdWeightProblem as P

BF16_DW = 2.0**-8  # rounding dW to bf16: half an ulp of the largest entry (tests/test_explicit_bf16.py)


def emulated_error(p: P, **options) -> float:
    from convbw_mlir.passes.explicit_kernel import ExplicitKernel

    return module_error(p, decide(p, "sm_80", strategy="explicit", **options), [ExplicitKernel()], seed=3)


def first_layer(c: int = 3, k: int = 16, size: int = 12, batch: int = 2, **kw) -> P:
    """A first layer's shape, small: C channels, 7x7, stride 2, padding 3 (ResNet's conv1)."""
    return P(1, batch, c, k, (size, size), (7, 7), stride=2, pad_low=3, pad_high=3, layout=2, **kw)


@pytest.mark.parametrize(
    ("problem", "options"),
    [
        (first_layer(), {}),  # C = 3: x by the register path, N = 147 odd and ragged
        (first_layer(k=9), {"k_batch": 2}),  # odd K too: dy by the register path; split-K
        (P(1, 2, 5, 9, (6, 6), (3, 3), pad_low=1, pad_high=1, layout=2), {"tile_m": 64, "tile_n": 64,
                                                                           "subgroups_m": 2, "subgroups_n": 2}),
        (P(2, 2, 3, 7, (5, 5), (1, 1), layout=2), {}),  # a plain 1x1 GEMM, 2 groups: x bound [N*H*W, G, C]
        (P(1, 3, 3, 16, (9, 9), (3, 3), stride=2, dilation=2, pad_low=2, pad_high=1, layout=2), {}),
    ],
)  # fmt: skip
def test_odd_channels_match_float64_under_emulation(problem, options):
    assert emulated_error(problem, **options) < 2e-3


@pytest.mark.parametrize("dw", ["bf16", "f32"])
def test_odd_channels_in_bf16_match_float64_under_emulation(dw):
    assert emulated_error(first_layer(k=9, dtype="bf16", dw_dtype=dw)) < BF16_DW


def test_register_path_zero_fills_what_it_does_not_load(monkeypatch):
    """Keeping the clamped element where a tap falls in the padding (in place of zero) is wrong: the masks
    of the register path are what zero-fill does for cp.async."""
    from convbw_mlir.kernels import gemm_sm80

    real = gemm_sm80._gather_coords
    monkeypatch.setattr(gemm_sm80, "_gather_coords", lambda ix, conv, outs, taps, valid: (
        real(ix, conv, outs, taps, valid)[0], valid))  # fmt: skip
    assert emulated_error(first_layer()) > 0.01


def test_first_layer_is_taken_by_the_plan_with_split_k():
    """ResNet-50's conv1 (C = 3, 7x7 stride 2, N = 256): the GEMM is M = 64, N = 147, a reduction of
    256 x 112 x 112; the plan takes our kernel and splits the reduction to fill the machine."""
    conv1 = first_layer(k=64, size=224, batch=256)
    plan = decide(conv1, "sm_80")
    assert plan.strategy == "explicit" and plan.split is not None and plan.split.k_batch > 1
    shape = gemm_shape(conv1)
    assert (shape.m, shape.n, shape.reduction) == (64, 147, 256 * 112 * 112)


def test_tiling_refuses_a_register_path_tile_that_threads_do_not_cover():
    """Odd channels move 8 elements a thread: with 256 threads, a 64-row tile of dy (K = 9) 16 deep is 128
    groups, fewer than the threads (a pass would cover 32 reduction rows of a 16-row tile)."""
    shape = gemm_shape(first_layer(k=9))
    assert GemmTiling(64, 256, 64, 3, 32, 64).problems(shape) == []
    assert GemmTiling(64, 256, 16, 3, 32, 64).problems(shape) == [
        "tiling: the bmx16 tile is no whole number of 16-byte copies per thread"
    ]


def test_wave_specialization_refuses_odd_channels_by_name():
    with pytest.raises(PlanError, match="producers: 4 with odd channels"):
        decide(first_layer(size=16), "sm_80", strategy="explicit", producers=4)


def _conv1(n):  # ResNet-50's first layer, channels-last
    return P(1, n, 3, 64, (224, 224), (7, 7), stride=2, pad_low=3, pad_high=3, layout=2)


def test_register_path_rounds_count_each_element_wise_operand_per_k_tile():
    big, small = GemmTiling(128, 256, 64, 3, 64, 64), GemmTiling(64, 64, 64, 3, 32, 32)
    assert register_rounds(gemm_shape(_conv1(32)), big) == 8  # x only (C = 3): 256 rows / 8 a load, 256 threads
    assert register_rounds(gemm_shape(_conv1(32)), small) == 4
    odd_both = P(1, 8, 3, 45, (16, 16), (3, 3), layout=2)
    assert register_rounds(gemm_shape(odd_both), small) == 8  # dy (K = 45) too
    assert register_rounds(gemm_shape(_conv1(32).with_(in_channels=8)), big) == 0  # cp.async rows


def test_register_path_problems_take_small_tiles_and_fill_every_resident_workgroup():
    # measured (decisions.md#register-path-tiles): conv1 N=32 64x64/108 166 us, 128x256/108 325 us (cuDNN 132)
    plan = decide(_conv1(32), "sm_80")
    assert (plan.tile.m, plan.tile.n) == (64, 64) and plan.split.k_batch == 108  # 3 tiles x 108 = 3 a SM
    assert decide(_conv1(32).with_(in_channels=8), "sm_80").tile.n == 256  # cp.async rows: the tensor-rate model
