"""bench/determinism.py end to end on the CPU (its GPU run is the lead's): a kernel built with its plan's
workspace and IREE's buffers, run in a child process three times, compared bitwise, reported."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"


def test_determinism_bench_builds_runs_and_reports_one_host_kernel(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    monkeypatch.setenv("PYTHONPATH", str(BENCH))  # the compile's child imports the script's module by name
    sys.modules.pop("determinism", None)
    det = importlib.import_module("determinism")
    assert det.compile_side(tmp_path / "art", only="simt-batch-split", target="host") == 0
    (case,) = json.loads((tmp_path / "art" / "manifest.json").read_text())["cases"]
    # the padded copy of x (8 images of 30x30x32 f16) IREE makes on the host: the plan's whole workspace
    assert case["workspace_bytes"] == case["iree_scratch_bytes"] == 8 * 30 * 30 * 32 * 2 and case["workspace_ok"]
    assert det.run_side(tmp_path / "art", tmp_path / "out" / "det", runs=3) == 0
    (row,) = json.loads((tmp_path / "out" / "det.json").read_text())["rows"]
    assert row["status"] == "ok" and row["identical"] and row["distinct_results"] == 1 and row["correct"], row
    md = (tmp_path / "out" / "det.md").read_text()
    assert "1 of 1 kernels that claim determinism gave bitwise identical dW on every run" in md


def test_the_report_counts_a_kernel_whose_runs_differ_against_its_claim(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    det = importlib.import_module("determinism")
    row = {"name": "k", "status": "ok", "claims_deterministic": True, "runs": 10, "identical": False,
           "distinct_results": 3, "max_abs_diff_to_first": 1e-3, "correct": True, "workspace_bytes": 64,
           "iree_scratch_bytes": 128, "device_used_growth_bytes": None}  # fmt: skip
    md = det.report({"target": "sm_80", "device": "H100", "date": "2026-11-25", "rows": [row]})
    assert "0 of 1 kernels that claim determinism gave bitwise identical" in md
    assert "IREE's scratch within the plan's workspace on 0 of 1" in md
