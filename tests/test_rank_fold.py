"""A 3-D problem with a unit filter extent is a 2-D one by reshapes alone (issue 40 item 4,
docs/decisions.md#rank-fold): 1 x kh x kw (depth stride 1, no depth padding) puts the depth into the batch,
kd x 1 x 1 (H and W unstrided, unpadded) makes H and W one axis. The plan decides the 2-D twin's plan where asked
(``fold_rank=True``, refused by name elsewhere) or by its switch (off); ``convbw-relayout`` reshapes
(lit/passes/relayout_fold.mlir shows the IR). Numerics on the host through IREE, and under the sm_80 and sm_90a
emulators, against float64."""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest
from sm80_emulator import module_error

from convbw_mlir.plan import Plan, PlanError, check_plan, decide, folded_twin
from convbw_mlir.policies import sm90, switches
from convbw_mlir.problem import ConvBwdWeightProblem as P
from convbw_mlir.problem import Epilogue, fold_rank
from convbw_mlir.reference import assert_close, random_inputs, reference

# R(2+1)D's spatial and temporal convs (small), odd sizes, groups and strides
DEPTH = P(2, 3, 5, 7, (4, 7, 9), (1, 3, 3), stride=(1, 2, 1), pad_low=(0, 1, 1), pad_high=(0, 1, 0))
PLANE = P(2, 3, 5, 7, (7, 5, 3), (3, 1, 1), stride=(2, 1, 1), dilation=(2, 1, 1), pad_low=(1, 0, 0), pad_high=(2, 0, 0))

CHANNELS_LAST = P(1, 2, 4, 6, (3, 5, 5), (1, 3, 3), pad_low=(0, 1, 1), pad_high=(0, 1, 1), layout="channels_last",
                  epilogue=Epilogue("bilinear", alpha=0.5, beta=2.0))  # fmt: skip


def test_depth_fold_puts_the_depth_into_the_batch_with_the_same_bytes():
    twin, how = fold_rank(DEPTH)
    assert how == "depth" and twin.rank == 2 and twin.batch == 3 * 4
    assert (twin.input_size, twin.filter_size, twin.stride, twin.pad_low, twin.pad_high) == (
        (7, 9), (3, 3), (2, 1), (1, 1), (1, 0))  # fmt: skip
    for t in ("x", "dy", "dw"):
        assert np.prod(twin.shape(t)) == np.prod(DEPTH.shape(t)), t
    assert twin.dw_shape == (2, 7, 3, 3, 5) and twin.dy_shape == (12, *DEPTH.dy_shape[2:])


def test_plane_fold_makes_h_and_w_one_axis_with_the_same_bytes():
    twin, how = fold_rank(PLANE)
    assert how == "plane" and twin.rank == 2 and twin.batch == 3
    assert (twin.input_size, twin.filter_size, twin.stride, twin.dilation, twin.pad_low, twin.pad_high) == (
        (7, 15), (3, 1), (2, 1), (2, 1), (1, 0), (2, 0))  # fmt: skip
    assert twin.output_size == (PLANE.output_size[0], 15) and twin.dw_shape == (2, 7, 3, 1, 5)


@pytest.mark.parametrize(
    ("problem", "why"),
    [
        (P(1, 2, 8, 8, (4, 6, 6), (3, 3, 3)), "filter 3x3x3"),
        (P(1, 2, 8, 8, (4, 6, 6), (1, 3, 3), stride=(2, 1, 1)), "stride 2x1x1"),
        (P(1, 2, 8, 8, (4, 6, 6), (1, 3, 3), pad_low=(1, 0, 0)), "padding 1x0x0/0x0x0"),
        (P(1, 2, 8, 8, (4, 6, 6), (3, 1, 1), stride=(1, 2, 1)), "stride 1x2x1"),
        (P(1, 2, 8, 8, (4, 6, 6), (3, 1, 1), pad_high=(0, 0, 1)), "padding 0x0x0/0x0x1"),
        (P(1, 2, 8, 8, (4, 6, 6), (3, 3, 1)), "filter 3x3x1"),
        (P(1, 2, 8, 8, (4, 6, 6), (1, 1, 1)), "filter 1x1x1 (a GEMM already)"),
        (P(1, 2, 8, 8, (6, 6), (1, 3)), "rank 2"),
        (P(1, 2, 8, 8, (4, 6, 6), (1, 3, 3), layout=4), "layout NGCHW/GKCYX/NGKHW"),
    ],
    ids=["3x3x3", "depth_stride", "depth_pad", "plane_stride", "plane_pad", "3x3x1", "1x1x1", "2d", "layout4"],
)
def test_fold_is_refused_with_the_reason_where_it_does_not_apply(problem, why):
    twin, reason = fold_rank(problem)
    assert twin is None and why in reason
    with pytest.raises(PlanError, match=f"fold-rank: true for {problem.name}: .*{why.split(' (')[0]}"):
        decide(problem, "sm_90a", fold_rank=True)
    assert not decide(problem, "sm_90a", fold_rank=False).fold_rank


