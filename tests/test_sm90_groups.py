"""Thin and medium groups on sm_90a (issue 40 item 2): the wgmma kernel's boxed form in the product. The option
(``wgmma-merge``) and its refusals, the default (switch ``WGMMA_MERGE_BY_DEFAULT`` on: thin groups, C 4-16, boxed;
wider ones still the sm_80 kernel), the rule behind the switch, the tuner's neighbours, the kernel
convbw-explicit-kernel builds from such a plan under the sm_90a emulator, and the box starts' 16-byte alignment."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from convbw_mlir.dispatch.variants import Variant, candidates
from convbw_mlir.plan import Plan, PlanError, check_plan, decide
from convbw_mlir.policies import sm90, switches
from convbw_mlir.problem import ConvBwdWeightProblem
from convbw_mlir.targets import get_target

RESNEXT_4 = "2 32 32 4 4 3 3 56 56 1 1 1 1 1 1 1 1"  # ResNeXt-50 32x4d layer1's 3x3
REGNETY_56 = "2 4 32 56 56 3 3 28 28 1 1 1 1 1 1 1 1"  # RegNetY-8GF's 56-channel groups, stage 2
REGNETY_8 = "2 13 32 8 8 3 3 28 28 1 1 1 1 1 1 1 1"  # RegNetY-400MF: 13 groups of 8 (a ragged last box)


def _problem(line: str, **fields) -> ConvBwdWeightProblem:
    return ConvBwdWeightProblem.from_ck(line).with_(**{"layout": 2, **fields})


@pytest.mark.parametrize(("line", "groups", "boxed"), [(RESNEXT_4, 16, True), (REGNETY_56, 1, False),
                                                        (REGNETY_8, 8, True)])  # fmt: skip
def test_wgmma_merge_gives_the_wgmma_kernel_with_the_groups_a_box_and_the_default_boxes_thin_groups_only(
    line, groups, boxed
):
    p = _problem(line)
    assert sm90.merge_for(p) == groups
    now = decide(p, "sm_90a")  # switch on: the boxed form for C 4-16, the sm_80 kernel for C = 56 (one 0.97x layer)
    assert sm90.is_sm90(now) == boxed and (now.merge.groups == groups if boxed else True)
    plan = decide(p, "sm_90a", strategy="explicit", wgmma_merge=groups)
    assert sm90.is_sm90(plan) and plan.merge.groups == groups and plan.streamk is None
    rows = groups * p.out_channels
    assert plan.tile.m == (64 if rows <= 64 else 128)
    assert "boxed form as asked (wgmma-merge)" in plan.decision.detail
    again = Plan.from_dict(json.loads(json.dumps(plan.to_dict())))
    assert again == plan
    check_plan(p, again)  # a stored plan replays
    Variant("convbw", plan)  # the variant of it is valid (its tile a wgmma shape of the target's table)


@pytest.mark.parametrize(
    ("line", "options", "message"),
    [
        (RESNEXT_4, dict(wgmma_merge=17), r"wgmma-merge: 17 groups of 4 channels \(1 \.\. 16"),
        ("2 32 32 64 64 3 3 14 14 1 1 1 1 1 1 1 1", dict(wgmma_merge=1), "in_channels 64 .*the plain wgmma kernel"),
        ("2 3 32 6 6 3 3 14 14 1 1 1 1 1 1 1 1", dict(wgmma_merge=3), r"groups: 3 x 6 in, 6 out channels"),
        (RESNEXT_4, dict(wgmma_merge=16, streamk="auto"), "wgmma-merge: 16 with streamk 'auto'"),
        (RESNEXT_4, dict(wgmma_merge=16, tile_m=64), "wgmma-merge: 16 with tile options"),
        (RESNEXT_4, dict(wgmma_merge=16, layout=4), "layout: NGCHW/GKCYX/NGKHW"),  # its own forms asked: none boxed
    ],
)
def test_wgmma_merge_refuses_with_the_field_and_its_value(line, options, message):
    layout = options.pop("layout", 2)
    p = _problem(line, layout=layout)
    with pytest.raises(PlanError, match=message):
        decide(p, "sm_90a", strategy="explicit", **options)


def test_wgmma_merge_is_refused_off_sm90a_and_without_strategy_explicit():
    p = _problem(RESNEXT_4)
    with pytest.raises(PlanError, match="wgmma-merge: 16 on target sm_80"):
        decide(p, "sm_80", strategy="explicit", wgmma_merge=16)
    with pytest.raises(PlanError, match="wgmma-merge: 16 applies to strategy explicit only"):
        decide(p, "sm_90a", wgmma_merge=16)


def test_rule_behind_the_switch_takes_the_boxed_form_for_its_group_widths_only(monkeypatch):
    assert switches.WGMMA_MERGE_BY_DEFAULT and sm90.MERGE_RULE_CHANNELS == (4, 16)
    for line, groups in ((RESNEXT_4, 16), (REGNETY_8, 8)):
        plan = decide(_problem(line), "sm_90a")
        assert sm90.is_sm90(plan) and plan.merge.groups == groups, line
        assert "by its rule (switch WGMMA_MERGE_BY_DEFAULT)" in plan.decision.detail
    assert not sm90.is_sm90(decide(_problem(REGNETY_56), "sm_90a"))  # C = 56: outside the measured range
    monkeypatch.setattr(sm90, "MERGE_RULE_CHANNELS", (24, 63))  # another range moves both
    assert not sm90.is_sm90(decide(_problem(RESNEXT_4), "sm_90a"))
    assert sm90.is_sm90(decide(_problem(REGNETY_56), "sm_90a"))
    assert not sm90.is_sm90(decide(_problem(RESNEXT_4), "sm_90a", strategy="explicit", merge_groups=16))
    monkeypatch.setattr(switches, "WGMMA_MERGE_BY_DEFAULT", False)  # switch off: the sm_80 kernel everywhere
    assert not sm90.is_sm90(decide(_problem(REGNETY_56), "sm_90a"))


def test_tuner_offers_the_boxed_form_beside_the_sm80_kernel_and_the_sm80_kernel_beside_the_boxed_form():
    p = _problem(REGNETY_56)
    base, *rivals = candidates(p, "sm_90a", max_plans=4, iree=False)
    assert not sm90.is_sm90(base.plan)
    assert any(sm90.is_sm90(v.plan) and v.plan.merge.groups == 1 for v in rivals)
    base, *rivals = candidates(_problem(RESNEXT_4), "sm_90a", max_plans=4, iree=False)
    assert sm90.is_sm90(base.plan) and base.plan.merge.groups == 16
    kinds = [(sm90.is_sm90(v.plan), v.plan.merge and v.plan.merge.groups) for v in rivals]
    assert kinds[:2] == [(True, 16), (True, 16)]  # the boxed form's splits +-
    assert (False, 16) in kinds  # the sm_80 kernel with its own merge


@pytest.mark.parametrize(
    ("line", "dtype"),
    [
        ("2 20 4 4 4 3 3 6 5 1 1 1 1 1 1 1 1", "f16"),  # 16 a box, the second box 4 groups
        ("2 3 8 56 56 3 3 9 9 2 2 1 1 1 1 1 1", "bf16"),  # one 56-channel group a box, stride 2
    ],
)
def test_pass_built_boxed_kernel_matches_float64_under_emulation(line, dtype):
    """The plan's boxed form as convbw-explicit-kernel builds it (split, dW in f32 partials summed here)."""
    from sm90_emulator import max_error_of_plan

    p = _problem(line, dtype=dtype, dw_dtype="f32")
    plan = decide(p, "sm_90a", strategy="explicit", wgmma_merge=sm90.merge_for(p), k_batch=2)
    assert max_error_of_plan(p, plan, seed=3) < 1e-6


