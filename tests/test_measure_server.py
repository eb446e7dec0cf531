"""The tuning path of the runner (convbw_mlir.measure.server, ``measure.run --server``) with host kernels: one
persistent process measures a batch of problems; a candidate that kills it costs only its own result (the
server restarts and goes on at the next candidate); a wrong one is WRONG; the rows are the runner's."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from stand_in_kernels import hanging_kernel, segfaulting_kernel, wrong_kernel

from convbw_mlir.dispatch.tune import compile_candidates
from convbw_mlir.measure.run import run_manifest
from convbw_mlir.measure.server import ServerTiming
from convbw_mlir.problem import ConvBwdWeightProblem

TINY = ConvBwdWeightProblem(1, 2, 8, 8, (6, 6), (1, 1))  # a 1x1 convolution: every contender compiles fast
SPLIT = "convbw[k_batch=2]"  # TINY's second candidate on the host, beside the heuristic's plan
COPIES = 6  # problems of the one-process batch
HANG_S = 8  # how long a server may send nothing in the containment run


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """TINY's candidates on the host, and stand-ins of its split candidate that segfault or are wrong."""
    folder = tmp_path_factory.mktemp("server") / "built"
    compile_candidates([("tiny", TINY, False)], "host", folder, max_plans=1, progress=False, log=lambda _: None)
    (folder / "crash.vmfb").write_bytes(segfaulting_kernel(TINY))
    (folder / "wrong.vmfb").write_bytes(wrong_kernel(TINY))
    (folder / "hang.vmfb").write_bytes(hanging_kernel(TINY))
    (folder / "garbage.vmfb").write_bytes(b"not a vmfb")  # its load raises: the server ends after its result
    return folder


def _manifest(folder, names: list[str]) -> None:
    """``folder``'s manifest as copies of its one problem, named ``names``; ``crash``/``wrong`` get the stand-ins."""
    path = folder / "manifest.json"
    manifest = json.loads(path.read_text())
    entry = manifest.setdefault("original", manifest["problems"][0])
    entries = []
    for i, name in enumerate(names):
        e = json.loads(json.dumps(entry)) | {"name": name, "key": f"{i:03d}-{name}.f16", "held_out": name == "held"}
        if name in ("crash", "wrong", "hang", "garbage"):
            e["contenders"][SPLIT]["vmfb"] = f"{name}.vmfb"
        entries.append(e)
    path.write_text(json.dumps(manifest | {"problems": entries}))


@pytest.fixture(scope="module")
def batch(built):
    """COPIES problems through one server, and the same first problem through the child-a-problem runner."""
    _manifest(built, [f"t{i}" for i in range(COPIES)])
    served = run_manifest(built, use_torch=False, log=lambda _: None, server=True)
    classic = run_manifest(built, "000-", use_torch=False, log=lambda _: None)
    return served, classic


def test_a_batch_of_problems_is_measured_by_one_server_process(batch):
    served, _ = batch
    rows = served["problems"]
    assert [r["key"] for r in rows] == [f"{i:03d}-t{i}.f16" for i in range(COPIES)]  # the manifest's order
    assert all(c["status"] == "ok" and c["median_s"] > 0 for r in rows for c in r["contenders"].values())
    assert served["server"]["servers"] == 1 and served["server"]["timing"] == vars(ServerTiming())
    assert served["server"]["problems"] == COPIES and served["server"]["ended"]
    rate = served["server"]["problems_per_minute"]
    n = len(rows[0]["contenders"])
    print(f"\nserver on the host: {COPIES} problems of {n} candidates, {rate:.0f} problems/min")  # a figure, not a test


def test_server_rows_have_the_fields_of_the_runners_rows(batch):
    served, classic = batch
    one, two = served["problems"][0], classic["problems"][0]
    assert one.keys() - {"phases"} == two.keys() and one["contenders"].keys() == two["contenders"].keys()
    for name, c in one["contenders"].items():
        assert c.keys() == two["contenders"][name].keys(), name
    assert one["reference_checked"] == two["reference_checked"]