def test_fold_rank_option_refuses_a_non_boolean_and_an_op_that_arrives_split():
    with pytest.raises(PlanError, match="fold-rank: expected true or false, got 'yes'"):
        decide(DEPTH, "sm_80", fold_rank="yes")
    from convbw_mlir.loops import Split

    with pytest.raises(PlanError, match="fold-rank: true for .*split 2"):
        decide(DEPTH, "sm_80", split=Split("n", 2, 1), fold_rank=True)


@pytest.mark.parametrize("target", ["sm_90a", "sm_80", "host"])
@pytest.mark.parametrize("problem", [DEPTH, PLANE], ids=["depth", "plane"])
def test_folded_plan_is_the_twins_plan_and_workspace(problem, target):
    plan = decide(problem, target, fold_rank=True)
    twin = decide(folded_twin(problem)[0], target)
    assert plan.fold_rank and replace(plan, fold_rank=False) == twin
    assert plan.workspace_bytes == twin.workspace_bytes
    assert plan.decision.rule == "fold-rank" and plan.decision.then.rule == twin.decision.rule
    assert Plan.from_dict(plan.to_dict()) == plan and plan.to_dict()["fold_rank"] is True
    with pytest.raises(PlanError, match="plan.fold_rank: expected true or false"):
        Plan.from_dict({**plan.to_dict(), "fold_rank": 1})


def test_a_folding_plan_is_refused_for_a_problem_the_fold_does_not_take():
    plan = decide(DEPTH, "sm_80", fold_rank=True)
    with pytest.raises(PlanError, match="plan.fold_rank: filter 3x3x3"):
        check_plan(DEPTH.with_(filter_size=3, pad_low=1, pad_high=1), plan)


def test_fold_is_off_by_default_and_its_switch_folds_3d_problems_on_nvidia_only(monkeypatch):
    assert switches.FOLD_RANK_BY_DEFAULT is False
    assert not decide(DEPTH, "sm_90a").fold_rank and not decide(PLANE, "sm_80").fold_rank
    monkeypatch.setattr(switches, "FOLD_RANK_BY_DEFAULT", True)
    assert decide(DEPTH, "sm_90a").fold_rank and decide(PLANE, "sm_80", strategy="explicit").fold_rank
    assert not decide(DEPTH, "host").fold_rank and not decide(DEPTH, "sm_90a", fold_rank=False).fold_rank
    assert not decide(DEPTH.with_(filter_size=3, pad_low=1, pad_high=1), "sm_90a").fold_rank


def test_tuner_offers_the_folded_plan_next_to_a_3d_problems_on_nvidia():
    from convbw_mlir.dispatch.variants import candidates

    p = P(1, 8, 64, 64, (8, 28, 28), (1, 3, 3), pad_low=(0, 1, 1), pad_high=(0, 1, 1))
    found = candidates(p, "sm_90a", iree=False)
    assert not found[0].plan.fold_rank and found[1].plan.fold_rank and dict(found[1].options) == {"fold_rank": True}
    assert not any(v.plan.fold_rank for v in candidates(p.with_(filter_size=3, pad_low=1, pad_high=1), "sm_90a",
                                                        iree=False))  # fmt: skip


@pytest.mark.parametrize(
    "problem",
    [DEPTH, PLANE, CHANNELS_LAST, DEPTH.with_(layout=1)],
    ids=["depth", "plane", "channels_last_bilinear", "layout1_transposed_then_folded"],
)
def test_folded_problem_matches_float64_on_the_host(problem, compiled):
    from convbw_mlir.epilogues import random_d

    op = compiled(problem, "host", fold_rank=True)
    assert op.plan.fold_rank
    x, dy = random_inputs(problem, seed=1)
    d = random_d(problem, seed=2)
    got = np.asarray(op.run(x, dy) if d is None else op.run(x, dy, d))
    assert got.shape == problem.dw_shape
    assert_close(problem, got, reference(problem, x, dy, d))


