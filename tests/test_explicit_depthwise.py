"""The depthwise sm_80 kernel (issue 23, item 4; convbw_mlir/kernels/depthwise_sm80.py): its numerics under
the sm_80 emulator against float64 (any rank, padding, stride, dilation, ragged chunks and segments, channel
vectors of 8, 4 and 1, f16 and bf16, dW f32 or the input type), the plan that asks for it, its refusals, and
the plan's one switch; and its grouped form for thin groups (at most 16 channels a group). The emulator
indexes numpy arrays, so a read outside x or dy fails here too."""

from __future__ import annotations

from dataclasses import replace

import pytest
from sm80_emulator import module_error

from convbw_mlir.plan import Plan, PlanError, Strategy, check_plan, decide
from convbw_mlir.policies import depthwise, switches
from convbw_mlir.problem import ConvBwdWeightProblem as P
from convbw_mlir.targets import get_target


def emulated_error(p: P, plan: Plan | None = None) -> float:
    from convbw_mlir.passes.explicit_kernel import ExplicitKernel

    plan = plan or decide(p, "sm_80", strategy="explicit")
    assert plan.depthwise is not None
    return module_error(p, plan, [ExplicitKernel()], seed=3)


def dw(groups: int, batch: int, size, filt, **kw) -> P:
    return P(groups, batch, 1, 1, size, filt, layout=2, **kw)


CASES = {
    "3x3_pad": dw(16, 2, (6, 7), (3, 3), pad_low=1, pad_high=1),
    "7x7_pad3_ragged_chunks": dw(24, 2, (9, 10), (7, 7), pad_low=3, pad_high=3),  # 7 taps in runs of 4: one masked
    "3x3_stride2_vector4": dw(12, 3, (9, 11), (3, 3), stride=2, pad_low=1, pad_high=1),
    "5x5_stride2_pad_after": dw(8, 2, (13, 12), (5, 5), stride=(2, 1), pad_low=(2, 0), pad_high=(1, 3)),
    "odd_groups_vector1": dw(5, 2, (5, 9), (3, 2), dilation=(1, 2), pad_low=(1, 0), pad_high=(1, 1)),
    "1d_long_segments": dw(8, 2, (150,), (31,), pad_low=15, pad_high=15),  # a conformer's 31 taps, 3 segments
    "1d_dilated": dw(3, 4, (37,), (5,), dilation=2, pad_low=4, pad_high=4),
    "1d_causal": dw(16, 3, (37,), (4,), pad_low=3, pad_high=0),  # Mamba's conv: left pad only, odd length
    "2d_17x17_channels_cut": dw(32, 1, (9, 10), (17, 17), pad_low=8, pad_high=8),  # fewer channels, threads <= 256
    "3d": dw(8, 2, (4, 5, 6), (3, 3, 3), stride=(1, 2, 1), pad_low=1, pad_high=1),
    "bf16": dw(16, 2, (6, 7), (3, 3), pad_low=1, pad_high=1, dtype="bf16", dw_dtype="bf16"),
    "f16_in_f32_out": dw(16, 2, (8, 8), (5, 5), pad_low=2, pad_high=2, dw_dtype="f32"),
}


@pytest.mark.parametrize("name", CASES)
def test_depthwise_kernel_matches_float64_under_emulation(name):
    p = CASES[name]
    tolerance = {"bf16": 2.0**-8, "f32": 1e-4}.get(p.dw_dtype, 2e-3)
    assert emulated_error(p) < tolerance


THIN = {
    "c4_k4_3x3_vector4": P(4, 2, 4, 4, (6, 7), (3, 3), pad_low=1, pad_high=1, layout=2),
    "c3_k5_stride2_vector1": P(6, 2, 3, 5, (7, 6), (3, 3), stride=2, pad_low=1, pad_high=1, layout=2),
    "1d_c8_k2_dilated": P(3, 2, 8, 2, (9,), (5,), dilation=2, pad_low=2, pad_high=2, layout=2),
    "3d_c16_k16_bf16_f32_out": P(2, 2, 16, 16, (3, 4, 5), (3, 3, 3), pad_low=1, pad_high=1, layout=2,
                                 dtype="bf16", dw_dtype="f32"),
}  # fmt: skip


@pytest.mark.parametrize("name", THIN)
def test_grouped_form_for_thin_groups_matches_float64_under_emulation(name):
    p = THIN[name]
    plan = Plan("sm_80", Strategy.EXPLICIT, depthwise=depthwise._rule(p, get_target("sm_80")))  # a stored plan's way
    check_plan(p, plan)
    assert emulated_error(p, plan) < (1e-4 if p.dw_dtype == "f32" else 2e-3)


