"""The plan as named rules (issue 38): every rule of plan.RULES is named and has a reason; the rule that made a
plan is recorded on it (not in its identity), logged, and shown by op.plan and ``convbw select``, a tuning
database's entry named as such. The rules' decisions equal the early returns they replaced on every suite
problem: bench/plan_identity.py (docs/plan.md#rules)."""

from __future__ import annotations

import logging

import pytest

from convbw_mlir.cli import main
from convbw_mlir.plan import RULES, Decision, Plan, decide
from convbw_mlir.policies import switches
from convbw_mlir.problem import ConvBwdWeightProblem

CONV = ConvBwdWeightProblem.from_ck("2 1 4 8 8 3 3 8 8 1 1 1 1 1 1 1 1")  # layout 2: the sm_80 kernel takes it
DEPTHWISE = ConvBwdWeightProblem.from_ck("2 32 4 1 1 3 3 16 16 1 1 1 1 1 1 1 1")


def test_every_rule_has_a_unique_name_where_it_applies_and_a_one_line_reason():
    names = [r.name for r in RULES]
    assert len(set(names)) == len(names) and all(n and n == n.strip() and " " not in n for n in names)
    for rule in RULES:
        assert rule.when.strip() and rule.reason.strip() and "\n" not in rule.reason, rule.name
        assert callable(rule.applies) and callable(rule.make), rule.name
    assert names[0] == "fp8" and names[-1] == "codegen"  # fp8 before all; codegen takes what is left


def test_the_plan_records_its_rule_outside_its_identity():
    plan = decide(CONV, "sm_80")
    assert plan.decision.rule == "explicit-by-default" and "sm_80 implicit GEMM" in plan.decision.detail
    assert plan.decision.options == () and "explicit-by-default" in repr(plan)
    bare = Plan.from_dict(plan.to_dict())
    assert bare.decision is None and bare == plan and hash(bare) == hash(plan)
    assert "decision" not in plan.to_dict() and "explicit-by-default" not in str(plan.to_dict())


def test_each_path_of_the_plan_is_named_by_its_rule():
    assert decide(CONV, "host").decision.rule == "host"
    assert decide(CONV, "gfx942").decision.rule == "codegen"
    assert decide(DEPTHWISE, "sm_80").decision.rule == "depthwise-by-default"
    asked = decide(CONV, "sm_80", strategy="explicit", k_batch=2)
    assert asked.decision.rule == "explicit-asked" and asked.decision.options == (("strategy", "explicit"),
                                                                                  ("k_batch", 2))  # fmt: skip
    four = decide(CONV.with_(layout="NGCHW/GKCYX/NGKHW"), "sm_80").decision
    assert (four.rule, four.then.rule) == ("layout4-as-layout2", "explicit-by-default")
    off_nvidia = decide(CONV.with_(layout="NGCHW/GKCYX/NGKHW"), "gfx942").decision
    assert off_nvidia.rule == "codegen" and "layout4-as-layout2 declined" in off_nvidia.detail


def test_a_switch_turned_off_hands_the_problem_to_the_next_rule(monkeypatch):
    monkeypatch.setattr(switches, "DEPTHWISE_BY_DEFAULT", False)
    assert decide(DEPTHWISE, "sm_80").decision.rule == "codegen"


def test_decide_logs_its_rule_at_debug(caplog):
    with caplog.at_level(logging.DEBUG, logger="convbw_mlir.plan"):
        decide(CONV, "gfx942")
    assert any(r.name == "convbw_mlir.plan" and "codegen" in r.getMessage() for r in caplog.records)