def test_each_served_problem_records_where_its_time_went(batch):
    served, _ = batch
    rows = served["problems"]
    for i, row in enumerate(rows):
        ph = row["phases"]
        steps = ("inputs_s", "reference_s", "candidates_s", "timing_s", "free_s", "prep_wait_s", "bookkeeping_s")
        assert all(ph[k] >= 0 for k in steps), ph
        assert ph["measure_s"] > 0 and ph["rounds"] == 1
        # each candidate's load (the driver's JIT of PTX lands here on a GPU) is its own figure
        assert ph["load_each_s"].keys() == row["contenders"].keys() and ph["load_s"] > 0
        assert ph["load_s"] + ph["copies_s"] + ph["checked_call_s"] + ph["check_s"] <= ph["candidates_s"]
        assert ph["timing_wall_s"] <= ph["timing_s"]  # the timed region is inside the timing step, not beside it
        assert ("server_start_s" in ph) == (i == 0)  # one server for the batch: its start is the first problem's
    first = rows[0]["phases"]
    # the start's parts (ml_dtypes' import, torch, CUPTI) are inside it; the first problem's inputs hold none of them
    assert first["server_start_s"] >= first["server_imports_s"] + first["server_torch_s"] + first["server_cupti_s"]
    parts = sum(first[k] for k in ("server_start_s", "inputs_s", "reference_s", "candidates_s", "timing_s", "free_s"))
    assert parts + first["bookkeeping_s"] == pytest.approx(first["measure_s"])


@pytest.fixture(scope="module")
def faulty(built, batch):
    """Problems whose split candidate segfaults, is wrong, never ends or does not load, good ones around them."""
    _manifest(built, ["a", "crash", "wrong", "hang", "b", "garbage"])
    lines: list[str] = []
    return run_manifest(built, use_torch=False, log=lines.append, server=True, timeout_s=HANG_S), lines


def test_a_candidate_that_kills_the_server_costs_only_its_result_and_the_server_restarts(faulty):
    results, lines = faulty
    crash = results["problems"][1]["contenders"]
    assert crash[SPLIT]["status"] == "crashed" and "SIGSEGV" in crash[SPLIT]["error"]
    assert all(c["status"] == "ok" and c["median_s"] > 0 for n, c in crash.items() if n != SPLIT), crash
    assert results["server"]["servers"] == 4  # the first, then one after the crash, the hang and the garbage
    assert all(c["status"] == "ok" for r in (results["problems"][0], results["problems"][4])
               for c in r["contenders"].values())  # fmt: skip
    assert any("001-crash.f16" in line and SPLIT in line and "SIGSEGV" in line for line in lines)


def test_a_wrong_candidate_is_marked_wrong_and_not_timed(faulty):
    results, _ = faulty
    wrong = results["problems"][2]["contenders"]
    assert wrong[SPLIT]["status"] == "WRONG" and "median_s" not in wrong[SPLIT]
    assert wrong[SPLIT]["error"].startswith("dw: error ")
    assert all(c["status"] == "ok" for n, c in wrong.items() if n != SPLIT), wrong


def test_a_candidate_that_never_ends_is_killed_and_costs_only_its_result(faulty):
    results, _ = faulty
    hang = results["problems"][3]["contenders"]
    assert hang[SPLIT] == {"status": "crashed", "error": f"no progress for {HANG_S} s (killed)"}
    assert all(c["status"] == "ok" and c["median_s"] > 0 for n, c in hang.items() if n != SPLIT), hang