@pytest.mark.parametrize(
    ("problem", "options"),
    [
        (P(2, 2, 8, 16, (3, 5, 7), (1, 3, 3), stride=(1, 2, 1), pad_low=(0, 1, 1), pad_high=(0, 1, 0)), {}),
        (P(2, 2, 8, 16, (7, 3, 5), (3, 1, 1), stride=(2, 1, 1), pad_low=(1, 0, 0), pad_high=(1, 0, 0)), {"k_batch": 2}),
    ],
    ids=["depth_strided", "plane_strided_split2"],
)
def test_folded_problem_on_sm80_matches_float64_under_emulation(problem, options):
    from convbw_mlir.passes.explicit_kernel import ExplicitKernel
    from convbw_mlir.passes.relayout import Relayout

    plan = decide(problem, "sm_80", strategy="explicit", fold_rank=True, **options)
    assert plan.fold_rank and plan.k_batch == options.get("k_batch", plan.k_batch)
    assert module_error(problem, plan, [Relayout(), ExplicitKernel()], seed=3) < 2e-3


@pytest.mark.parametrize(
    "problem",
    [
        P(2, 2, 64, 64, (3, 5, 7), (1, 3, 3), stride=(1, 2, 1), pad_low=(0, 1, 1), pad_high=(0, 1, 1), dw_dtype="f32"),
        P(1, 2, 64, 64, (5, 3, 5), (3, 1, 1), stride=(2, 1, 1), pad_low=(1, 0, 0), pad_high=(1, 0, 0), dw_dtype="f32"),
    ],
    ids=["depth", "plane"],
)
def test_folded_problem_on_sm90a_is_the_twins_wgmma_kernel_under_emulation(problem):
    from convbw_mlir.dialects import convbw
    from convbw_mlir.passes.explicit_kernel import ExplicitKernel
    from convbw_mlir.passes.relayout import Relayout
    from sm90_emulator import run_conv

    from convbw_mlir.ir_imports import new_context
    from convbw_mlir.kernels.conv_sm90 import from_problem
    from convbw_mlir.kernels.gemm_sm90 import Sm90Tiling

    plan, twin = decide(problem, "sm_90a", fold_rank=True), folded_twin(problem)[0]
    assert sm90.is_sm90(plan) and plan.fold_rank
    t = plan.tile
    g = from_problem(twin, Sm90Tiling(bn=t.n, consumers=t.subgroups_m, stages=t.stages), plan.k_batch)
    x, dy = random_inputs(problem, seed=1)  # the kernel's bindings are the twin's: the same bytes
    with new_context():
        module = convbw.build_module(problem, plan)
        Relayout().run(module.operation)
        ExplicitKernel().run(module.operation)
        partials = run_conv(module, dy.reshape(g.reduction, -1), x.reshape(*twin.x_shape[:-2], -1), g)
    want = reference(problem, x, dy)
    got = (partials if g.splits == 1 else partials.sum(0)).reshape(want.shape)
    assert not np.isnan(got).any() and np.abs(got - want).max() / np.abs(want).max() < 1e-6


def test_convbw_select_names_the_fold_where_the_switch_folds(monkeypatch, tmp_path, capsys):
    from convbw_mlir.cli import main

    monkeypatch.setenv("CONVBW_CACHE_DIR", str(tmp_path))
    line = "3 1 8 144 64 1 3 3 16 56 56 1 1 1 1 1 1 0 1 1 0 1 1"  # the classes suite's R(2+1)D spatial conv
    assert main(["select", "--ck", line, "--target", "sm_90a"]) == 0
    assert "fold" not in capsys.readouterr().out
    monkeypatch.setattr(switches, "FOLD_RANK_BY_DEFAULT", True)
    assert main(["select", "--ck", line, "--target", "sm_90a"]) == 0
    out = capsys.readouterr().out
    # the rule, after the chooser where one chose (sm_90a's shipped learned selector: "rule: learned -> fold-rank")
    assert '"fold_rank": true' in out and re.search(r"rule: ([a-z]+ -> )?fold-rank", out)
    assert "docs/decisions.md#rank-fold" in out


def test_folded_sm90a_kernels_launch_maps_are_the_twins_2d_maps():
    from convbw_mlir import compile_op

    p = P(1, 2, 64, 64, (3, 6, 6), (1, 3, 3), pad_low=(0, 1, 1), pad_high=(0, 1, 1))
    op = compile_op(p, "sm_90a", fold_rank=True, output_arg=True)  # the direct launch encodes these maps
    twin = folded_twin(p)[0]
    assert op.plan.fold_rank and sm90.is_sm90(op.plan)
    got = [(m.mode, list(m.dims), list(m.strides), list(m.lower)) for m in op.launch.tensor_maps]
    want = [(m["mode"], m["dims"], m["strides"], list(m.get("lower", []))) for m in sm90.tensor_maps(twin, "k")]
    assert got == want and got[1][1] == [64, 6, 6, 6]  # were the 3-D problem's 5-D im2col map on a 2-D kernel