def test_select_shows_the_rule_and_why(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CONVBW_CACHE_DIR", str(tmp_path))
    assert main(["select", "--ck", CONV.to_ck(), "--target", "sm_80"]) == 0
    out = capsys.readouterr().out
    assert "\nrule: explicit-by-default\nwhy: explicit-by-default: " in out and "options: none" in out
    assert out.index("workspace: ") < out.index("rule: ")  # the lines scripts parse keep their place


@pytest.mark.parametrize(
    ("ck", "rule", "kernel"),
    [
        ("2 1 1 1 64 3 3 14 14 1 1 1 1 1 1 1 1", "gemv-by-default", "the split-reduction GEMV kernel"),
        ("2 8 32 1 1 3 3 28 28 1 1 1 1 1 1 1 1", "depthwise-by-default", "the depthwise kernel"),
    ],
)
def test_why_names_the_kernel_once_where_the_rules_reason_already_does(ck, rule, kernel):
    why = decide(ConvBwdWeightProblem.from_ck(ck), "sm_90a").decision
    assert why.rule == rule and " ".join(why.lines()).count(kernel) == 1


def test_select_says_a_database_entry_is_tuned_not_a_rule(tmp_path, capsys, monkeypatch):
    from convbw_mlir.dispatch import TuningDB, heuristic
    from convbw_mlir.dispatch.build import iree_version

    monkeypatch.setenv("CONVBW_CACHE_DIR", str(tmp_path))
    db = TuningDB("local-task", "host", iree_version())
    db.add(CONV, heuristic(CONV, "host"), median_s=1e-4)
    db.save(tmp_path / "db.json")
    assert main(["select", "--ck", CONV.to_ck(), "--target", "host", "--db", str(tmp_path / "db.json")]) == 0
    out = capsys.readouterr().out
    assert "\nrule: tuned\nwhy: tuned: a tuning database's entry for exactly this problem" in out


def test_a_decision_reads_as_its_rule_chain():
    inner = Decision("b", "why b", "found")
    lines = Decision("a", "why a", then=inner, options=(("k_batch", 4),)).lines()
    assert lines == ["rule: a -> b", "why: a: why a", "why: b: why b; found", "options: k_batch=4"]


def test_op_plan_names_its_rule_built_or_from_the_kernel_cache(compiled):
    from convbw_mlir import compile_op

    assert compiled(CONV, "host").plan.decision.rule == "host"  # built (or shared) in this session
    assert compile_op(CONV, "host").plan.decision.rule == "host"  # the kernel cache's copy: its plan from plain data
    assert compile_op(CONV, "host", cache=False, k_batch=2).plan.decision.options == (("k_batch", 2),)
    given = compile_op(CONV, "host", plan=decide(CONV, "host").to_dict()).plan.decision  # the cache's kernel again
    assert given.rule == "given" and "as given" in given.reason


def _tuned_db():
    from convbw_mlir.dispatch import TuningDB, candidates

    db = TuningDB("NVIDIA H100 80GB HBM3", "sm_80", "3.13.0")
    tuned = ConvBwdWeightProblem.from_ck("2 1 256 64 64 3 3 56 56 1 1 1 1 1 1 1 1")
    db.add(tuned, next(v for v in candidates(tuned, "sm_80") if v.options == (("k_batch", 32),)), median_s=1e-3)
    return tuned, db


def test_a_nearest_neighbours_plan_names_the_neighbour_then_the_rule_that_made_it():
    from convbw_mlir.dispatch import select

    tuned, db = _tuned_db()
    sel = select(tuned.with_(batch=128), "sm_80", dbs=[db], selector=False)
    why = sel.variant.plan.decision
    assert sel.path == "nearest" and why.rule == "nearest" and "distance 1.00" in why.detail
    assert why.then is not None and why.then.rule in {r.name for r in RULES} and why.options == (("k_batch", 32),)
    assert why.lines()[0] == f"rule: nearest -> {why.then.rule}"


def test_a_learned_selectors_choice_names_the_selector_then_the_rule_that_made_it():
    from convbw_mlir.dispatch import select
    from convbw_mlir.dispatch.learned import TreeSelector

    flat = TreeSelector("sm_80", 0.0, 1.0, [{"left": [-1], "right": [-1], "feature": [0], "threshold": [0.0],
                                              "value": [0.0]}], meta={"problems": 3})  # fmt: skip
    sel = select(CONV, "sm_80", dbs=[], selector=flat)
    why = sel.variant.plan.decision
    assert sel.path == "learned" and why.rule == "learned" and "trained on 3 problems" in why.detail
    assert why.then.rule == "explicit-by-default"  # a tie: the first candidate, the heuristic's own plan


def test_a_plan_chosen_for_a_workspace_limit_says_so():
    from convbw_mlir.dispatch import select

    split = ConvBwdWeightProblem.from_ck("2 1 32 72 72 3 3 56 56 1 1 1 1 1 1 1 1")
    assert decide(split, "sm_80").workspace_bytes > 0  # split-K's partials: the limit rules the plan's own out
    sel = select(split, "sm_80", dbs=[], selector=False, max_workspace_bytes=0)
    why = sel.variant.plan.decision
    assert why.rule == "constrained" and "workspace" in why.detail and why.then is not None