def test_default_unsplit_boxed_plan_matches_float64_under_emulation():
    """The plan's own choice for 8-channel groups (the boxed form, no split: the kernel writes dW itself)."""
    from sm90_emulator import max_error_of_plan

    p = _problem("2 32 2 8 8 3 3 8 8 1 1 1 1 1 1 1 1", dtype="bf16", dw_dtype="f32")
    plan = decide(p, "sm_90a")
    assert (plan.merge.groups, plan.k_batch) == (8, 1), plan
    assert max_error_of_plan(p, plan, seed=5) < 1e-6


def test_target_table_has_the_boxed_forms_wgmma_shapes():
    tgt = get_target("sm_90a")
    for line in (RESNEXT_4, REGNETY_56, REGNETY_8):
        p = _problem(line)
        plan = decide(p, "sm_90a", strategy="explicit", wgmma_merge=sm90.merge_for(p))
        assert plan.tile.intrinsic in [i.name for i in tgt.intrinsics[p.dtype]], plan.tile


# -- box starts: every box's TMA start on 16 bytes (the thin90 fuzz's crashes on an H100) -------------------------
FUZZ_H100 = Path(__file__).parent / "data" / "thin90_fuzz_h100.json"


def _fuzz_h100() -> list[tuple[str, bool, ConvBwdWeightProblem, dict]]:
    entries = json.loads(FUZZ_H100.read_text())["problems"]
    return [(e["key"], e["outcome"] == "ok", ConvBwdWeightProblem.from_dict(e["problem"]), e["options"])
            for e in entries]  # fmt: skip


