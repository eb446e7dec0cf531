"""The split-reduction GEMV kernel (issue 40, items 3-4; convbw_mlir/kernels/gemv_sm80.py): its numerics under the
sm_80 emulator against float64 (C = 1, K = 1, odd channel counts, strides, dilations, pads, 1-D/2-D/3-D, ragged
chunks, lanes and tap runs, groups, f16 and bf16, dW f32 or the input type), the plan that takes it by default and
by name, and its refusals. The emulator indexes numpy arrays, so a read outside x or dy fails here too."""

from __future__ import annotations

from dataclasses import replace

import pytest
from sm80_emulator import module_error

from convbw_mlir import Epilogue
from convbw_mlir.plan import Plan, PlanError, Strategy, check_plan, decide
from convbw_mlir.policies import gemv, switches
from convbw_mlir.problem import ConvBwdWeightProblem as P


def emulated_error(p: P, plan: Plan) -> float:
    from convbw_mlir.passes.explicit_kernel import ExplicitKernel

    assert plan.gemv is not None
    check_plan(p, plan)
    return module_error(p, plan, [ExplicitKernel()], seed=3)


def lay2(g: int, n: int, c: int, k: int, size, filt, **kw) -> P:
    return P(g, n, c, k, size, filt, layout=2, **kw)


# name -> (problem, numbers that replace the rule's: ragged chunks, lanes and runs the rule would not pick)
CASES = {
    "1d_k1_c32_pad": (lay2(1, 2, 32, 1, (13,), (3,), pad_low=1, pad_high=1), {}),
    "1d_c1_k16_stride5_like_wav2vec": (lay2(1, 2, 1, 16, (43,), (10,), stride=5), {"chunks": 3}),
    "1d_c1_k16_unrolled_ragged": (lay2(1, 3, 1, 16, (83,), (10,), stride=5), {"chunks": 2, "lanes": 4, "unroll": 4}),
    "1d_c1_k1_dilated_ragged": (lay2(1, 3, 1, 1, (29,), (5,), dilation=2, pad_low=3, pad_high=2),
                                {"chunks": 4, "lanes": 8}),
    "2d_k8_c3_pad": (lay2(1, 1, 3, 8, (7, 6), (3, 3), pad_low=1, pad_high=1), {}),
    "2d_k5_c7_odd_stride2": (lay2(1, 2, 7, 5, (9, 8), (3, 2), stride=2, pad_low=(1, 0), pad_high=(0, 1)),
                             {"chunks": 5, "lanes": 4}),
    "2d_groups2_k4_c4_1x1": (lay2(2, 3, 4, 4, (5, 7), (1, 1)), {"chunks": 2}),
    "3d_k1_c16_runs_masked": (lay2(1, 1, 16, 1, (4, 5, 6), (3, 3, 3), stride=(1, 2, 1), pad_low=1, pad_high=1),
                              {"taps": 5, "chunks": 3, "unroll": 2}),
    "3d_k1_c16_one_chunk_writes_dw_f32": (lay2(1, 1, 16, 1, (4, 5, 6), (3, 3, 3), pad_low=1, pad_high=1,
                                               dw_dtype="f32"), {"chunks": 1, "unroll": 3}),
    "3d_k8_c3_interior_branch": (lay2(1, 2, 3, 8, (6, 5, 7), (3, 3, 3), pad_low=1, pad_high=(0, 1, 1)),
                                 {"chunks": 3, "unroll": 2, "interior": True}),
    "2d_k1_c8_interior_branch_lanes1": (lay2(2, 2, 8, 1, (9, 8), (3, 3), stride=2, pad_low=1, pad_high=1),
                                        {"chunks": 2, "lanes": 1, "interior": True}),
    "3d_k12_c3_bf16_f32_out": (lay2(1, 1, 3, 12, (4, 4, 5), (3, 3, 3), pad_low=1, pad_high=1, dtype="bf16",
                                    dw_dtype="f32"), {"chunks": 2}),
    "2d_k1_c1_bf16": (lay2(1, 2, 1, 1, (8, 9), (3, 3), pad_low=1, pad_high=1, dtype="bf16", dw_dtype="bf16"), {}),
}  # fmt: skip


@pytest.mark.parametrize("name", CASES)
def test_gemv_kernel_matches_float64_under_emulation(name):
    p, numbers = CASES[name]
    plan = decide(p, "sm_80", strategy="gemv")
    plan = replace(plan, gemv=replace(plan.gemv, **numbers))
    tolerance = {"bf16": 2.0**-8, "f32": 1e-4}.get(p.dw_dtype, 2e-3)
    assert emulated_error(p, plan) < tolerance


