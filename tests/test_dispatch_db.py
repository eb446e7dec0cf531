"""The tuning database's schema: a bad entry is a warning naming the file and the entry (readers) or one error
(--import); select never breaks on it and never takes an entry that is not for the problem (property test)."""

from __future__ import annotations

import copy
import json
import math
import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from convbw_mlir.dispatch import DatabaseError, TuningDB, Variant, candidates, select
from convbw_mlir.dispatch.db import db_file_name
from convbw_mlir.dispatch.select import NEAREST_MAX, databases, distance
from convbw_mlir.plan import check_plan
from convbw_mlir.problem import ConvBwdWeightProblem

PROBLEMS = [
    ConvBwdWeightProblem.from_ck("2 1 4 8 8 3 3 8 8 1 1 1 1 1 1 1 1"),
    ConvBwdWeightProblem.from_ck("2 1 8 8 8 3 3 8 8 1 1 1 1 1 1 1 1"),
    ConvBwdWeightProblem.from_ck("2 2 4 8 8 1 1 8 8 1 1 1 1 0 0 0 0"),
]
NEIGHBOUR = PROBLEMS[0].with_(batch=2)  # distance 1 from the first


def _db() -> TuningDB:
    db = TuningDB("local-task", "host", "3.13.0")
    for i, p in enumerate(PROBLEMS):
        winner = next(v for v in candidates(p, "host") if v.options == (("k_batch", 2),))
        db.add(p, winner, median_s=1e-4 * (i + 1), heuristic_s=2e-4, noise=0.01, flipped=False, runner_up="x",
               why="fastest correct", metric="median_s", iree_best=None, measured="2026-11-25")  # fmt: skip
    return db


def _with_first_entry(**change) -> str:
    data = json.loads(_db().to_json())
    entry = data["entries"][0]
    for k, v in change.items():
        if v is _DROP:
            del entry[k]
        else:
            entry[k] = v
    return json.dumps(data)


_DROP = object()
BAD_ENTRIES = [
    (dict(median_s="fast"), "median_s: expected a positive number of seconds, got 'fast'"),
    (dict(median_s=-1), "median_s: expected a positive number of seconds, got -1"),
    (dict(median_s=math.nan), "median_s: expected a positive number of seconds, got nan"),
    (dict(name=_DROP), "missing field 'name'"),
    (dict(median_s=_DROP), "missing field 'median_s'"),
    (dict(noise="low"), "noise: expected a number >= 0, got 'low'"),
    (dict(flipped="yes"), "flipped: expected true or false, got 'yes'"),
    (dict(metric="fastest"), "metric: expected one of median_s, kernel_s, got 'fastest'"),
    (dict(iree_best={"form": "cudnn", "median_s": 1e-4}), "iree_best: expected one of iree_direct"),
    (dict(problem=[]), "problem: expected an object, got []"),
    (
        dict(variant={"form": "convbw", "plan": {"target": "host", "strategy": "iree", "split": {"dim": "n"}}}),
        "variant: plan.split.k_batch: missing",
    ),  # fmt: skip
    (
        dict(variant={"form": "convbw", "plan": {"target": "sm_80", "strategy": "iree"}}),
        "variant: a plan for sm_80, in a database for host",
    ),  # fmt: skip
    (  # a name that is not its problem's (issue 42: taken as it was)
        dict(name="2d_g1_n256_c64_k64_f3x3_i56x56_s1x1_d1x1_p1x1_1x1_f16_l2"),
        "name: '2d_g1_n256_c64_k64_f3x3_i56x56_s1x1_d1x1_p1x1_1x1_f16_l2' is not the name of the entry's problem",
    ),  # fmt: skip
]


@pytest.mark.parametrize("change, message", BAD_ENTRIES, ids=[m.split(":")[0] for _, m in BAD_ENTRIES])
def test_a_bad_entry_is_left_out_with_a_warning_naming_file_and_entry_and_refused_when_strict(change, message):
    text = _with_first_entry(**change)
    with pytest.warns(UserWarning, match=r"tuning database db\.json: entries\[0\].*" + _re(message)):
        db = TuningDB.parse(text, "db.json", strict=False)
    assert len(db.entries) == len(PROBLEMS) - 1  # the others are kept
    with pytest.raises(DatabaseError, match=r"^tuning database db\.json: entries\[0\].*" + _re(message)):
        TuningDB.parse(text, "db.json")