def test_the_h100_fuzz_crashes_are_refused_naming_wgmma_merge_and_its_ok_problems_still_plan():
    fuzz = _fuzz_h100()
    assert len(fuzz) == 42 and sum(ok for _, ok, _, _ in fuzz) == 30
    for key, ok, p, options in fuzz:
        m = options["wgmma_merge"]
        if ok:
            plan = decide(p, "sm_90a", **options)
            assert sm90.is_sm90(plan) and plan.merge.groups == m, key
        else:
            with pytest.raises(PlanError, match=rf"wgmma-merge: {m} x {p.in_channels} in, {p.out_channels} out .*"
                               "multiple of 8: 16 bytes"):  # fmt: skip
                decide(p, "sm_90a", **options)


def test_kernel_refuses_a_box_start_off_16_bytes():
    from convbw_mlir.kernels.conv_sm90 import from_problem

    p = ConvBwdWeightProblem(groups=38, batch=1, in_channels=12, out_channels=12, input_size=(54,),
                             filter_size=(1,), dtype="f16", layout=2)  # fmt: skip
    from_problem(p, merge=2)  # 24 channels a box: every start on 48 bytes
    with pytest.raises(ValueError, match=r"merge: 1 x 12 in, 12 out channels = 12, 12 \(each a multiple of 8"):
        from_problem(p, merge=1)


def _starts_aligned(p: ConvBwdWeightProblem, m: int) -> bool:
    """Box b's x channel b m C and dy column b m K (16-bit) on 16 bytes for every b < ceil(G / m)."""
    return all(b * m * n * 2 % 16 == 0 for b in range(-(-p.groups // m)) for n in (p.in_channels, p.out_channels))


def test_the_widths_the_policy_and_the_tuner_pick_never_put_a_box_start_off_16_bytes(monkeypatch):
    for c in range(2, 64, 2):
        for k in (2, 4, 6, 8, 12, 24, 40, 56, 72):
            for g in (2, 3, 4, 6, 12, 14, 28, 32, 38):
                if (g * c) % 8 or (g * k) % 8:
                    continue
                p = ConvBwdWeightProblem(groups=g, batch=1, in_channels=c, out_channels=k, input_size=(9,),
                                         filter_size=(3,), dtype="bf16", layout=2)  # fmt: skip
                m = sm90.merge_for(p)
                assert m == 0 or (_starts_aligned(p, m) and not sm90.merge_refusals(p, m)), (c, k, g, m)
    monkeypatch.setattr(switches, "WGMMA_MERGE_BY_DEFAULT", True)
    for key, _, p, _ in _fuzz_h100():
        for v in candidates(p, "sm_90a", max_plans=6, iree=False):
            if sm90.is_sm90(v.plan) and v.plan.merge is not None:
                assert _starts_aligned(p, v.plan.merge.groups), (key, v.plan.merge)


def test_emulator_stops_a_tma_whose_box_start_is_off_16_bytes(monkeypatch):
    """The H100's rule in the emulator: a boxed plan past both refusals (patched out) fails there, as on the card."""
    from sm90_emulator import max_error_of_plan

    from convbw_mlir.kernels.conv_sm90 import ConvSm90
    from convbw_mlir.plan_data import MergePlan

    p = ConvBwdWeightProblem(groups=2, batch=2, in_channels=12, out_channels=12, input_size=(12, 12),
                             filter_size=(3, 3), dtype="f16", dw_dtype="f32", layout=2)  # fmt: skip
    plan = decide(p, "sm_90a", strategy="explicit", wgmma_merge=2, k_batch=2)  # one box: starts at 0
    assert max_error_of_plan(p, plan) < 1e-6
    monkeypatch.setattr(sm90, "merge_misaligned", lambda *_: "", raising=False)
    monkeypatch.setattr(ConvSm90, "_boxed_checks", lambda self: None)
    with pytest.raises(AssertionError, match="TMA at column 12: the innermost coordinate must be 16-byte aligned"):
        max_error_of_plan(p, dataclasses.replace(plan, merge=MergePlan(1)))