def test_a_restarted_problems_phases_hold_both_rounds_and_the_new_servers_start(faulty):
    results, _ = faulty
    garbage = results["problems"][5]
    assert garbage["contenders"][SPLIT]["status"] == "failed"
    ph = garbage["phases"]
    # the round that raised (its reference and first candidate) and the new server's round (the rest)
    assert ph["rounds"] == 2 and ph["server_start_s"] > 0 and ph["reference_s"] > 0
    assert set(ph["load_each_s"]) == set(garbage["contenders"]) - {SPLIT}  # the failed load never finished
    assert results["problems"][1]["phases"]["server_start_s"] > 0  # after the segfault: its round lost, not its start


def test_tuning_through_the_server_gives_the_tuners_rows_and_database(built, faulty, tmp_path):
    from convbw_mlir.dispatch.tune import _decide, build_database, records_path, time_candidates

    _manifest(built, ["a", "b", "held"])
    out = tmp_path / "results.json"
    results = time_candidates(built, out, log=lambda _: None, server=True)
    rows = results["problems"]
    assert [r["key"] for r in rows] == ["000-a.f16", "001-b.f16", "002-held.f16"] and rows[2]["held_out"]
    assert rows[2]["selected"]["path"] == "exact" and all(_decide(r)["winner"] for r in rows)
    assert all(c["status"] == "ok" for r in rows for c in r["contenders"].values())
    assert all(set(r.get("pass2") or {}) <= set(r["contenders"]) for r in rows)
    # one server for the whole tuning run: pass 1 of the tuned starts it, pass 2 and the held-out phase reuse it
    assert [s["servers"] for s in results["server"]] == [1] + [0] * (len(results["server"]) - 1)
    assert len(results["server"]) >= 2
    assert rows[0]["phases"]["server_start_s"] > 0 and all("server_start_s" not in r["phases"] for r in rows[1:])
    assert json.loads(out.read_text()) == results and len(build_database(results).entries) == 1
    assert len(records_path(out).read_text().splitlines()) == sum(
        len(r["contenders"]) + len(r.get("pass2") or {}) for r in rows
    )


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [("min_reps", 0, "min_reps: expected a count >= 1, got 0"),
     ("batch_seconds", 0.0, "batch_seconds: expected seconds > 0, got 0.0")],
)  # fmt: skip
def test_a_bad_timing_protocol_is_one_error_naming_the_field(field, value, message):
    with pytest.raises(ValueError) as e:
        ServerTiming(**{field: value})
    assert str(e.value) == message


def test_server_with_several_jobs_is_refused_in_one_line_before_running(built, tmp_path):
    res = tmp_path / "r.json"
    r = subprocess.run([sys.executable, "-m", "convbw_mlir.measure.run", str(built), "--out", str(res), "--server",
                        "--jobs", "2"], capture_output=True, text=True)  # fmt: skip
    assert (r.returncode, r.stderr) == (1, "error: --jobs: with --server: one process a device, got 2\n")
    assert not res.exists()


def test_one_cupti_session_gives_each_candidate_the_gpu_work_of_its_own_range(monkeypatch):
    """On the CPU, torch's own ops stand for kernels: each call's activities land in its name, none in another's."""
    torch = pytest.importorskip("torch")
    from convbw_mlir.measure import cupti

    def ops_as_kernels(trace):  # the trace's aten::mul / aten::add CPU ops, as if they were GPU kernels
        events = json.loads(trace.read_text())["traceEvents"]
        return sorted((e["ts"], e["dur"], "kernel", e["name"]) for e in events
                      if e.get("cat") == "cpu_op" and e.get("name") in ("aten::mul", "aten::add"))  # fmt: skip

    monkeypatch.setattr(cupti, "gpu_activities", ops_as_kernels)
    t = torch.ones(8)
    started: list[str] = []
    calls = {"one": (lambda: torch.mul(t, 2), lambda _: None),
             "two": (lambda: torch.add(torch.add(t, 1), 1), lambda _: None),
             "none": (lambda: t.sum(), lambda _: None)}  # fmt: skip
    got = cupti.kernel_seconds_each(calls, 5, before=started.append)
    assert started == ["one", "two", "none"]
    assert got["one"]["kernel_names"] == ["aten::mul"] and got["one"]["kernels_per_call"] == 1
    assert got["two"]["kernel_names"] == ["aten::add"] and got["two"]["kernels_per_call"] == 2
    assert got["one"]["kernel_s"] > 0 and got["none"] == {
        "kernel_time_error": "CUPTI recorded no GPU kernel in this call's range"
    }