def test_ragged_cases_really_are_ragged():
    # each edge the masks guard is exercised above: a masked last step, a short last chunk, a run past the filter
    p, numbers = CASES["1d_c1_k1_dilated_ragged"]
    k = gemv.kernel(p, replace(decide(p, "sm_80", strategy="gemv").gemv, **numbers))
    assert k.chunk_positions * k.chunks != k.positions and k.steps * k.lanes != k.chunk_positions
    p, numbers = CASES["3d_k1_c16_runs_masked"]
    k = gemv.kernel(p, replace(decide(p, "sm_80", strategy="gemv").gemv, **numbers))
    assert k.runs * k.taps != k.filter_taps
    p, numbers = CASES["1d_c1_k16_unrolled_ragged"]
    k = gemv.kernel(p, replace(decide(p, "sm_80", strategy="gemv").gemv, **numbers))
    assert k.loop_steps * k.unroll != k.steps and not k.direct
    directs = [n for n, (p, nums) in CASES.items() if gemv.kernel(p, replace(decide(p, "sm_80", strategy="gemv").gemv,
                                                                             **nums)).direct]  # fmt: skip
    assert len(directs) >= 3  # one chunk writes dW itself: f16, bf16 and f32 dW among them


# The problems: codegen's SIMT plan before; the GEMV kernel now (sm_90a and sm_80 alike). CK's 2-D K = 1
# case (1024 positions, 8 steps a lane) is the shortest reduction the H100 final round measured faster (4.95x).
DEFAULT = {
    "wav2vec2_conv0": "1 1 8 512 1 10 16000 5 1 0 0",
    "ck2d_g_k1_c32_8_steps": "2 1 1 1 32 3 3 32 32 1 1 1 1 1 1 1 1",
    "ck3d_k1_c32_32cubed": "3 1 1 1 32 3 3 3 32 32 32 1 1 1 1 1 1 1 1 1 1 1 1",
}
# 32 positions (SE blocks' 1x1s on 1x1 maps at batch 32, CK's 1-D cases): the rule's lanes walk 1-4 positions; the
# plan the rule replaced (codegen's SIMT) measured 1.7-5x faster on the H100 (bench/results/h100_2026-12-06_gemv_final/;
# CK's 1-D K = 1 case 0.96x, a tie).
SHORT = {
    "se_fc2_c8_k48": "2 1 32 48 8 1 1 1 1 1 1 1 1 0 0 0 0",
    "se_fc1_c96_k4": "2 1 32 4 96 1 1 1 1 1 1 1 1 0 0 0 0",
    "se_fc2_c8_k16": "2 1 32 16 8 1 1 1 1 1 1 1 1 0 0 0 0",
    "ck1d_d_k1_c32": "1 1 1 1 32 3 32 1 1 1 1",
    "ck1d_e_k64_c3": "1 1 1 64 3 3 32 1 1 1 1",
}


@pytest.mark.parametrize("name", DEFAULT)
def test_plan_takes_gemv_kernel_where_codegen_had_no_matrix_core_tile(name, monkeypatch):
    p = P.from_ck(DEFAULT[name])
    plan = decide(p, "sm_90a")
    assert plan.gemv is not None and plan.decision.rule == "gemv-by-default" and plan.deterministic
    partials = plan.gemv.chunks * p.groups * p.out_channels * p.in_channels * 4 * gemv.kernel(p, plan.gemv).filter_taps
    assert plan.workspace_bytes == (partials if plan.gemv.chunks > 1 else 0)  # one chunk writes dW itself
    monkeypatch.setattr(switches, "GEMV_BY_DEFAULT", False)
    assert decide(p, "sm_90a").strategy == Strategy.SIMT  # the switch off: codegen's plan, as before


@pytest.mark.parametrize("name", SHORT)
@pytest.mark.parametrize("target", ["sm_90a", "sm_80"])
def test_plan_keeps_codegens_simt_where_the_lanes_would_walk_fewer_than_min_steps(name, target):
    p = P.from_ck(SHORT[name])
    asked = decide(p, target, strategy="gemv")  # the kernel still computes it when asked for
    assert gemv.kernel(p, asked.gemv).steps < gemv.MIN_STEPS
    plan = decide(p, target)
    assert plan.gemv is None and plan.strategy == Strategy.SIMT and plan.decision.rule != "gemv-by-default"


@pytest.mark.parametrize("name", DEFAULT)
def test_default_problems_give_each_lane_at_least_min_steps(name):
    p = P.from_ck(DEFAULT[name])
    assert gemv.kernel(p, decide(p, "sm_90a").gemv).steps >= gemv.MIN_STEPS