def _re(text: str) -> str:
    import re

    return re.escape(text)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"target": "x/../../evil"}, "target: unknown target 'x/../../evil'"),
        ({"device": 3}, "device: expected a non-empty string, got 3"),
        ({"device": ""}, "device: expected a non-empty string, got ''"),
        ({"entries": {}}, "entries: expected a list, got dict"),
        ({"entries": _DROP}, "missing field 'entries'"),
    ],
)
def test_a_bad_header_refuses_the_file_naming_it(change, message):
    data = json.loads(_db().to_json())
    for k, v in change.items():
        if v is _DROP:
            del data[k]
        else:
            data[k] = v
    with pytest.raises(DatabaseError, match=r"^tuning database db\.json: " + _re(message)):
        TuningDB.parse(json.dumps(data), "db.json", strict=False)


def test_a_database_file_name_is_made_of_checked_fields_only():
    assert db_file_name("../../NVIDIA H100/..", "sm_80") == "nvidia-h100.sm_80.json"
    with pytest.raises(DatabaseError, match="target: unknown target 'x/../../evil'"):
        db_file_name("device", "x/../../evil")


def test_add_refuses_a_measurement_of_the_wrong_type():
    with pytest.raises(ValueError, match="median_s: expected a positive number of seconds, got 'fast'"):
        TuningDB("local-task", "host", "3.13.0").add(PROBLEMS[0], Variant("iree_direct"), median_s="fast")


def test_select_on_a_neighbour_of_a_bad_entry_warns_and_never_breaks(tmp_path, monkeypatch):
    monkeypatch.setenv("CONVBW_CACHE_DIR", str(tmp_path))
    from convbw_mlir.dispatch.build import iree_version

    data = json.loads(_db().to_json())
    data["iree_version"] = iree_version()
    del data["entries"][0]["name"]  # the KeyError from select on a neighbouring problem
    data["entries"][1]["median_s"] = "fast"  # the TypeError from every compile of that problem
    (tmp_path / "tuning").mkdir()
    (tmp_path / "tuning" / "local-task.host.json").write_text(json.dumps(data))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dbs = databases("host")
    assert [str(w.message).split("tuning/")[1] for w in caught] == [
        "local-task.host.json: entries[0]: missing field 'name': entry ignored",
        f"local-task.host.json: entries[1] ({PROBLEMS[1].name}): median_s: expected a positive number of seconds, "
        "got 'fast': entry ignored",
    ]
    assert len(dbs[0].entries) == 1  # the third, good entry
    assert select(NEIGHBOUR, "host", dbs=dbs).path == "heuristic"
    assert select(PROBLEMS[0], "host", dbs=dbs).path == "heuristic"
    assert select(PROBLEMS[1], "host", dbs=dbs).path == "heuristic"
    assert select(PROBLEMS[2], "host", dbs=dbs).path == "exact"


def test_an_exact_hit_on_the_heuristics_plan_is_named_tuned_not_heuristic():
    db = TuningDB("local-task", "host", "3.13.0")
    heuristic = candidates(PROBLEMS[0], "host")[0]
    assert heuristic.name == "convbw[heuristic]"
    db.add(PROBLEMS[0], heuristic, median_s=1e-4)
    sel = select(PROBLEMS[0], "host", dbs=[TuningDB.parse(db.to_json())])
    assert sel.path == "exact" and sel.variant.name == "convbw[tuned]" and sel.variant == heuristic


def test_a_stored_plan_whose_split_does_not_fit_its_problem_is_decided_anew():
    data = json.loads(_db().to_json())
    data["entries"][0]["variant"]["plan"]["split"] = {"dim": "n", "k_batch": 8, "chunk": 4}  # 4 images
    with pytest.warns(UserWarning, match=r"plan\.split: split: k_batch 8 x chunk 4 must cover loop 'n'"):
        sel = select(PROBLEMS[0], "host", dbs=[TuningDB.parse(json.dumps(data))])
    assert sel.path != "exact"


# -- property: random mutations of a valid file ------------------------------------------------------
VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.sampled_from(["host", "sm_80", "x/../../evil", "n", "o0", "iree", "convbw", "iree_direct", "kernel_s", "fast"]),
    st.lists(st.integers(-2, 9), max_size=3),
    st.just({}),
)