def test_the_rate_script_times_the_server_and_the_runner_on_the_same_problems(built, faulty, tmp_path):
    from pathlib import Path

    _manifest(built, ["a", "b"])
    script = Path(__file__).resolve().parents[1] / "bench" / "tune_rate.py"
    r = subprocess.run([sys.executable, str(script), "run", str(built), "--out", str(tmp_path), "--classic", "1"],
                       capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 0, r.stderr
    report = json.loads((tmp_path / "tune_rate.json").read_text())
    assert report["server"]["problems"] == 2 and report["runner"]["problems"] == 1
    assert report["server"]["counts"] == {"ok": 4} and report["agreement"]["verdicts_differ"] == []
    assert report["server"]["problems_per_minute_per_gpu"] > 0 and report["agreement"]["median_s"]["n"] == 2
    assert "problems a minute a GPU" in (tmp_path / "tune_rate.md").read_text()
    phases = report["server"]["phases"]  # where the server's time went, summed over the problems
    assert phases["problems"] == 2 and phases["load_each"]["n"] == 4 and phases["measure_s"]["sum"] > 0
    assert "where the server's time went" in (tmp_path / "tune_rate.md").read_text()
    steady = report["server"]["steady"]  # the server's first start left out: a tuning run pays it once
    assert (
        0 < steady["first_start_s"]
        and steady["problems_per_minute_per_gpu"] > report["server"]["problems_per_minute_per_gpu"]
    )
    # compare: a run against itself has every kernel time equal and the same rate
    r = subprocess.run([sys.executable, str(script), "compare", str(tmp_path), str(tmp_path), "--out",
                        str(tmp_path / "cmp.json")], capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 0, r.stderr
    cmp = json.loads((tmp_path / "cmp.json").read_text())
    assert cmp["runs"][tmp_path.name]["median_s"] == {"n": 4, "geomean": 1.0, "min": 1.0, "max": 1.0,
                                                      "within_3pct": 4}  # fmt: skip


def _timed_server(timing: ServerTiming, log: list[str]):
    """A server of host calls (``_Server`` without its device): each call logs its candidate's name."""
    import contextlib
    import types

    from convbw_mlir.measure import server

    srv = object.__new__(server._Server)
    srv.timing, srv.cupti, srv.events, srv.phases = timing, True, [], {}
    srv.emit = lambda **ev: srv.events.append(ev)
    srv.lock = types.SimpleNamespace(timing=contextlib.nullcontext, shared=contextlib.nullcontext)

    def timed(name: str):
        return server._Timed(lambda: log.append(name), lambda _: None, {"status": "ok"})

    return srv, {"A": timed("A"), "B": timed("B")}


@pytest.mark.parametrize("kernel_each", [True, False])
def test_each_candidates_kernel_time_follows_its_own_wall_clock_as_the_runners_children_take_it(
    monkeypatch, kernel_each
):
    """Issue 39's server gap: the server now takes a candidate's CUPTI time right after its wall-clock batches, a
    warm call first (cupti.kernel_seconds, as measure.run's children); ``kernel_each=False`` keeps the former order
    (every wall clock, then one session for all), which the GPU pack measures against it."""
    from convbw_mlir.measure import cupti

    log: list[str] = []
    sessions: list[list[str]] = []

    def kernel_seconds(call, sync, calls):
        sync(call())  # the warm call, outside the session
        sessions.append([])
        for _ in range(calls):
            call()
            sessions[-1].append(log[-1])
        return {"kernel_s": 1e-6}

    def kernel_seconds_each(calls, n, before=None):
        sessions.append([])
        for name, (call, _) in calls.items():
            before(name)
            for _ in range(n):
                call()
                sessions[-1].append(name)
        return {name: {"kernel_s": 1e-6} for name in calls}

    monkeypatch.setattr(cupti, "kernel_seconds", kernel_seconds)
    monkeypatch.setattr(cupti, "kernel_seconds_each", kernel_seconds_each)
    timing = ServerTiming(min_reps=2, min_seconds=1e-4, cupti_calls=3, kernel_each=kernel_each)
    srv, ready = _timed_server(timing, log)
    srv._time(ready)
    runs = [name for i, name in enumerate(log) if i == 0 or log[i - 1] != name]  # the candidates' turns, in order
    results = {ev["name"]: ev["result"] for ev in srv.events if ev["event"] == "result"}
    assert all(r["kernel_s"] == 1e-6 and r["n"] >= 2 for r in results.values()) and set(results) == {"A", "B"}
    if kernel_each:  # one turn each: wall clock, warm call, its own session
        assert runs == ["A", "B"] and sessions == [["A"] * 3, ["B"] * 3]
    else:
        assert runs == ["A", "B", "A", "B"] and sessions == [["A"] * 3 + ["B"] * 3]


def test_the_servers_cpu_workers_run_at_the_lowest_priority_unless_asked_not_to():
    """Their numpy float64 references must not take the cores the server's launches need (quiet_host)."""
    import concurrent.futures
    import multiprocessing
    import os

    from convbw_mlir.measure import server

    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=ctx, initializer=server._quiet_worker) as pool:
        assert pool.submit(os.nice, 0).result() == 19
    assert ServerTiming().quiet_host and not ServerTiming(quiet_host=False).quiet_host
    with pytest.raises(TypeError, match="quiet_host: expected True or False, got 1"):
        ServerTiming(quiet_host=1)


def test_kernel_fields_show_overlapping_activities_and_the_spread_of_launches():
    """Summed durations count an overlap twice (a launch that starts before the last ends); the busy time does not.
    The main kernel's launches give min / median / max, a uniform shift (clocks) against a few slow ones."""
    from convbw_mlir.measure.cupti import work_fields

    work = [(0.0, 10.0, "kernel", "main"), (8.0, 4.0, "kernel", "tail"), (20.0, 14.0, "kernel", "main"),
            (40.0, 12.0, "kernel", "main"), (50.0, 1.0, "gpu_memset", "Memset (Device)")]  # fmt: skip
    got = work_fields(work, 2)
    assert got["kernel_s"] == pytest.approx(41e-6 / 2) and got["kernels_per_call"] == 2.5
    assert got["kernel_busy_s"] == pytest.approx((12.0 + 14.0 + 12.0) * 1e-6 / 2)  # 8-10 and 50-51 counted once
    assert got["kernel_launch_us"] == [10.0, 12.0, 14.0] and got["kernel_first_us"] == 10.0
    assert got["kernel_us_each"] == {"Memset (Device)": 0.5, "main": 18.0, "tail": 2.0}  # a call's, by name


def test_a_problems_release_frees_its_cycles_and_keeps_what_survives_out_of_later_collections():
    """The server's free step (measure.server._release): garbage in reference cycles made after a freeze (a
    problem's kernels and buffers) is freed; what survives is frozen, so the next problem's full collection does
    not scan it again."""
    import gc
    import weakref

    from convbw_mlir.measure.server import _release

    class Node:
        pass

    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        cycle, keep = Node(), Node()
        cycle.me = cycle  # freed only by a collection
        dead = weakref.ref(cycle)
        del cycle
        _release()
        assert dead() is None
        assert gc.get_freeze_count() > frozen  # keep (and whatever else survived) is frozen now
        assert keep is not None
    finally:
        gc.unfreeze()


def test_the_steady_rate_leaves_out_each_devices_first_server_start_only():
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "tune_rate", Path(__file__).resolve().parents[1] / "bench" / "tune_rate.py"
    )
    tune_rate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tune_rate)
    rows = [
        {"device_index": 0, "phases": {"server_start_s": 7.0}},
        {"device_index": 1, "phases": {"server_start_s": 9.0}},
        {"device_index": 0, "phases": {"server_start_s": 8.0}},
        {"device_index": 1, "phases": {}},
    ]  # a restart: counted
    served = {"problems": rows, "server": {"devices": 2}}
    got = tune_rate.steady_rate(served, 21.0)
    assert got["first_start_s"] == 9.0 and got["wall_s"] == 12.0 and got["problems_per_minute_per_gpu"] == 10.0
    assert tune_rate.steady_rate({"problems": [{"key": "old"}], "server": {"devices": 1}}, 5.0) is None  # no phases