def test_layout4_problem_takes_the_gemv_kernel_in_layout2_between_transposes():
    from convbw_mlir.passes.explicit_kernel import ExplicitKernel
    from convbw_mlir.passes.relayout import Relayout

    p = P(2, 4, 8, 128, (22, 18), (1, 1), stride=2, pad_high=1, layout=4)  # the fuzz's explicit0091 shape
    plan = decide(p, "sm_80")
    assert plan.gemv is not None and plan.channels_last and plan.decision.then.rule == "gemv-by-default"
    assert module_error(p, plan, [Relayout(), ExplicitKernel()], seed=5) < 2e-3


def test_plan_keeps_matrix_core_kernels_and_the_depthwise_kernel():
    assert decide(P.from_ck("2 1 32 64 3 7 7 224 224 2 2 1 1 3 3 3 3"), "sm_90a").gemv is None  # first layer
    assert decide(P.from_ck("2 16 16 1 1 3 3 28 28 2 2 1 1 1 1 1 1"), "sm_90a").depthwise is not None
    assert decide(P.from_ck("1 1 8 512 1 10 16000 5 1 0 0"), "host").gemv is None


def test_rule_fills_the_gpu_and_keeps_the_workspace_small():
    p = P.from_ck("1 1 8 512 1 10 16000 5 1 0 0")
    k = gemv.kernel(p, decide(p, "sm_90a").gemv)
    assert k.chunks >= 132 and k.threads <= gemv.THREADS and k.accumulators <= gemv.MAX_ACCUMULATORS
    assert k.steps >= gemv.MIN_STEPS
    tiny = P.from_ck("1 1 1 1 32 3 32 1 1 1 1")  # 32 positions, asked for: one chunk, not 264 empty ones
    assert gemv.kernel(tiny, decide(tiny, "sm_90a", strategy="gemv").gemv).chunks == 1


REFUSED = {
    "layout": (lay2(1, 2, 1, 16, (20,), (3,)).with_(layout=4), "layout: "),
    "dtype": (lay2(1, 2, 1, 16, (20,), (3,), dtype="f32"), "dtype: f32"),
    "epilogue": (lay2(1, 2, 1, 16, (20,), (3,), epilogue=Epilogue("scale", alpha=2.0)), "epilogue: scale"),
}


@pytest.mark.parametrize("name", REFUSED)
def test_gemv_asked_for_a_problem_it_cannot_compute_is_refused_by_name(name):
    p, words = REFUSED[name]
    with pytest.raises(PlanError, match=words):
        decide(p, "sm_80", strategy="gemv")


def test_gemv_refuses_options_targets_and_numbers_by_name():
    p = lay2(1, 2, 1, 16, (20,), (3,))
    with pytest.raises(PlanError, match="tile-m: 64 does not apply to the GEMV kernel"):
        decide(p, "sm_80", strategy="gemv", tile_m=64)
    with pytest.raises(PlanError, match="k-batch: 4 does not apply"):
        decide(p, "sm_80", strategy="gemv", k_batch=4)
    with pytest.raises(PlanError, match="gemv is written for NVIDIA targets, not gfx942"):
        decide(p, "gfx942", strategy="gemv")
    plan = decide(p, "sm_80", strategy="gemv")
    for numbers, words in (({"k_block": 3}, "gemv.k_block: 3"), ({"c_block": 2}, "gemv.c_block: 2"),
                           ({"taps": 3, "k_block": 16}, "gemv.k_block: 16"), ({"chunks": 10**6}, "gemv.chunks"),
                           ({"lanes": 1024}, "threads a workgroup"),
                           ({"lanes": 6}, "gemv.lanes: 6 \\(a power of 2")):  # fmt: skip
        with pytest.raises(PlanError, match=words):
            check_plan(p, replace(plan, gemv=replace(plan.gemv, **numbers)))
    with pytest.raises(PlanError, match="split: "):
        from convbw_mlir.loops import Split

        check_plan(p, replace(plan, split=Split("n", 2, 1)))


def test_gemv_plan_round_trips_through_plain_data():
    plan = decide(P.from_ck("1 1 8 512 1 10 16000 5 1 0 0"), "sm_90a")
    assert Plan.from_dict(plan.to_dict()) == plan
    with pytest.raises(PlanError, match="plan.gemv.lanes: expected an integer >= 1"):
        Plan.from_dict({**plan.to_dict(), "gemv": {**plan.to_dict()["gemv"], "lanes": 0}})
