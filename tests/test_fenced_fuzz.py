"""The fenced GPU fuzz (bench/fenced_fuzz.py) rehearsed on the CPU: its problems are valid and reproducible,
its compile side writes a manifest the runner reads, and its report counts what the runner found."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def fuzz():
    spec = importlib.util.spec_from_file_location("fenced_fuzz", ROOT / "bench" / "fenced_fuzz.py")
    module = importlib.util.module_from_spec(spec)
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(ROOT / "bench"))  # its harness.py, as running the script finds it
        spec.loader.exec_module(module)
    return module


def test_the_same_seed_draws_the_same_valid_problems_and_choices(fuzz):
    first, again = fuzz.plan_entries(40, 3, 0.5), fuzz.plan_entries(40, 3, 0.5)
    assert first == again
    assert {e["class"] for e in first} >= {"dense", "thin", "depthwise"}
    assert any(len(e["options"]) == 2 for e in first)  # some carry a second choice of the plan
    explicit = fuzz.plan_entries(10, 3, 1.0, "explicit")
    assert all(o.get("strategy") == "explicit" for e in explicit for n, o in e["options"].items() if n != "convbw")


def test_a_host_rehearsal_compiles_runs_checks_and_counts(fuzz, tmp_path):
    entries = fuzz.plan_entries(3, 7, 1.0)
    entries[0]["options"]["convbw:k_batch=0"] = {"k_batch": 0}  # refused by the plan: recorded, not fatal
    out = fuzz.compile_all(entries, "host", tmp_path / "art", workers=1)
    manifest = json.loads((out / "manifest.json").read_text())
    recs = [r for e in manifest["problems"] for r in e["contenders"].values()]
    assert sum(not r["ok"] for r in recs) == 1 and all("config" in r for r in recs if r["ok"])
    results = fuzz.run_all(out, shards=2, timeout_s=120)
    text = fuzz.report([results])
    ran = sum(r["ok"] for r in recs)
    assert f"contenders: {len(recs)} (correct {ran}, refused / no kernel 1)" in text, text


def test_a_recheck_takes_each_failing_problem_once_and_ours_only_leaves_irees_forms_out(fuzz, tmp_path):
    entries = fuzz.plan_entries(3, 7, 0.0)
    wrong = {"status": "WRONG", "error": "max error"}
    for e in entries:
        e["contenders"] = {"convbw": {"ok": True}, "iree_direct": {"ok": True}}
    runs = []
    for i, keys in enumerate(({0, 1}, {1, 2})):  # problem 1 failed in both runs, problem 2 is another run's
        run = [dict(e, key=e["key"]) for e in entries]
        if i:
            run[2] = dict(run[2], key=run[0]["key"])  # a different problem under the same name
        results = [{"key": e["key"], "contenders": {"convbw": wrong if j in keys else {"status": "ok"}}}
                   for j, e in enumerate(run)]  # fmt: skip
        runs.append((tmp_path / f"m{i}.json", tmp_path / f"r{i}.json"))
        runs[-1][0].write_text(json.dumps({"problems": run}))
        runs[-1][1].write_text(json.dumps({"problems": results}))
    got = fuzz.recheck_entries([m for m, _ in runs], [r for _, r in runs], (), ours_only=True)
    assert len(got) == 3 and len({e["key"] for e in got}) == 3  # problem 1 once; the same name renamed
    assert all(list(e["options"]) == ["convbw"] for e in got)


def test_the_hopper_profile_draws_the_sm90a_kernels_problems_and_ships_their_launch(fuzz, tmp_path):
    from convbw_mlir.plan import decide
    from convbw_mlir.policies import sm90

    entries = fuzz.plan_entries(30, 5, 1.0, "hopper")
    problems = [fuzz.ConvBwdWeightProblem.from_dict(e["problem"]) for e in entries]
    taken = [p for p in problems if sm90.is_sm90(decide(p, "sm_90a"))]
    assert len(taken) >= 15 and {p.rank for p in taken} >= {1, 2, 3}
    assert any(p.epilogue is not None for p in taken) and any(p.layout != problems[0].layout for p in taken)
    first = next(e for e, p in zip(entries, problems) if sm90.is_sm90(decide(p, "sm_90a")) and p.rank == 2)
    (done,) = fuzz._compile_entries([dict(first, options={"convbw": {}})], "sm_90a", str(tmp_path))
    rec = done["contenders"]["convbw"]
    assert (
        rec["config"]["strategy"].startswith("explicit+wgmma") and (tmp_path / rec["launch"] / "launch.json").is_file()
    )
    (tmp_path / "manifest.json").write_text(json.dumps({"target": "sm_90a", "problems": [done]}))
    staged = []  # a shard runs from a folder of its own: the launch must be found from there

    def child(cmd, **_):
        folder = Path(cmd[-1].split("run_manifest(")[1].split(",")[0].strip("'"))
        staged.append(json.loads((folder / "manifest.json").read_text()))

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fuzz.subprocess, "run", child)
        fuzz._run_shard(tmp_path, 0, 1, 10)
    assert (Path(staged[0]["problems"][0]["contenders"]["convbw"]["launch"]) / "launch.json").is_file()


def test_the_thin90_profile_asks_for_the_boxed_form_on_thin_and_medium_groups_it_takes(fuzz):
    from convbw_mlir.plan import decide
    from convbw_mlir.policies import sm90

    entries = fuzz.plan_entries(40, 90, 0.0, "thin90")
    assert entries == fuzz.plan_entries(40, 90, 0.0, "thin90")
    assert {e["class"] for e in entries} == {"thin", "medium"}
    plans = []
    for e in entries:
        p = fuzz.ConvBwdWeightProblem.from_dict(e["problem"])
        ((name, opts),) = e["options"].items()  # the boxed form only: no plan's own choice beside it
        assert name.startswith("convbw:strategy=explicit") and opts["wgmma_merge"] in (1, 2, 4, sm90.merge_for(p))
        plans.append((p, decide(p, "sm_90a", **opts)))  # every draw one the plan takes (none builds nothing)
    assert len(plans) == 40 and all(sm90.is_sm90(plan) and plan.merge is not None for _, plan in plans)
    assert {p.rank for p, _ in plans} == {1, 2, 3} and any(p.groups % sm90.merge_for(p) for p, _ in plans)
    assert not any(sm90.merge_misaligned(p, plan.merge.groups) for p, plan in plans)  # box starts on 16 bytes