def test_a_pooled_server_outlives_its_run_and_refuses_a_cudnn_run_it_was_not_started_for(built):
    from convbw_mlir.measure.pool import resolve_devices
    from convbw_mlir.measure.records import ManifestEntry
    from convbw_mlir.measure.run import manifest_entries, read_manifest
    from convbw_mlir.measure.server import Served, ServerPool

    _manifest(built, ["p0", "p1"])
    entries = manifest_entries(read_manifest(built), built)
    assert all(isinstance(e, ManifestEntry) for e in entries)
    slots = resolve_devices("local-task", None)
    options = {"driver": "local-task", "device": None, "use_torch": False, "numpy_max_flops": 0.0, "check_only": False}
    with ServerPool(slots, options, 60.0, log=lambda _: None) as pool:
        first = Served(built, entries[:1], options, slots, 60.0, log=lambda _: None, pool=pool)
        assert [row.contenders[SPLIT]["status"] for _, (row, _) in first] == ["ok"]
        pid = pool.supervisors[0].pids
        second = Served(built, entries[1:], options | {"numpy_max_flops": 1e12}, slots, 60.0, log=lambda _: None,
                        pool=pool)  # fmt: skip
        rows = [row for _, (row, _) in second]
        assert rows[0].contenders[SPLIT]["status"] == "ok" and rows[0].reference.get("reference_checked") == "numpy"
        assert (first.summary()["servers"], second.summary()["servers"], len(pid)) == (1, 0, 1)
        with pytest.raises(ValueError, match="needs servers started with torch"):
            Served(built, entries, options | {"use_torch": True}, slots, 60.0, pool=pool)
    assert pool.supervisors[0].child is None  # closed with the pool


