"""Thin groups merged into one implicit GEMM (issue 23, item 4: CK's group merging, ``plan.merge``).

The sm_80 kernel computes the dense GEMM of m adjacent groups (layout 2: m*C channels of x, m*K of dy) and its
store keeps the block diagonal, written to dW's own GKYXC. Numerics under the sm_80 emulator against float64
(ragged M and N, C in {4, 8, 16}, K != C, stride 2, bf16, odd channels, split-K, an epilogue); the plan's
field, its refusals and its rule (docs/decisions.md#thin-groups)."""

from __future__ import annotations

import json

import pytest
from sm80_emulator import module_error

from convbw_mlir.dispatch.variants import Variant, variant_key
from convbw_mlir.plan import Plan, PlanError, check_plan, decide
from convbw_mlir.plan_data import MergePlan, Strategy
from convbw_mlir.policies import sm80, switches
from convbw_mlir.problem import ConvBwdWeightProblem as P
from convbw_mlir.problem import Epilogue
from convbw_mlir.targets import get_target

# The classes suite's thin layers (layout 2, N = 32) and the groups the rule merges (m * K = 64).
SUITE = {
    "2 32 32 4 4 3 3 56 56 1 1 1 1 1 1 1 1": 16,
    "2 32 32 8 8 3 3 56 56 2 2 1 1 1 1 1 1": 8,
    "2 32 32 8 8 3 3 56 56 1 1 1 1 1 1 1 1": 8,
    "2 4 32 16 16 3 3 28 28 1 1 1 1 1 1 1 1": 4,
    "2 32 32 16 16 3 3 14 14 1 1 1 1 1 1 1 1": 4,
}
THIN4 = P.from_ck("2 4 2 4 4 3 3 6 7 1 1 1 1 1 1 1 1")  # 4 groups of 4 channels


def emulated_error(p: P, skip: bool = False, **options) -> float:
    """Max error of the emulated module against float64, relative to the largest entry of dW (``skip``: the
    stored plan's form that skips the mma.sync tiles off the diagonal)."""
    from dataclasses import replace

    from convbw_mlir.passes.explicit_kernel import ExplicitKernel

    plan = decide(p, "sm_80", strategy="explicit", **options)
    if skip:
        plan = replace(plan, merge=replace(plan.merge, skip_off_diagonal=True))
        check_plan(p, plan)
    return module_error(p, plan, [ExplicitKernel()], seed=3)


@pytest.mark.parametrize(
    ("ck", "options"),
    [
        ("2 4 2 4 4 3 3 6 7 1 1 1 1 1 1 1 1", {"merge_groups": 4}),  # C = 4: M = 16, N = 144, both ragged
        ("2 4 4 4 8 3 3 9 9 2 2 1 1 1 1 1 1", {"merge_groups": 2, "k_batch": 2}),  # K = 4 != C = 8, stride 2, split
        ("2 4 2 16 16 3 3 6 6 1 1 1 1 1 1 1 1", {"merge_groups": 4}),  # C = 16: M = 64 = the tile, N = 576
        ("2 8 2 8 8 1 1 5 5 1 1 1 1 0 0 0 0", {"merge_groups": 8}),  # a plain 1x1: x read as dy is
        ("2 4 2 5 3 3 3 6 7 1 1 1 1 1 1 1 1", {"merge_groups": 2}),  # odd K and C: one element a store
        ("2 8 2 16 8 1 1 5 5 1 1 1 1 0 0 0 0", {"merge_groups": 8, "tile_m": 64}),  # M = 128: two M tiles
        ("1 4 2 4 4 3 20 2 1 1 1", {"merge_groups": 4}),  # 1-D, stride 2
    ],
)  # fmt: skip
def test_merged_groups_match_float64_under_emulation(ck, options):
    p = P.from_ck(ck)
    assert decide(p, "sm_80", strategy="explicit", **options).merge == MergePlan(options["merge_groups"])
    assert emulated_error(p, **options) < 2e-3


