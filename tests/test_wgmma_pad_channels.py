"""The sm_90a wgmma kernel on in-channels C a multiple of 8 but not of 64 (issue 39 goal 2, ``wgmma-pad-channels``):
each tap's channels padded to whole 64-channel boxes. The plan option and its refusals, the kernel's dW under the
sm_90a emulator (float64's, and no garbage past a group's C leaking into it), the tuner's grid, ``select`` (whose
learned selector never saw the form: offered no padded plan but the rule's), and the plan's rule padded-channels."""

from __future__ import annotations

import numpy as np
import pytest

from convbw_mlir.plan import PlanError, check_plan, decide
from convbw_mlir.policies import sm90
from convbw_mlir.problem import ConvBwdWeightProblem

XCEPTION_PW = "2 1 32 728 728 1 1 19 19 1 1 1 1 0 0 0 0"  # Xception block5's pointwise: C = 728 = 11.4 boxes


def _problem(line: str, **fields) -> ConvBwdWeightProblem:
    return ConvBwdWeightProblem.from_ck(line).with_(**{"layout": 2, **fields})


def _padded(**asked):
    return {"strategy": "explicit", "wgmma_pad_channels": True, **asked}


# -- the option ----------------------------------------------------------------------------------------------
def test_pad_channels_gives_the_wgmma_kernel_where_the_default_plan_keeps_the_sm80_kernel(monkeypatch):
    from convbw_mlir.policies import switches

    monkeypatch.setattr(switches, "WGMMA_PAD_BY_DEFAULT", False)  # the rule off: the sm_80 kernel's
    p = _problem(XCEPTION_PW)
    default = decide(p, "sm_90a")
    assert not sm90.is_sm90(default)
    for asked in ({}, {"k_batch": 2}, {"tile_n": 64}, {"k_batch": 4, "tile_n": 128}, {"wgmma_rows": 64}):
        plan = decide(p, "sm_90a", **_padded(**asked))
        assert sm90.is_sm90(plan) and plan.streamk is None and plan.merge is None, plan
        assert plan.k_batch == asked.get("k_batch", plan.k_batch) and plan.tile.n == asked.get("tile_n", plan.tile.n)
        assert plan.tile.m == asked.get("wgmma_rows", 128)
        check_plan(p, plan)  # a stored plan of it replays
        assert ("wgmma_pad_channels", True) in plan.decision.options


@pytest.mark.parametrize(
    ("line", "asked", "error"),
    [
        (XCEPTION_PW, {"wgmma_pad_channels": True}, "wgmma-pad-channels: true applies to strategy explicit only"),
        (XCEPTION_PW, {"strategy": "explicit", "wgmma_pad_channels": 1}, "wgmma-pad-channels: expected true or false"),
        (XCEPTION_PW, _padded(streamk="auto"), "wgmma-pad-channels: true with streamk 'auto'"),
        (XCEPTION_PW, _padded(tile_m=64), "wgmma-pad-channels: true with tile-m 64"),
        (XCEPTION_PW, _padded(producers=2), "wgmma-pad-channels: true with producers 2"),
        ("2 1 32 512 256 1 1 7 7 1 1 1 1 0 0 0 0", _padded(), "wgmma-pad-channels: true with in_channels 256 .a "
         "multiple of 64"),
        ("2 1 32 512 921 1 1 7 7 1 1 1 1 0 0 0 0", _padded(), "wgmma-pad-channels: true on a problem the wgmma "
         "kernel does not take: in_channels: 921 .a group's: a multiple of 8"),
        ("2 8 32 64 16 3 3 14 14 1 1 1 1 1 1 1 1", _padded(wgmma_merge=4), "wgmma-merge: 4 with wgmma-pad-channels"),
    ],
)  # fmt: skip
def test_pad_channels_is_one_error_naming_it_where_the_kernel_cannot_take_it(line, asked, error):
    with pytest.raises(PlanError, match=error):
        decide(_problem(line), "sm_90a", **asked)