def test_problems_skipped_by_a_deadline_get_no_inputs_made_so_the_run_ends_at_once(built, monkeypatch):
    """Past a deadline every later problem is skipped: none of them has its inputs and references made (zootune7 on
    the H100: the run's end waited minutes for the preparations of the 838 problems its deadline skipped)."""
    import concurrent.futures

    from convbw_mlir.measure import server
    from convbw_mlir.measure.pool import resolve_devices
    from convbw_mlir.measure.run import manifest_entries, read_manifest

    prepared = []

    class Executor(concurrent.futures.ProcessPoolExecutor):
        def submit(self, fn, *args, **kwargs):
            prepared.append(args[1])  # the problem's state folder
            return super().submit(fn, *args, **kwargs)

    monkeypatch.setattr(server.concurrent.futures, "ProcessPoolExecutor", Executor)
    _manifest(built, [f"p{i}" for i in range(12)])
    entries = manifest_entries(read_manifest(built), built)
    slots = resolve_devices("local-task", None)
    options = {"driver": "local-task", "device": None, "use_torch": False, "numpy_max_flops": 0.0, "check_only": False}
    run = server.Served(built, entries, options, slots, 60.0, log=lambda _: None, prep_workers=1,
                        skip=lambda i: i >= 1)  # fmt: skip
    assert [i for i, _ in run] == [0]
    assert len(prepared) <= 2 + server.LOOKAHEAD  # the problem measured and the look-ahead past it, no more


