"""The explicit-kernel bench scripts (bench/explicit_{gemm,conv,streamk,wavespec}.py) share one harness
(bench/harness.py): its command line (one-line errors), its ``report`` dispatch, its child-process runner."""

from __future__ import annotations

import importlib
import json
import sys
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
SCRIPTS = ("explicit_gemm", "explicit_conv", "explicit_streamk", "explicit_wavespec")


@pytest.fixture
def bench(monkeypatch):
    """Import a bench script (or the harness) as running it does: bench/ first on sys.path."""
    monkeypatch.syspath_prepend(str(BENCH))
    return importlib.import_module


@pytest.mark.parametrize("script", SCRIPTS)
def test_each_script_takes_the_harness_command_line_a_bad_option_is_one_line(bench, script, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        bench(script).main(["run", str(tmp_path), "--out", str(tmp_path), "--bogus", "1"])
    assert e.value.code == 1
    assert capsys.readouterr().err == f"{script}.py: error: unrecognized arguments: --bogus 1\n"
    with pytest.raises(SystemExit) as e:
        bench(script).main(["report", str(tmp_path)])
    assert e.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith(f"{script}.py report: error: the following arguments are required: rows")
    assert err.count("\n") == 1


def _report(bench, script: str, tmp_path: Path, manifest: dict, rows: list[dict]) -> dict:
    (tmp_path / "art").mkdir()
    (tmp_path / "art" / "manifest.json").write_text(json.dumps(manifest))
    (tmp_path / "rows.json").write_text(json.dumps(rows))
    argv = ["report", str(tmp_path / "art"), str(tmp_path / "rows.json"), "--out", str(tmp_path / "out"),
            "--device", "cpu", "--date", "today"]  # fmt: skip
    assert bench(script).main(argv) == 0
    assert (tmp_path / "out" / f"{script}.md").read_text().count("today") == 1
    return json.loads((tmp_path / "out" / f"{script}.json").read_text())


def _row(name: str, us: float, **more) -> dict:
    kind, _, problem = name.partition(":")
    return {"name": name, "kind": kind, "problem": problem, "single_us": us, "sustained_us": us, "correct": True,
            **more}  # fmt: skip


def test_gemm_report_through_the_harness_gives_the_gate_ratio(bench, tmp_path):
    rows = [{"name": "ours_gemm4096_f32", "kind": "ours", "single_us": 2.0, "sustained_us": 4.0, "correct": True},
            {"name": "iree_matmul4096_f32", "kind": "iree", "single_us": 6.0, "sustained_us": 4.0, "correct": True},
            _row("ours:p", 1.0), _row("cudnn:p", 2.0)]  # fmt: skip
    doc = _report(bench, "explicit_gemm", tmp_path, {"refused": {}}, rows)
    assert doc["gate_ratio_over_tileandfuse"] == {"single": 3.0, "sustained": 1.0}
    assert doc["conv_geomean_cudnn_over_ours"] == pytest.approx(2.0)


def test_conv_report_through_the_harness_gives_the_cudnn_geomean(bench, tmp_path):
    entries = [{"name": f"{k}:p", "kind": k, "problem": "p", "plan": None, "suite": True} for k in ("ours", "cudnn")]
    doc = _report(bench, "explicit_conv", tmp_path, {"entries": entries, "refused": {}},
                  [_row("ours:p", 1.0), _row("cudnn:p", 4.0)])  # fmt: skip
    assert doc["geomean_cudnn_over_ours_suite"] == pytest.approx(4.0) and doc["suite_problems_timed"] == 1


def test_streamk_report_through_the_harness_gives_the_speedup(bench, tmp_path):
    entries = [{"name": "splitk2_rule:p", "plan": None}]
    manifest = {"entries": entries, "refused": {}, "sms": 132, "tiles": {"p": {"tiles": 4, "k_tiles": 8}}}
    doc = _report(bench, "explicit_streamk", tmp_path, manifest, [_row("splitk2_rule:p", 3.0),
                  _row("streamk_linear:p", 1.5)])  # fmt: skip
    assert doc["geomean_speedup"] == pytest.approx(2.0)


def test_wavespec_report_through_the_harness_gives_plain_over_wave_specialized(bench, tmp_path):
    entries = [{"name": f"{k}:p", "kind": k, "problem": "p", "plan": None} for k in ("plain", "ws44")]
    doc = _report(bench, "explicit_wavespec", tmp_path, {"entries": entries, "refused": {}},
                  [_row("plain:p", 3.0), _row("ws44:p", 1.0)])  # fmt: skip
    assert doc["geomean_plain_over_ws44"] == pytest.approx(3.0) and doc["problems_ws42"] == 0


CHILD = """import json, sys, time
names = sys.argv[3:]  # child.py run-one FOLDER NAMES...
if names[0].startswith("crash"):
    sys.exit("dying")
if names[0].startswith("hang"):
    time.sleep(60)
for n in names:
    print("a line that is no row")
    print(json.dumps({"name": n, "single_us": 1.0}))
"""


def test_run_batches_keeps_rows_names_crashes_stops_a_hung_child_and_skips_past_the_budget(bench, tmp_path):
    harness = bench("harness")
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    out = tmp_path / "out"
    batches = [["ok:a", "ok:b"], ["crash:c"], ["hang:d"]]
    rows = harness.run_batches(str(script), tmp_path, out, batches, jobs=2, child_limit=1.0, seconds="s")
    by = {r["name"]: r for r in rows}
    assert set(by) == {"ok:a", "ok:b", "crash:c", "hang:d"}
    assert by["ok:a"]["single_us"] == 1.0 and "crashed" not in by["ok:b"] and by["ok:a"]["s"] >= 0
    assert by["crash:c"]["crashed"] == "rc 1: dying\n" and by["crash:c"]["problem"] == "c"
    assert by["hang:d"]["crashed"].startswith("rc -9") and by["hang:d"]["kind"] == "hang"
    assert json.loads((out / "rows.json").read_text()) == rows
    late = harness.run_batches(str(script), tmp_path, out, [["ok:e"]], budget=1.0, start=time.time() - 10)
    assert late == [{"name": "ok:e", "kind": "ok", "problem": "e", "skipped": "not started: the 1 s budget ran out"}]


def test_the_scripts_and_harness_import_no_compiler():  # the GPU machine's run side has none
    import subprocess

    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); "
        "import explicit_gemm, explicit_conv, explicit_streamk, explicit_wavespec, harness; "
        "print(sorted(m for m in sys.modules if m.startswith('iree.compiler')))"
    )
    got = subprocess.run([sys.executable, "-c", code, str(BENCH)], capture_output=True, text=True, check=True)
    assert got.stdout.strip() == "[]"
