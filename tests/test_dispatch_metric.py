"""The tuner ranks by GPU kernel time where every contender has it; a kernel-time entry replaces a call-time one."""

from __future__ import annotations

import json

from convbw_mlir.dispatch import TuningDB, heuristic
from convbw_mlir.dispatch.tune import _decide, build_database, device_noise
from convbw_mlir.measure.cupti import gpu_activities
from convbw_mlir.problem import ConvBwdWeightProblem

P = ConvBwdWeightProblem.from_ck("2 1 256 64 64 3 3 56 56 1 1 1 1 1 1 1 1")


def _row(heur: dict, explicit: dict, pass2: dict | None = None) -> dict:
    return {"name": "p", "problem": P.to_dict(), "heuristic": "convbw[heuristic]",
            "variants": {}, "contenders": {"convbw[heuristic]": {"status": "ok", **heur},
                                           "convbw[strategy=explicit]": {"status": "ok", **explicit}},
            "pass2": pass2 or {}}  # fmt: skip


def test_kernel_time_decides_where_the_call_time_is_the_runtimes_own():
    # Through IREE's runtime both calls take ~75 µs; on the GPU the explicit kernel takes 12 µs, not 40.
    row = _row({"median_s": 74e-6, "kernel_s": 40e-6}, {"median_s": 75e-6, "kernel_s": 12e-6})
    d = _decide(row)
    assert d["metric"] == "kernel_s" and d["winner"] == "convbw[strategy=explicit]"
    assert d["median_s"] == 12e-6


def test_call_time_decides_when_a_contender_lacks_the_kernel_time():
    row = _row({"median_s": 74e-6, "kernel_s": 40e-6}, {"median_s": 90e-6})
    d = _decide(row)
    assert d["metric"] == "median_s" and d["winner"] == "convbw[heuristic]"


def test_pass_two_and_the_noise_use_the_same_metric():
    pass2 = {"convbw[heuristic]": {"status": "ok", "median_s": 70e-6, "kernel_s": 44e-6},
             "convbw[strategy=explicit]": {"status": "ok", "median_s": 71e-6, "kernel_s": 12e-6}}  # fmt: skip
    row = _row({"median_s": 74e-6, "kernel_s": 40e-6}, {"median_s": 75e-6, "kernel_s": 12e-6}, pass2)
    assert abs(device_noise({"problems": [row]}) - 0.05) < 1e-9  # (44-40)/40 and 0/12: median 5%
    d = _decide(row)
    assert d["times"]["convbw[heuristic]"] == (40e-6 + 44e-6) / 2


def test_a_kernel_time_entry_replaces_a_call_time_entry_even_if_its_number_is_larger():
    old = TuningDB("NVIDIA H100 80GB HBM3", "sm_80", "3.13.0")
    old.add(P, heuristic(P, "sm_80"), median_s=30e-6)  # the older kind: a call through IREE's runtime
    new = TuningDB("NVIDIA H100 80GB HBM3", "sm_80", "3.13.0")
    new.add(P, heuristic(P, "sm_80"), median_s=35e-6, metric="kernel_s")
    assert old.merge(new) == 1 and old.lookup(P)["metric"] == "kernel_s"
    slower = TuningDB("NVIDIA H100 80GB HBM3", "sm_80", "3.13.0")
    slower.add(P, heuristic(P, "sm_80"), median_s=50e-6, metric="kernel_s")
    assert old.merge(slower) == 0  # same kind: the faster stays


def test_the_database_records_the_metric_it_was_decided_by():
    row = _row({"median_s": 74e-6, "kernel_s": 40e-6}, {"median_s": 75e-6, "kernel_s": 12e-6})
    row["variants"] = {"convbw[heuristic]": heuristic(P, "sm_80").to_dict()}
    row["contenders"].pop("convbw[strategy=explicit]")
    db = build_database({"device": "d", "target": "sm_80", "iree_version": "3.13.0", "date": "x", "problems": [row]})
    assert db.lookup(P)["metric"] == "kernel_s"


def test_gpu_activities_reads_kernels_memsets_and_copies_from_a_chrome_trace(tmp_path):
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps({"traceEvents": [
        {"cat": "kernel", "ts": 20, "dur": 5, "name": "k2"}, {"cat": "kernel", "ts": 10, "dur": 3, "name": "k1"},
        {"cat": "gpu_memset", "ts": 1, "dur": 1, "name": "Memset"}, {"cat": "cpu_op", "ts": 2, "dur": 9},
        {"cat": "gpu_memcpy", "ts": 30, "dur": 2, "name": "Memcpy DtoH"}]}))  # fmt: skip
    assert [a[3] for a in gpu_activities(trace)] == ["Memset", "k1", "k2", "Memcpy DtoH"]