def test_thin_groups_keep_the_implicit_gemm_and_reach_the_grouped_form_only_by_a_stored_plan(monkeypatch):
    # The implicit GEMM takes odd channel counts (a register path: decisions.md#first-layers), so
    # strategy=explicit gives it thin groups too; the grouped form is not measured: a tuned or written plan.
    odd = decide(THIN["c3_k5_stride2_vector1"], "sm_80", strategy="explicit")
    assert odd.depthwise is None and odd.tile is not None
    even = decide(THIN["c4_k4_3x3_vector4"], "sm_80", strategy="explicit")
    assert even.depthwise is None and even.tile is not None
    monkeypatch.setattr(switches, "DEPTHWISE_BY_DEFAULT", True)  # the switch is the depthwise form's alone (measured)
    assert decide(THIN["c3_k5_stride2_vector1"], "sm_80").depthwise is None


@pytest.mark.parametrize(
    "numbers",
    [
        {"vector": 4, "channels": 8, "taps": 7, "unroll": 8, "segment": 16},  # a whole 7-tap row a thread
        {"rows": 3, "chunks": 4},  # lanes that do not divide a chunk's rows, chunks that do not divide the rows
        {"segment": 4, "unroll": 4, "chunks": 1},  # many segments a row, one chunk
    ],
)
def test_depthwise_kernel_numbers_other_than_the_rule_s_match_float64(numbers):
    p = dw(16, 3, (9, 10), (7, 7), pad_low=3, pad_high=3)
    plan = decide(p, "sm_80", strategy="explicit")
    plan = replace(plan, depthwise=replace(plan.depthwise, **numbers))
    check_plan(p, plan)
    assert emulated_error(p, plan) < 2e-3


@pytest.mark.parametrize("name", ["7x7_pad3_ragged_chunks", "1d_long_segments", "1d_causal", "3d", "bf16"])
def test_steps_that_read_one_step_ahead_match_float64_under_emulation(monkeypatch, name):
    # the last step of a row reads its own vectors again (no step past the segment): nothing outside x or dy
    monkeypatch.setattr(depthwise, "PREFETCH", True)
    p = CASES[name]
    plan = decide(p, "sm_80", strategy="explicit")
    assert depthwise.kernel(p, plan.depthwise).prefetch
    assert emulated_error(p, plan) < {"bf16": 2.0**-8, "f32": 1e-4}.get(p.dw_dtype, 2e-3)


def test_the_stage_2_sums_many_ragged_chunks_in_its_lanes_and_matches_float64():
    # 150 chunks: two steps of 16 lanes x 8 loads, the second past the end; 72 outputs: a ragged last workgroup
    p = dw(8, 15, (10, 10), (3, 3), pad_low=1, pad_high=1, dw_dtype="f32")
    plan = decide(p, "sm_80", strategy="explicit")
    plan = replace(plan, depthwise=replace(plan.depthwise, rows=1, chunks=150))
    check_plan(p, plan)
    assert emulated_error(p, plan) < 1e-4


@pytest.mark.parametrize("name", ["3x3_pad", "3x3_stride2_vector4", "1d_causal", "f16_in_f32_out", "3d", "bf16"])
def test_inputs_converted_by_identity_mma_match_float64_under_emulation(monkeypatch, name):
    # the mma runs on every lane of a warp: 3 row lanes of 12 threads launch 64 threads, 28 of them owning no rows
    monkeypatch.setattr(depthwise, "MMA_CONVERT", ("f16", "bf16"))
    monkeypatch.setattr(depthwise, "MMA_MIN_STEPS", 0)  # these threads run a few steps
    p = CASES[name]
    plan = decide(p, "sm_80", strategy="explicit")
    plan = replace(plan, depthwise=replace(plan.depthwise, vector=4, rows=3, chunks=2))
    check_plan(p, plan)
    k = depthwise.kernel(p, plan.depthwise)
    assert k.mma_convert and k.launched % 32 == 0
    assert emulated_error(p, plan) < {"bf16": 2.0**-8, "f32": 1e-4}.get(p.dw_dtype, 2e-3)


def test_strategy_explicit_takes_the_depthwise_kernel_for_channels_last_depthwise_problems():
    p = CASES["3x3_pad"]
    plan = decide(p, "sm_80", strategy="explicit")
    assert plan.strategy == Strategy.EXPLICIT and plan.depthwise is not None and plan.tile is None
    assert Plan.from_dict(plan.to_dict()) == plan  # a tuner stores and replays it
    k = depthwise.kernel(p, plan.depthwise)
    assert k.threads <= 1024 and p.groups % plan.depthwise.channels == 0
    # layout 4 is not the depthwise kernel's: the implicit GEMM takes it as before
    assert decide(p.with_(layout=4), "sm_80", strategy="explicit").depthwise is None


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"k_batch": 4}, "k-batch: 4 does not apply to the depthwise kernel"),
        ({"tile_n": 128}, "tile-n: 128 does not apply to the depthwise kernel"),
    ],
)
def test_depthwise_plan_refuses_gemm_options_by_name(options, message):
    with pytest.raises(PlanError, match=message):
        decide(CASES["3x3_pad"], "sm_80", strategy="explicit", **options)


