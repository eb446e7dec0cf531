"""One measuring process per device (convbw_mlir.measure.pool) with CPU stand-ins: two "devices" are two
spawned workers on the host driver. The timing half's results merge in the manifest's order into the
same database, every measured candidate lands in the append-only records, and a candidate that kills its
process or never ends costs only its own result."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from stand_in_kernels import hanging_kernel, segfaulting_kernel

from convbw_mlir.dispatch.tune import _decide, build_database, compile_candidates, records_path, time_candidates
from convbw_mlir.measure import pool
from convbw_mlir.measure.pool import Device, deal, parse_devices, resolve_devices
from convbw_mlir.problem import ConvBwdWeightProblem

TINY = ConvBwdWeightProblem(1, 2, 8, 8, (6, 6), (1, 1))  # a 1x1 convolution: every contender compiles fast
SPLIT = "convbw[k_batch=2]"  # TINY's second candidate on the host, beside the heuristic's plan
HANG_S = 10  # the no-progress limit of a candidate in these runs (as tests/test_bench.py)


@pytest.fixture(scope="module")
def pooled(tmp_path_factory):
    """Four copies of TINY's two candidates (the second held out, the third with a split kernel that
    segfaults, the fourth with one that hangs), timed with two stand-in devices."""
    base = tmp_path_factory.mktemp("pool")
    built = base / "built"
    compile_candidates([("tiny", TINY, False)], "host", built, max_plans=1, progress=False, log=lambda _: None)
    manifest = json.loads((built / "manifest.json").read_text())
    entry = manifest["problems"][0]
    (built / "crash.vmfb").write_bytes(segfaulting_kernel(TINY))
    (built / "hang.vmfb").write_bytes(hanging_kernel(TINY))
    entries = []
    for i, name in enumerate(["a", "b", "crash", "hang"]):
        e = json.loads(json.dumps(entry)) | {"name": name, "key": f"{i:03d}-{name}.f16", "held_out": name == "b"}
        if name in ("crash", "hang"):
            e["contenders"][SPLIT]["vmfb"] = f"{name}.vmfb"
        entries.append(e)
    manifest["problems"] = entries
    (built / "manifest.json").write_text(json.dumps(manifest))
    out = base / "res" / "results.json"
    lines: list[str] = []
    results = time_candidates(built, out, log=lines.append, devices=[0, 1], timeout_s=HANG_S)
    return results, out, lines


def test_two_workers_merge_every_problem_in_manifest_order_into_one_database(pooled):
    results, out, _ = pooled
    rows = results["problems"]
    assert [r["key"] for r in rows] == ["000-a.f16", "002-crash.f16", "003-hang.f16", "001-b.f16"]  # held out last
    assert rows[3]["selected"]["path"] == "exact"  # chosen after the tuned ones came back (they are its problem)
    assert {r["device_index"] for r in rows} == {0, 1}  # both workers measured
    assert json.loads(out.read_text()) == results  # the file holds what was returned
    assert all(_decide(r)["winner"] for r in rows)  # each has a correct winner: the bad kernels cost only themselves
    db = build_database(results)  # the four copies of one problem: one entry, as the merge of today makes it
    assert len(db.entries) == 1 and db.device == "local-task"
    # the records: one line per candidate and pass, with what identifies a measurement
    recs = [json.loads(line) for line in records_path(out).read_text().splitlines()]
    pass1 = {(r["key"], r["contender"]) for r in recs if r["pass"] == 1}
    assert pass1 == {(row["key"], n) for row in rows for n in row["contenders"]}
    assert len(recs) == sum(len(row["contenders"]) + len(row.get("pass2") or {}) for row in rows)
    one = next(r for r in recs if r["verdict"] == "ok")
    assert {"problem", "variant", "target", "iree_version", "product_version", "device", "times"} <= one.keys()
    assert one["target"] == "host" and one["device"] == "local-task" and one["times"]["median_s"] > 0


def test_a_candidate_that_kills_its_process_costs_only_its_result_in_the_pool(pooled):
    results, _, lines = pooled
    crash = results["problems"][1]["contenders"]
    assert crash[SPLIT]["status"] == "crashed" and "SIGSEGV" in crash[SPLIT]["error"]
    assert all(r["status"] == "ok" for n, r in crash.items() if n != SPLIT), crash
    assert any(
        "[local-task:" in line and "SIGSEGV" in line and SPLIT in line for line in lines
    )  # logged with its device


def test_a_candidate_that_never_ends_is_timed_out_and_costs_only_its_result_in_the_pool(pooled):
    results, _, _ = pooled
    hang = results["problems"][2]["contenders"]
    assert hang[SPLIT] == {"status": "crashed", "error": f"no progress for {HANG_S} s (killed)"}
    assert all(r["status"] == "ok" for n, r in hang.items() if n != SPLIT), hang


def _exit_on_two(payload, device, log):
    """A pool task whose worker dies on payload 2 (stands for a worker killed from outside)."""
    if payload == 2:
        os._exit(9)
    log(f"did {payload}")
    return payload * 10, device.index, os.getpid()


def test_a_worker_that_dies_costs_its_payload_and_a_fresh_worker_takes_its_device():
    logged: list[str] = []
    devices = [Device("local-task", 0), Device("local-task", 1)]
    got = dict(deal(_exit_on_two, [0, 1, 2, 3, 4, 5], devices, logged.append, lost=lambda p, why: ("lost", p, why)))
    assert sorted(got) == [0, 1, 2, 3, 4, 5]
    assert got[2][:2] == ("lost", 2) and "died (exit status 9)" in got[2][2]
    assert all(got[i][0] == i * 10 for i in (0, 1, 3, 4, 5))
    assert len({got[i][2] for i in (0, 1, 3, 4, 5)} | {os.getpid()}) >= 3  # spawned workers, not this process
    assert sum("did" in line for line in logged) == 5


def test_one_device_runs_here_in_order_as_before_the_pool():
    got = list(deal(_exit_on_two, [0, 1, 3], [Device("local-task", 0)], lambda _: None))
    assert [(i, v[0], v[2]) for i, v in got] == [(0, 0, os.getpid()), (1, 10, os.getpid()), (2, 30, os.getpid())]


def test_each_gpu_worker_is_pinned_to_its_device_in_the_visible_list(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6,7")
    devs = resolve_devices("cuda", None)  # default: every visible GPU
    assert [d.index for d in devs] == [0, 1, 2]
    assert [d.env["CUDA_VISIBLE_DEVICES"] for d in devs] == ["4", "6", "7"]
    assert devs[0].env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert [d.env for d in resolve_devices("local-task", [0, 1])] == [{}, {}]  # CPU stand-ins: no pinning


def test_no_visible_gpu_or_a_missing_one_is_one_clear_error(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(pool.shutil, "which", lambda _: None)  # no nvidia-smi: no GPU here
    with pytest.raises(ValueError, match=r"^--devices: no cuda GPU is visible here \(asked nvidia-smi\)"):
        resolve_devices("cuda", None)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    with pytest.raises(ValueError, match=r"^--devices: device 2 does not exist: 2 cuda GPU\(s\) visible \(0-1\)$"):
        resolve_devices("cuda", [0, 2])


@pytest.mark.parametrize(
    ("text", "message"),
    [("0,x", "--devices: expected device indexes like 0,1, got '0,x' ('x' is not one)"),
     ("1,1", "--devices: device 1 is given twice in '1,1'"),
     ("-1", "--devices: expected device indexes like 0,1, got '-1' ('-1' is not one)")],
)  # fmt: skip
def test_bad_devices_are_one_error_naming_the_value(text, message):
    with pytest.raises(ValueError) as e:
        parse_devices(text)
    assert str(e.value) == message


def test_the_timing_half_on_a_gpu_target_without_a_gpu_is_one_line_and_exit_1(pooled, tmp_path):
    _, out, _ = pooled
    gpu = tmp_path / "gpu"
    shutil.copytree(out.parent.parent / "built", gpu)
    manifest = json.loads((gpu / "manifest.json").read_text())
    (gpu / "manifest.json").write_text(json.dumps(manifest | {"target": "sm_80"}))
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"} | {
        "PATH": os.path.dirname(sys.executable)
    }
    r = subprocess.run([sys.executable, "-m", "convbw_mlir.dispatch.tune", str(gpu), "--out", str(tmp_path / "r.json")],
                       capture_output=True, text=True, env=env)  # fmt: skip
    assert (
        r.returncode == 1
        and r.stderr == "error: --devices: no cuda GPU is visible here (asked nvidia-smi); time on a machine with one\n"
    )
    assert not (tmp_path / "r.json").exists()


def test_the_multi_gpu_script_compares_two_stand_in_devices_against_one(pooled, tmp_path):
    _, out, _ = pooled
    built = tmp_path / "built"
    shutil.copytree(out.parent.parent / "built", built)
    manifest = json.loads((built / "manifest.json").read_text())
    manifest["problems"] = [e | {"held_out": False} for e in manifest["problems"][:2]]  # the two good copies
    (built / "manifest.json").write_text(json.dumps(manifest))
    script = Path(__file__).resolve().parents[1] / "bench" / "multi_gpu_tune.py"
    r = subprocess.run([sys.executable, str(script), str(built), "--out", str(tmp_path / "mg"), "--devices", "0,1",
                        "--budget", "300"], capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 0, r.stderr
    report = json.loads((tmp_path / "mg" / "multi_gpu.json").read_text())
    assert report["gpus"] == 2 and [len(report["runs"][k]["devices"]) for k in ("all", "one")] == [2, 1]
    assert all(report["runs"][k]["counts"]["problems_with_a_winner"] == 2 for k in ("all", "one"))
    assert report["scaling_ratio"] > 0 and report["winners"]["compared"] == 2
    w = report["winners"]
    assert w["same"] + w["flip_within_noise"] + w["differ"] == 2
    assert "problems / minute" in (tmp_path / "mg" / "multi_gpu.md").read_text()


@pytest.mark.parametrize("module", ["convbw_mlir.dispatch.tune", "convbw_mlir.measure.run"])
def test_both_timing_clis_refuse_bad_devices_in_one_line_before_running(module, pooled, tmp_path):
    _, out, _ = pooled
    res = tmp_path / "r.json"
    r = subprocess.run([sys.executable, "-m", module, str(out.parent.parent / "built"), "--out", str(res),
                        "--devices", "0,0"], capture_output=True, text=True)  # fmt: skip
    assert (r.returncode, r.stderr) == (1, "error: --devices: device 0 is given twice in '0,0'\n")
    assert not res.exists()


def test_convbw_tune_checks_its_devices_before_building(tmp_path, capsys, monkeypatch):
    from convbw_mlir.cli import main

    suite = tmp_path / "one.tsv"
    suite.write_text("a\t2 1 2 8 8 1 1 6 6 1 1 1 1 0 0 0 0\n")
    base = ["tune", "--suite", str(suite), "--out", str(tmp_path / "out")]
    assert main([*base, "--target", "host", "--compile-only", "--devices", "0"]) == 1
    assert capsys.readouterr().err == "convbw: error: --devices: the timing half's; --compile-only times nothing\n"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(pool.shutil, "which", lambda _: None)  # no nvidia-smi: no GPU here
    assert main([*base, "--target", "sm_80"]) == 1  # would build, then find no GPU to time on: refused first
    assert capsys.readouterr().err.startswith("convbw: error: --devices: no cuda GPU is visible here")
    assert not (tmp_path / "out").exists()


def _pid(payload, device, log):
    return payload, device.index, os.getpid()


def test_two_slots_of_one_device_are_two_workers():
    got = dict(deal(_pid, list(range(6)), [Device("local-task", 0)] * 2, lambda _: None))
    assert sorted(got) == list(range(6)) and {v[1] for v in got.values()} == {0}
    assert len({v[2] for v in got.values()} - {os.getpid()}) == 2  # both slots worked, neither here


@pytest.fixture(scope="module")
def tiny_manifest(tmp_path_factory):
    """TINY's candidates on the host, four copies of its problem."""
    built = tmp_path_factory.mktemp("jobs") / "built"
    compile_candidates([("tiny", TINY, False)], "host", built, max_plans=1, progress=False, log=lambda _: None)
    manifest = json.loads((built / "manifest.json").read_text())
    entry = manifest["problems"][0]
    copies = [{"name": f"t{i}", "key": f"{i:03d}-t.f16"} for i in range(4)]
    manifest["problems"] = [json.loads(json.dumps(entry)) | c for c in copies]
    (built / "manifest.json").write_text(json.dumps(manifest))
    return built


def test_jobs_share_one_device_and_give_the_rows_of_one_worker_in_manifest_order(tiny_manifest):
    from convbw_mlir.measure.run import run_manifest

    kw = {"use_torch": False, "log": lambda _: None}
    one = run_manifest(tiny_manifest, **kw)["problems"]
    two = run_manifest(tiny_manifest, jobs=2, **kw)["problems"]
    assert [r["key"] for r in two] == [r["key"] for r in one] == [f"{i:03d}-t.f16" for i in range(4)]
    assert [{n: c["status"] for n, c in r["contenders"].items()} for r in two] == [
        {n: c["status"] for n, c in r["contenders"].items()} for r in one
    ]
    assert all(c["status"] == "ok" for r in two for c in r["contenders"].values())
    assert "device_index" not in two[0]  # one device: the rows as with one worker


@pytest.mark.parametrize("jobs", [0, -1, 1.5])
def test_jobs_below_one_is_one_error_naming_the_value(tiny_manifest, jobs):
    from convbw_mlir.measure.run import run_manifest

    with pytest.raises(ValueError, match=rf"^jobs: expected a count >= 1, got {jobs}$"):
        run_manifest(tiny_manifest, jobs=jobs, use_torch=False)