def test_a_run_without_a_pool_measures_through_a_private_pool_whose_server_ends_with_it(built, monkeypatch):
    """``measure.run --server`` (no pool of the caller's) and the tuner share one code path: the servers of a
    :class:`ServerPool`."""
    from pathlib import Path

    from convbw_mlir.measure import server
    from convbw_mlir.measure.pool import resolve_devices
    from convbw_mlir.measure.run import manifest_entries, read_manifest

    made = []

    class Pool(server.ServerPool):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(server, "ServerPool", Pool)
    _manifest(built, ["p0", "p1"])
    entries = manifest_entries(read_manifest(built), built)
    slots = resolve_devices("local-task", None)
    options = {"driver": "local-task", "device": None, "use_torch": False, "numpy_max_flops": 0.0, "check_only": False}
    run = server.Served(built, entries, options, slots, 60.0, log=lambda _: None)
    assert [row.contenders[SPLIT]["status"] for _, (row, _) in run] == ["ok", "ok"]
    [pool] = made
    assert run.supervisors == pool.supervisors and run.summary()["servers"] == 1
    assert pool.supervisors[0].child is None and not Path(pool._logs.name).exists()  # stopped, its logs removed


def _rows_in(out, count: int, wait_s: float, proc) -> list[dict]:
    """The rows of the results file ``out`` once it holds ``count`` (read whole: it is never half-written)."""
    import time

    end = time.monotonic() + wait_s
    while time.monotonic() < end and proc.poll() is None:
        if out.exists() and len(rows := json.loads(out.read_text())["problems"]) >= count:
            return rows
        time.sleep(0.2)
    return json.loads(out.read_text())["problems"] if out.exists() else []


def test_a_tuning_run_killed_after_k_problems_leaves_their_k_rows_in_a_readable_results_file(built, tmp_path):
    """A long run killed by a signal (here SIGKILL, in its third problem's hanging candidate) keeps every problem
    timed so far: their pass-1 rows land in ``out`` and the records as each is timed, before pass 2."""
    import os
    import signal

    from convbw_mlir.dispatch.tune import _decide, database_from_results, records_path, summarize

    _manifest(built, ["a", "b", "hang", "c"])
    out = tmp_path / "results.json"
    with open(tmp_path / "log.txt", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "convbw_mlir.dispatch.tune", str(built), "--out", str(out),
                                 "--server", "--timeout", "600"], stdout=log, stderr=log,
                                start_new_session=True)  # fmt: skip
    try:
        rows = _rows_in(out, 2, 120.0, proc)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the tuner, its server and its CPU workers: nothing is cleaned up
        proc.wait()
    assert [r["key"] for r in rows] == ["000-a.f16", "001-b.f16"], (tmp_path / "log.txt").read_text()[-2000:]
    results = json.loads(out.read_text())  # the file as the kill left it
    assert [r["key"] for r in results["problems"]] == ["000-a.f16", "001-b.f16"]
    assert all("pass2" not in r and c["status"] == "ok" for r in rows for c in r["contenders"].values())
    pass1 = {json.loads(line)["key"] for line in records_path(out).read_text().splitlines()}
    assert pass1 == {"000-a.f16", "001-b.f16"}
    [served] = results["server"]  # pass 1's server run as it stood at the last row: the rate still reads
    assert served["problems"] == 2 and served["wall_s"] > 0 and served["servers"] == 1 and not served["ended"]
    # pass-1-only rows make a database and a summary; a winner awaiting pass 2 says so
    assert len(database_from_results(results, str(out)).entries) == 1
    assert all(("pass 1 only" in _decide(r)["why"]) == bool(r.get("pass2_pending")) for r in rows)
    assert "| a | tuned |" in summarize(results)