def _paths(node, prefix=()):
    """Every (container path, key) of a JSON tree."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for k, v in items:
        yield prefix, k
        yield from _paths(v, (*prefix, k))


def _mutate(data, choices):
    for shallow, pick, action, value in choices:
        paths = list(_paths(data))
        if shallow:  # the header's and the entries' own fields, where most of the checks are
            paths = [(pre, k) for pre, k in paths if len(pre) == 0 or (len(pre) == 2 and pre[0] == "entries")]
        if not paths:
            break
        prefix, key = paths[pick % len(paths)]
        parent = data
        for k in prefix:
            parent = parent[k]
        if action == "drop" and isinstance(parent, dict):
            del parent[key]
        elif action == "scale" and isinstance(parent[key], int | float) and not isinstance(parent[key], bool):
            parent[key] = parent[key] * value if isinstance(value, int | float) else -parent[key]
        else:
            parent[key] = value
    return data


BASE = json.loads(_db().to_json())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 10**6), st.sampled_from(["drop", "set", "scale"]), VALUES),
                min_size=1, max_size=4))  # fmt: skip
def test_mutating_a_valid_database_never_breaks_select_nor_serves_another_problems_entry(choices):
    data = _mutate(copy.deepcopy(BASE), choices)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            db = TuningDB.parse(json.dumps(data), "mutated.json", strict=False)
        except DatabaseError:
            return  # a bad header: the whole file is ignored (a warning in select.databases)
        if db.target != "host":
            return  # select.databases consults a database for its own target only
        for problem in [*PROBLEMS, NEIGHBOUR]:
            sel = select(problem, "host", dbs=[db])
            if sel.path == "exact":
                assert ConvBwdWeightProblem.from_dict(sel.entry["problem"]) == problem
            if sel.path == "nearest":
                near = ConvBwdWeightProblem.from_dict(sel.entry["problem"])
                assert distance(problem, near) <= NEAREST_MAX and sel.entry["variant"]["form"] == "convbw"
            if sel.variant.plan is not None:
                assert sel.variant.plan.target == "host"
                check_plan(problem, sel.variant.plan)  # what compile_op checks before compiling


def test_the_shipped_sm90a_database_carries_cudnns_time_and_select_serves_its_problems_exactly():
    """The zoo tuned on the H100 (bench/results/h100_2026-12-06_zootune2, zootune7b and zootune8: 1,165
    problem-types): read by select; a merge never ships fewer."""
    from convbw_mlir.dispatch.select import SHIPPED, databases, select

    path = SHIPPED / "nvidia-h100-80gb-hbm3.sm_90a.json"
    db = TuningDB.parse(path.read_bytes(), str(path), strict=True)
    assert db.target == "sm_90a" and len(db.entries) >= 1165
    assert sum("cudnn_s" in e for e in db.entries.values()) >= 0.9 * len(db.entries)
    assert any(d.device == db.device for d in databases("sm_90a"))
    for entry in list(db.entries.values())[:5]:
        problem = ConvBwdWeightProblem.from_dict(entry["problem"])
        sel = select(problem, "sm_90a")
        assert sel.path == "exact" and sel.variant == Variant.from_dict(entry["variant"]), (problem.name, sel)


def test_the_shipped_sm90a_learned_selector_chooses_among_the_candidates_where_no_entry_holds_the_problem():
    """Installed by the written rule (docs/dispatch.md#zoo-sm90a): it beat nearest-neighbour and the heuristic on the
    102 held-out problems of bench/results/h100_2026-12-06_zootune2; trained on the tuned models only."""
    from convbw_mlir.dispatch.select import learned_selector

    selector = learned_selector("sm_90a")
    assert selector is not None and selector.meta["device"] == "NVIDIA H100 80GB HBM3"
    assert selector.meta["problems"] == 498 and learned_selector("sm_80") is None
    problem = ConvBwdWeightProblem.from_ck("2 1 32 120 120 3 3 28 28 1 1 1 1 1 1 1 1")  # in no database
    sel = select(problem, "sm_90a")
    assert sel.path == "learned" and sel.variant.plan.decision.rule == "learned"
    assert sel.variant.options in {v.options for v in candidates(problem, "sm_90a", iree=False)}
    check_plan(problem, sel.variant.plan)
    assert select(problem, "sm_90a", selector=False).path != "learned"