def test_pad_channels_is_refused_on_the_sm80_kernels_targets_and_for_fp8():
    with pytest.raises(PlanError, match=r"wgmma-pad-channels: true on target sm_80 \(the wgmma kernel is written"):
        decide(_problem(XCEPTION_PW), "sm_80", **_padded())
    fp8 = _problem(XCEPTION_PW, dtype="e4m3", dw_dtype="f32")
    with pytest.raises(PlanError, match="wgmma-pad-channels: true .the fp8 GEMM takes k-batch and tile-n only"):
        decide(fp8, "sm_90a", **_padded())


def test_a_stored_streamk_plan_on_padded_channels_is_refused_by_name():
    p = _problem(XCEPTION_PW)
    plan = decide(p, "sm_90a", **_padded())
    from dataclasses import replace

    from convbw_mlir.plan_data import StreamKPlan

    with pytest.raises(PlanError, match="streamk: with in_channels 728"):
        check_plan(p, replace(plan, streamk=StreamKPlan(4, "linear")))


# -- the kernel, emulated --------------------------------------------------------------------------------------
def _dw_of_plan(p: ConvBwdWeightProblem, plan, x: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """dW ``[G, K, Y X C]`` of ``plan``'s sm_90a conv kernel as the pass builds it, under the emulator (split
    partials summed; an element never written stays NaN)."""
    from convbw_mlir.dialects import convbw
    from convbw_mlir.passes.explicit_kernel import ExplicitKernel
    from sm90_emulator import run_conv

    from convbw_mlir.ir_imports import new_context
    from convbw_mlir.kernels.conv_sm90 import from_problem
    from convbw_mlir.kernels.gemm_sm90 import Sm90Tiling

    t = plan.tile
    g = from_problem(p, Sm90Tiling(bn=t.n, consumers=t.subgroups_m, stages=t.stages), plan.k_batch, 0, 0)
    assert g.padded and g.gemm_columns == g.cp * np.prod(g.filter)
    with new_context():
        module = convbw.build_module(p, plan)
        ExplicitKernel().run(module.operation)
        out = run_conv(module, dy.reshape(g.reduction, -1), x.reshape(*x.shape[:-2], -1), g)
    return out.sum(0) if out.ndim == 4 else out


def _relative_error(p: ConvBwdWeightProblem, plan, seed: int = 3) -> float:
    from convbw_mlir.reference import random_inputs, reference

    x, dy = random_inputs(p, seed=seed)
    want = reference(p, x, dy)
    got = _dw_of_plan(p, plan, x, dy)
    assert not np.isnan(got).any()  # every dW element written
    got = got.reshape(want.shape)
    return float(np.abs(got - want).max() / np.abs(want).max())


@pytest.mark.parametrize("k_batch", [1, 2])
@pytest.mark.parametrize(
    ("c", "filt", "tile_n"),
    [(72, (1, 1), 128), (160, (1, 1), 128), (200, (1, 1), 64), (728, (1, 1), 256), (96, (3, 3), 128)],
)  # 1.1, 2.5, 3.1 and 11.4 boxes a tap (one bn of each, tiles across taps for the 3x3)
def test_padded_plan_computes_float64s_dw_under_emulation(c, filt, tile_n, k_batch):
    pad = tuple(f // 2 for f in filt)
    p = ConvBwdWeightProblem(1, 4, c, 64, (8, 8), filt, pad_low=pad, pad_high=pad, dtype="f16", dw_dtype="f32",
                             layout=2)  # fmt: skip
    plan = decide(p, "sm_90a", **_padded(k_batch=k_batch, tile_n=tile_n))
    assert sm90.is_sm90(plan) and plan.k_batch == k_batch
    assert _relative_error(p, plan) < 1e-6


def test_garbage_past_a_groups_channels_never_reaches_its_dw():
    """Group 0's last box reads group 1's channels (x has G C channels a pixel, no padding between groups): NaN
    there computes only GEMM columns the epilogue drops, so group 0's dW is exact and finite."""
    from convbw_mlir.reference import random_inputs, reference

    p = ConvBwdWeightProblem(2, 4, 72, 64, (8, 8), (1, 1), dtype="f16", dw_dtype="f32", layout=2)
    plan = decide(p, "sm_90a", **_padded(k_batch=2))
    x, dy = random_inputs(p, seed=5)
    want = reference(p, x, dy)
    poisoned = x.copy()
    poisoned[..., 1, :] = np.nan  # x [N, H, W, G, C]: group 1's channels, past group 0's C
    got = _dw_of_plan(p, plan, poisoned, dy).reshape(want.shape)
    assert np.isnan(got[1]).all()  # group 1 reads its own NaNs: the poison does arrive
    assert not np.isnan(got[0]).any()
    assert np.abs(got[0] - want[0]).max() / np.abs(want[0]).max() < 1e-6


# -- the tuner and select -----------------------------------------------------------------------------------
def _padded_options(vs) -> list[int | None]:
    return [dict(v.options).get("k_batch") for v in vs if dict(v.options).get("wgmma_pad_channels")]


def test_tuner_tries_the_padded_kernel_on_dense_layers_the_sm80_kernel_has_only_because_of_c(monkeypatch):
    from convbw_mlir.dispatch.variants import candidates
    from convbw_mlir.policies import switches

    monkeypatch.setattr(switches, "WGMMA_PAD_BY_DEFAULT", False)  # the rule off: the plan is the sm_80 kernel's

    for line in (XCEPTION_PW, "2 1 32 128 1760 1 1 7 7 1 1 1 1 0 0 0 0", "2 1 32 64 200 3 3 14 14 1 1 1 1 1 1 1 1"):
        p = _problem(line)
        base, *rivals = candidates(p, "sm_90a", max_plans=12, iree=False)
        assert not sm90.is_sm90(base.plan) and base.plan.strategy.value == "explicit"
        # the padded plan's own split, unsplit and the sm_80 plan's split (one variant where two are the same plan)
        assert _padded_options(rivals)[:2] == [None, 1] and {1, base.plan.k_batch} <= {
            v.plan.k_batch for v in rivals if dict(v.options).get("wgmma_pad_channels")
        }
        assert all(sm90.is_sm90(v.plan) for v in rivals if dict(v.options).get("wgmma_pad_channels"))
        every = candidates(p, "sm_90a", max_plans=64, iree=False)
        without = candidates(p, "sm_90a", max_plans=64, iree=False, wgmma_rows=False)  # what select offers
        assert without == [v for v in every if not dict(v.options).get("wgmma_pad_channels")]
    for line in (
        "2 1 32 128 921 1 1 7 7 1 1 1 1 0 0 0 0",  # C odd: refused
        "2 1 32 512 512 1 1 7 7 1 1 1 1 0 0 0 0",  # C % 64 == 0: the plain wgmma kernel's
        "2 2 32 64 72 1 1 7 7 1 1 1 1 0 0 0 0",  # G > 1: not a dense layer
    ):
        assert not _padded_options(candidates(_problem(line), "sm_90a", max_plans=64, iree=False)), line


def test_select_offers_and_chooses_on_both_held_back_sets_as_without_the_padded_kernel(monkeypatch):
    """The installed selector's trees never saw the padded wgmma kernel: what select offers it (and so its choice)
    on every held-back row is what it was before the form joined the grid."""
    from pathlib import Path

    from convbw_mlir.dispatch import variants
    from convbw_mlir.dispatch.select import learned_selector, select
    from convbw_mlir.suites import load_suite

    heldback = Path(__file__).resolve().parents[1] / "bench" / "heldback"
    rows = [
        p.with_(layout=2) for tsv in ("dense2d.tsv", "dense2d_b.tsv") for t in ("bf16", "f16")
        for _, p in load_suite(heldback / tsv, t)
    ]  # fmt: skip
    selector = learned_selector("sm_90a")
    assert selector is not None
    offered: list = []
    choose = selector.choose

    def recording(problem, options):
        offered.append([(v.name, v.plan) for v in options])
        return choose(problem, options)

    monkeypatch.setattr(selector, "choose", recording)

    def run() -> list:
        offered.clear()
        chosen = [select(p, "sm_90a", dbs=[], selector=selector) for p in rows]
        return [(s.path, s.variant.name, s.variant.plan) for s in chosen] + list(offered)

    now = run()
    # the form is in the tuner's candidates of some of these rows (the default max_plans select asks for)
    assert sum(bool(_padded_options(variants.candidates(p, "sm_90a", iree=False))) for p in rows) >= 4
    monkeypatch.setattr(variants, "_padded", lambda problem, base: iter(()))  # the grid before the form
    before = run()
    assert len(now) == 2 * len(rows) and now == before


# -- the rule (policies/sm90.py PADDED_CHANNELS: pack wgmmapad, bench/padrule.py) ------------------------------
DENSENET121_L16 = "2 1 32 128 992 1 1 7 7 1 1 1 1 0 0 0 0"  # 1,568 rows: 25 k tiles


@pytest.mark.parametrize(("line", "k_batch"), [(XCEPTION_PW, 3), (DENSENET121_L16, 4)])
def test_the_plan_gives_dense_layers_of_c_a_multiple_of_8_to_the_padded_kernel_by_its_rule(line, k_batch):
    p = _problem(line)
    plan = decide(p, "sm_90a")
    assert sm90.is_sm90(plan) and plan.merge is None and plan.streamk is None and plan.tile.m == 128
    assert plan.k_batch == k_batch  # slices of 6-7 k tiles on 25 (PADDED_MIN_SLICE), where 8 gave 3 splits
    assert plan.decision.rule == "explicit-by-default" and "by padded-channels:" in plan.decision.detail
    reason = sm90.PADDED_CHANNELS.reason  # the why a user reads names the rule's numbers, not the constants' names
    assert f"at least {sm90.PADDED_MIN_SLICE} k tiles" in reason and f"at most {sm90.PADDED_MAX_WASTE} " in reason
    assert not plan.decision.options and check_plan(p, plan) is None
    assert decide(p, "sm_90a", **_padded()) == plan  # the option asks for the same plan


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("2 1 32 512 100 1 1 7 7 1 1 1 1 0 0 0 0", "C % 8 != 0: the kernel does not take it"),
        ("2 1 32 512 32 1 1 7 7 1 1 1 1 0 0 0 0", "C 32 -> 64: twice the columns, past PADDED_MAX_WASTE"),
        ("2 1 32 512 136 1 1 7 7 1 1 1 1 0 0 0 0", "C 136 -> 192: 1.41x the columns"),
        ("2 2 32 256 200 1 1 7 7 1 1 1 1 0 0 0 0", "G > 1: not a dense layer"),
    ],
)
def test_the_rule_leaves_the_sm80_kernel_where_c_is_not_a_multiple_of_8_or_pads_too_much(line, why):
    p = _problem(line)
    assert not sm90.pads_by_default(p), why
    assert not sm90.is_sm90(decide(p, "sm_90a")), why


def test_the_rules_switch_off_gives_the_sm80_kernel_back(monkeypatch):
    from convbw_mlir.policies import switches

    monkeypatch.setattr(switches, "WGMMA_PAD_BY_DEFAULT", False)
    assert not sm90.is_sm90(decide(_problem(XCEPTION_PW), "sm_90a"))


def test_select_gives_the_rules_padded_plan_and_offers_no_padded_plan_off_it():
    from convbw_mlir.dispatch import variants
    from convbw_mlir.dispatch.select import learned_selector, select

    selector = learned_selector("sm_90a")
    for line in (XCEPTION_PW, DENSENET121_L16, "2 1 32 440 440 1 1 7 7 1 1 1 1 0 0 0 0"):
        p = _problem(line, dtype="f16")
        offered = variants.candidates(p, "sm_90a", iree=False, wgmma_rows=False)
        assert [v.name for v in offered if sm90.is_sm90(v.plan)] == ["convbw[heuristic]"]
        chosen = select(p, "sm_90a", dbs=[], selector=selector)
        assert chosen.variant.plan == decide(p, "sm_90a") and sm90.is_sm90(chosen.variant.plan), line