@pytest.mark.parametrize("ck", ["2 4 4 4 8 3 3 9 9 2 2 1 1 1 1 1 1", "2 4 2 5 3 3 3 6 7 1 1 1 1 1 1 1 1"])
def test_the_form_that_skips_mma_tiles_off_the_diagonal_matches_float64_too(ck):
    """A stored plan's ``skip_off_diagonal: true`` (measured slower than the whole dense GEMM, the default)."""
    assert emulated_error(P.from_ck(ck), skip=True, merge_groups=2) < 2e-3


@pytest.mark.parametrize("skipped", ["mma", "b"])
def test_skipping_work_that_meets_the_diagonal_is_caught(monkeypatch, skipped):
    """The skip conditions decide real work: skipping every mma.sync leaves dW zero; skipping every B load
    (its fragment zero) while the mma.sync still run does too."""
    from convbw_mlir.kernels import gemm_sm80

    def never(ix, t, shape, merge, row0, col0):
        no = gemm_sm80.arith.constant(gemm_sm80.ir.IntegerType.get_signless(1), 0)
        mma, b = (t.wm // 16) * (t.wn // 8), t.wn // 16
        return gemm_sm80._Skip([no] * mma if skipped == "mma" else [None] * mma, [no] * b)

    monkeypatch.setattr(gemm_sm80, "_diagonal_tiles", never)
    assert emulated_error(THIN4, skip=True, merge_groups=4) > 0.1


def test_a_stored_merge_whose_skip_is_not_a_boolean_is_refused_by_name():
    with pytest.raises(PlanError, match="plan.merge.skip_off_diagonal: expected true or false, got 1"):
        Plan.from_dict({"target": "sm_80", "strategy": "explicit", "merge": {"groups": 2, "skip_off_diagonal": 1}})


def test_merged_groups_in_bf16_match_float64():
    p = P.from_ck("2 4 2 8 8 3 3 9 9 2 2 1 1 1 1 1 1").with_(dtype="bf16", dw_dtype="bf16")
    assert emulated_error(p, merge_groups=4) < 2.0**-8


def test_merged_groups_with_an_epilogue_in_the_store_match_float64():
    p = P.from_ck("2 4 2 4 4 3 3 6 7 1 1 1 1 1 1 1 1").with_(epilogue=Epilogue("bilinear", 2.0, -0.5))
    assert emulated_error(p, merge_groups=2) < 2e-3


def test_a_store_without_the_block_diagonal_mask_is_caught(monkeypatch):
    """Off-diagonal entries (one group's x against another's dy) land on dW's indices of the row's group."""
    from convbw_mlir.kernels import gemm_sm80

    true = lambda ix, channel, in_channels, group: gemm_sm80.arith.constant(gemm_sm80.ir.IntegerType.get_signless(1), 1)  # noqa: E731
    monkeypatch.setattr(gemm_sm80, "_on_diagonal", true)
    assert emulated_error(P.from_ck("2 4 2 4 4 3 3 6 7 1 1 1 1 1 1 1 1"), merge_groups=4) > 0.1


def test_merge_is_part_of_the_plan_its_json_and_its_identity():
    p = P.from_ck("2 4 2 4 4 3 3 6 7 1 1 1 1 1 1 1 1")
    merged = decide(p, "sm_80", strategy="explicit", merge_groups=4)
    one = decide(p, "sm_80", strategy="explicit", merge_groups=1)
    assert merged.to_dict()["merge"] == {"groups": 4, "skip_off_diagonal": False} and "merge" not in one.to_dict()
    assert Plan.from_dict(json.loads(json.dumps(merged.to_dict()))) == merged != one
    keys = {variant_key(p, "sm_80", Variant("convbw", plan), "3.13.0") for plan in (merged, one)}
    assert len(keys) == 2  # the kernel cache tells them apart


@pytest.mark.parametrize(
    ("problem", "options", "message"),
    [
        (THIN4, {"merge_groups": 3}, "merge: 3 groups do not divide the problem's 4"),
        (THIN4.with_(layout=4), {"merge_groups": 2}, "merge: 2 groups in layout"),
        (THIN4, {"merge_groups": 2, "producers": 2}, "merge: 2 groups with producers"),
        (THIN4, {"merge_groups": 0}, "merge-groups: expected a positive integer, got 0"),
    ],
)  # fmt: skip
def test_merge_refusals_name_the_field_and_value(problem, options, message):
    with pytest.raises(PlanError) as e:
        decide(problem, "sm_80", strategy="explicit", **options)
    assert message in str(e.value)


def test_merge_applies_to_strategy_explicit_on_sm80_only():
    p = P.from_ck("2 4 2 4 4 3 3 6 7 1 1 1 1 1 1 1 1")
    with pytest.raises(PlanError, match="merge-groups: 2 applies to strategy explicit only"):
        decide(p, "sm_80", merge_groups=2)
    with pytest.raises(PlanError, match="merge-groups: 2 on target gfx942"):
        decide(p, "gfx942", strategy="explicit", merge_groups=2)


@pytest.mark.parametrize(
    ("plan", "message"),
    [
        (Plan("sm_80", Strategy.MMA, merge=MergePlan(2)), "merge: 2 groups applies to strategy explicit only"),
        (Plan("sm_80", Strategy.EXPLICIT, merge=MergePlan(1)), "merge: 1 group (at least 2"),
    ],
)  # fmt: skip
def test_a_stored_plan_with_a_merge_the_kernel_cannot_carry_is_refused(plan, message):
    p = P.from_ck("2 4 2 4 4 3 3 6 7 1 1 1 1 1 1 1 1")
    if plan.strategy == Strategy.EXPLICIT:
        plan = Plan.from_dict(
            {**decide(p, "sm_80", strategy="explicit", merge_groups=1).to_dict(), "merge": {"groups": 1}}
        )
    with pytest.raises(PlanError, match=message.replace("(", r"\(")):
        check_plan(p, plan)


@pytest.mark.parametrize(("ck", "groups"), SUITE.items())
def test_rule_merges_the_suites_thin_layers_to_fill_64_rows(ck, groups):
    p = P.from_ck(ck)
    assert sm80.merge_rule(p, get_target("sm_80")) == groups
    assert decide(p, "sm_80", strategy="explicit").merge == MergePlan(groups)


def test_4_channel_groups_take_the_merged_gemm_and_odd_ones_the_grouped_depthwise_form(monkeypatch):
    p = P.from_ck("2 32 32 4 4 3 3 56 56 1 1 1 1 1 1 1 1")
    chosen = decide(p, "sm_80")  # merged: 1.9x the grouped depthwise form measured (decisions.md#thin-groups)
    assert chosen.depthwise is None and chosen.merge == MergePlan(16)
    odd = decide(P.from_ck("2 32 32 3 3 3 3 56 56 1 1 1 1 1 1 1 1"), "sm_80")  # odd C: the rule does not merge
    assert odd.depthwise is not None and odd.merge is None
    monkeypatch.setattr(switches, "MERGE_BY_DEFAULT", False)
    assert decide(p, "sm_80").depthwise is not None  # the switch off: the grouped form, as before
    assert decide(p, "sm_80", strategy="explicit").merge == MergePlan(16)  # asked for, the merged GEMM
    assert decide(p, "sm_80", strategy="explicit", merge_groups=1).merge is None  # one group a GEMM stays reachable


def test_the_switch_merges_the_groups_the_plan_gave_the_explicit_kernel_one_at_a_time(monkeypatch):
    p = P.from_ck("2 32 32 8 8 3 3 56 56 1 1 1 1 1 1 1 1")
    assert decide(p, "sm_80").merge == MergePlan(8)
    monkeypatch.setattr(switches, "MERGE_BY_DEFAULT", False)
    one = decide(p, "sm_80")
    assert one.strategy == Strategy.EXPLICIT and one.merge is None


@pytest.mark.parametrize(
    "ck",
    [
        "2 4 2 3 5 3 3 6 7 1 1 1 1 1 1 1 1",  # odd C: not measured, element-wise stores
        "2 32 32 32 32 3 3 14 14 1 1 1 1 1 1 1 1",  # 32 channels a group: the tile fills one group at a time
        "2 5 4 16 16 3 3 14 14 1 1 1 1 1 1 1 1",  # G = 5: no divisor m with m * 16 <= 64
    ],
)
def test_rule_leaves_one_group_a_gemm_outside_thin_even_groups(ck):
    assert sm80.merge_rule(P.from_ck(ck), get_target("sm_80")) == 1