# -- cuDNN beside the candidates (issue 39 item 3) ----------------------------------------------------------
def test_cudnn_is_recorded_in_the_database_entry_and_never_wins_even_when_fastest():
    row = _row({"median_s": 74e-6, "kernel_s": 40e-6}, {"median_s": 75e-6, "kernel_s": 12e-6})
    row["contenders"]["cudnn"] = {"status": "ok", "median_s": 30e-6, "kernel_s": 9e-6}
    row["variants"] = {"convbw[heuristic]": heuristic(P, "sm_80").to_dict(),
                       "convbw[strategy=explicit]": heuristic(P, "sm_80").to_dict() | {"label": "x"}}  # fmt: skip
    d = _decide(row)
    assert d["winner"] == "convbw[strategy=explicit]" and d["cudnn_s"] == 9e-6
    db = build_database({"device": "d", "target": "sm_80", "iree_version": "3.13.0", "date": "x", "problems": [row]})
    entry = db.lookup(P)
    assert entry["cudnn_s"] == 9e-6 and entry["median_s"] == 12e-6
    assert TuningDB.parse(db.to_json()).lookup(P)["cudnn_s"] == 9e-6  # a shipped file keeps it


def test_a_cudnn_without_kernel_time_leaves_the_candidates_metric_and_the_entry_without_its_time():
    row = _row({"median_s": 74e-6, "kernel_s": 40e-6}, {"median_s": 75e-6, "kernel_s": 12e-6})
    row["contenders"]["cudnn"] = {"status": "ok", "median_s": 30e-6}
    d = _decide(row)
    assert d["metric"] == "kernel_s" and d["cudnn_s"] is None
    row["contenders"]["cudnn"] = {"status": "WRONG", "median_s": 1e-6, "kernel_s": 1e-6}
    assert _decide(row)["cudnn_s"] is None  # a wrong cuDNN result has no time to compare with


def test_a_bad_cudnn_time_in_a_database_entry_is_named():
    import pytest

    db = TuningDB("d", "sm_80", "3.13.0")
    with pytest.raises(ValueError, match="cudnn_s: expected a positive number of seconds, got -1"):
        db.add(P, heuristic(P, "sm_80"), median_s=1e-5, cudnn_s=-1)


def test_tuning_asks_the_server_for_cudnn_in_its_first_pass(monkeypatch, tmp_path):
    """cuDNN is timed beside the candidates in pass 1 (pass 2 re-times close candidates only)."""
    from convbw_mlir.dispatch import tune
    from convbw_mlir.measure import server

    seen = []

    class Served:
        def __init__(self, folder, entries, options, *args, **kwargs):
            seen.append(options["use_torch"])
            self.entries = entries

        def __iter__(self):
            return iter(())

        def summary(self):
            return {}

    monkeypatch.setattr(server, "Served", Served)
    payloads = [{"entry": None, "held": False, "timeout_s": 1.0, "cudnn": True}]
    slots = [type("S", (), {"driver": "cuda"})()]
    run = tune._Run(tmp_path, tmp_path / "r.json", slots, print, 1.0, True, {"server": []}, None)
    assert list(tune._served_phase(run, payloads)) == []
    assert seen == [True]


def test_a_tuning_build_passes_its_compile_time_limit_to_every_variant(monkeypatch, tmp_path):
    """IREE's codegen of a 3-D layer can compile for ten minutes: a zoo slice caps each candidate's compile."""
    from convbw_mlir.dispatch import build
    from convbw_mlir.dispatch.tune import compile_candidates

    seen = []

    def fake_build_one(problem, target, variant, cache, timeout):
        seen.append(timeout)
        return build.BuildResult(problem, variant, error="not built here")

    monkeypatch.setattr(build, "build_one", fake_build_one)
    monkeypatch.setattr("convbw_mlir.dispatch.tune.reference_task", lambda p, k, t: ({"ok": False, "error": "x"}, {}))
    compile_candidates([("p", P, False)], "sm_80", tmp_path / "out", max_workers=1, max_plans=1, cache=tmp_path / "c",
                       progress=False, log=lambda _: None, iree=False, timeout=7.0)  # fmt: skip
    assert seen and set(seen) == {7.0}