@pytest.mark.parametrize(
    ("problem", "numbers", "message"),
    [
        (CASES["3x3_pad"], {"channels": 12}, "depthwise.channels: 12"),
        (CASES["3x3_pad"], {"vector": 3}, "depthwise.vector: 3"),
        (CASES["3x3_pad"], {"segment": 6}, "depthwise.segment: 6"),
        (CASES["3x3_pad"], {"taps": 16, "vector": 8}, "depthwise.taps: 16 x 8 channels = 128 accumulators"),
        (P(4, 2, 32, 32, (6, 6), (3, 3), layout=2), {}, "in_channels: 32, out_channels: 32 a group"),
        (CASES["3x3_pad"].with_(layout=4), {}, "layout: NGCHW/GKCYX/NGKHW"),
    ],
)
def test_a_hand_written_depthwise_plan_is_refused_naming_the_field(problem, numbers, message):
    plan = decide(CASES["3x3_pad"], "sm_80", strategy="explicit")
    plan = replace(plan, depthwise=replace(plan.depthwise, **numbers))
    with pytest.raises(PlanError, match=message):
        check_plan(problem, plan)


def test_the_plan_chooses_the_depthwise_kernel_by_itself_exactly_when_its_switch_is_on(monkeypatch):
    p = CASES["3x3_pad"]
    monkeypatch.setattr(switches, "DEPTHWISE_BY_DEFAULT", True)
    assert decide(p, "sm_80").depthwise is not None
    assert decide(p, "sm_80", strategy="codegen").depthwise is None  # codegen asked: codegen
    assert decide(p, "host").depthwise is None  # NVIDIA only
    four = decide(p.with_(layout=4), "sm_80")  # layout 4: the same kernel between transposes (decisions.md#layout4)
    assert four.depthwise is not None and four.channels_last
    monkeypatch.setattr(switches, "DEPTHWISE_BY_DEFAULT", False)
    assert decide(p, "sm_80").strategy == Strategy.SIMT


@pytest.mark.parametrize("target", ["sm_80", "sm_86", "sm_89", "sm_90a"])
def test_every_depthwise_layer_of_the_suites_gets_a_plan_within_the_thread_limit(target):
    # RepLKNet's 31x31 asked 1984 threads a workgroup (124 a channel vector) before the rule capped the channels
    from convbw_mlir.suites import load_suite

    layers = [(n, p) for s in ("classes", "zoo") for n, p in load_suite(s) if depthwise.is_depthwise(p)]
    assert any(p.filter_size == (31, 31) for _, p in layers)
    for name, p in layers:
        plan = decide(p.with_(layout=2), target)
        assert plan.depthwise is not None, name
        assert depthwise.kernel(p.with_(layout=2), plan.depthwise).threads <= depthwise.MAX_THREADS, name


@pytest.mark.parametrize(("ck", "unroll"), [("2 96 32 1 1 7 7 56 56 1 1 1 1 3 3 3 3", 8),  # stride 1: 14 vectors
                                            ("2 240 32 1 1 3 3 29 29 2 2 1 1 0 0 0 0", 4),  # stride 2, 3 taps: 17
                                            ("2 72 32 1 1 5 5 56 56 2 2 1 1 2 2 2 2", 4),  # stride 2, 5 taps: 19
                                            ("1 256 16 1 1 31 500 1 1 15 15", 8)])  # fmt: skip
def test_a_wide_step_holds_at_most_max_window_x_vectors(ck, unroll):
    p = P.from_ck(ck, layout=2)
    dw = decide(p, "sm_90a").depthwise
    k = depthwise.kernel(p, dw)
    assert dw.unroll == unroll and len(k.offsets) <= depthwise.MAX_WINDOW


def test_the_mma_conversion_goes_only_to_threads_that_run_many_steps():
    long_rows = P.from_ck("2 96 32 1 1 7 7 56 56 1 1 1 1 3 3 3 3", layout=2)  # ConvNeXt-T: 49 steps a thread
    short = P.from_ck("2 240 32 1 1 5 5 28 28 1 1 1 1 2 2 2 2", layout=2)  # EfficientNet-B0: 20
    for p, mma in ((long_rows, True), (short, False)):
        k = depthwise.kernel(p, decide(p, "sm_90a").depthwise)
        steps = -(-k.chunk_rows // k.lanes_r) * (k.segment // k.unroll)
        assert k.mma_convert == mma and (steps >= depthwise.MMA_MIN_STEPS) == mma


def test_layers_whose_window_halves_the_step_aim_at_their_own_workgroups_an_sm(monkeypatch):
    strided = P.from_ck("2 72 32 1 1 5 5 56 56 2 2 1 1 2 2 2 2", layout=2)  # MobileNetV3: steps of 4
    plain = P.from_ck("2 144 32 1 1 3 3 56 56 1 1 1 1 1 1 1 1", layout=2)  # MobileNetV2: steps of 8
    before = {p: decide(p, "sm_90a").depthwise.chunks for p in (strided, plain)}
    monkeypatch.setattr(depthwise, "HALVED_WAVES", 1)  # (more would pass its rows: 112 chunks is all of them)
    assert decide(strided, "sm_90a").depthwise.chunks < before[strided]
    assert decide(plain, "sm_90a").depthwise.chunks == before[plain]
