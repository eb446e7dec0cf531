"""The benchmark's halves on the CPU: artifacts written and loaded, the runner checking and timing
every contender (and catching a wrong one), the report rebuilt from saved results."""

import json
import shutil

import pytest

from convbw_mlir.bench.artifacts import write_artifacts
from convbw_mlir.bench.report import main as report_main
from convbw_mlir.bench.report import summarize
from convbw_mlir.bench.run import run_manifest
from convbw_mlir.compiler import compile_op
from convbw_mlir.problem import ConvBwdWeightProblem

DENSE = ConvBwdWeightProblem(1, 2, 8, 16, (9, 9), (3, 3), stride=2, pad_low=1, pad_high=1)
GROUPED = ConvBwdWeightProblem(4, 3, 4, 4, (6, 6), (3, 3), pad_low=1, pad_high=1, dtype="bf16")


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    out = tmp_path_factory.mktemp("art") / "host"
    write_artifacts([("dense", DENSE), ("grouped", GROUPED)], "host", out)
    return out


def test_artifacts_hold_every_contender_and_a_manifest(artifacts):
    manifest = json.loads((artifacts / "manifest.json").read_text())
    assert manifest["target"] == "host" and manifest["iree_version"].startswith("3.13")
    dense, grouped = manifest["problems"]
    assert dense["key"] == "dense.f16" and ConvBwdWeightProblem.from_dict(dense["problem"]) == DENSE
    for name in ("convbw", "reference", "iree_direct", "iree_torch", "iree_fusilli"):
        assert dense["contenders"][name]["ok"], name
        assert (artifacts / dense["contenders"][name]["vmfb"]).stat().st_size > 0
    assert dense["contenders"]["convbw"]["config"]["k_batch"] == 1
    # the torch-mlir form needs G=1: recorded as missing, not as a failure of the run
    assert grouped["contenders"]["iree_torch"] == {"ok": False, "error": "no such form for this problem"}
    assert not [p for p in artifacts.parent.iterdir() if p.name.startswith(".")]  # no temporaries left


def test_runner_checks_and_times_every_contender_on_the_host(artifacts):
    results = run_manifest(artifacts, use_torch=False, log=lambda _: None)
    assert [r["key"] for r in results["problems"]] == ["dense.f16", "grouped.bf16"]
    dense = results["problems"][0]
    assert dense["reference_checked"] == "numpy"
    for name in ("convbw", "iree_direct", "iree_torch", "iree_fusilli"):
        r = dense["contenders"][name]
        assert r["status"] == "ok" and r["max_error"] < 2e-3 and r["n"] >= 20 and r["p10_s"] <= r["median_s"]
    assert results["problems"][1]["contenders"]["iree_torch"]["status"] == "no kernel"


def test_runner_reports_a_wrong_kernel_as_wrong(artifacts, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(artifacts, bad)
    # Same shapes, other padding: a kernel that runs fine and computes something else.
    wrong = compile_op(DENSE.with_(pad_low=(2, 0), pad_high=(0, 2)), "host")
    manifest = json.loads((bad / "manifest.json").read_text())
    (bad / manifest["problems"][0]["contenders"]["iree_direct"]["vmfb"]).write_bytes(wrong.vmfb)
    results = run_manifest(bad, filt="dense", use_torch=False, log=lambda _: None)
    r = results["problems"][0]["contenders"]["iree_direct"]
    assert r["status"] == "WRONG" and "max error" in r["error"] and "median_s" not in r


def test_report_rebuilds_table_and_speedups_from_saved_results(artifacts, tmp_path):
    results = run_manifest(artifacts, use_torch=False, log=lambda _: None)
    path = tmp_path / "results.json"
    path.write_text(json.dumps(results))
    assert report_main([str(path)]) == 0
    text = path.with_suffix(".md").read_text()
    assert (
        "| dense.f16 |" in text and "| grouped.bf16 |" in text and "geomean speedup vs the better IREE default" in text
    )
    s = summarize(results)
    ours, base = s["rows"][0][1], s["rows"][0][2]
    assert s["rows"][0][4] == pytest.approx(base / ours)


def test_gpu_reference_of_a_strided_1x1_copies_x_at_the_stride_and_matches_numpy():
    from convbw_mlir.bench.artifacts import build_contender
    from convbw_mlir.compiler import compile_module
    from convbw_mlir.reference import assert_close, random_inputs, reference
    from convbw_mlir.runtime import Kernel

    problem = ConvBwdWeightProblem.from_ck("2 2 3 8 4 1 1 7 7 2 2 1 1 0 0 0 0")  # CK's ck2d_b, smaller
    text, _ = build_contender(problem, "reference", "host")
    assert "util.optimization_barrier" in text  # the subsample copy, its own dispatch
    x, dy = random_inputs(problem, seed=3)
    got = Kernel(compile_module(text, "host"), "local-task").run(x, dy)
    assert_close(problem, got, reference(problem, x, dy))
