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


def test_conv_report_of_thin_groups_sets_the_merged_form_beside_the_other_two(bench, tmp_path):
    tile = {"m": 64, "n": 128, "k": 64, "subgroups_m": 2, "subgroups_n": 2, "stages": 3, "intrinsic": "mma"}
    plan = {"target": "sm_80", "strategy": "explicit", "gemm": False, "split": {"dim": "r", "k_batch": 4, "chunk": 8},
            "tile": tile, "merge": {"groups": 8}}  # fmt: skip
    entries = [{"name": f"{k}:p", "kind": k, "problem": "p", "plan": plan if k == "merged" else None, "suite": False}
               for k in ("ours", "alt", "merged", "merged_full", "cudnn")]  # fmt: skip
    rows = [_row("ours:p", 300.0), _row("alt:p", 400.0), _row("merged:p", 200.0), _row("merged_full:p", 250.0),
            _row("cudnn:p", 100.0)]  # fmt: skip
    _report(bench, "explicit_conv", tmp_path, {"entries": entries, "refused": {}}, rows)
    md = (tmp_path / "out" / "explicit_conv.md").read_text()
    assert "| p | 8, 64x128x64, 4 | 200.0 | yes | 250.0 | 300.0 | 400.0 | 100.0 | 0.50 | 2.00 | 1.50 |" in md


def test_a_report_reads_a_manifests_plan_as_a_plan_and_names_a_malformed_one(bench):
    from convbw_mlir.plan_data import PlanError

    harness = bench("harness")
    plan = harness.plan_of({"target": "sm_80", "strategy": "iree", "gemm": False})
    assert plan.strategy.value == "iree" and harness.tile_split(plan) is None and harness.plan_of(None) is None
    with pytest.raises(PlanError, match="plan: missing entry 'target'"):
        harness.plan_of({"strategy": "explicit", "tile": {"m": 64}})


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


def test_conv_bench_compiles_1d_3d_and_bf16_problems_when_asked(bench):
    """``compile --ranks 1 3 --types f16 bf16``: the dense 1-D and 3-D suite layers, each in both types."""
    got = bench("explicit_conv").problems(ranks=(1, 3), types=("f16", "bf16"))
    assert {p.rank for p in got.values()} == {1, 3} and "resnet50_3x3_256_n256_14" not in got
    assert got["audio_conv1d_k3_512_l3000_bf16"].dtype == got["audio_conv1d_k3_512_l3000_bf16"].dw_dtype == "bf16"
    assert got["video_r3d_3x3x3_64_8x56"].dtype == "f16" and got["video_r3d_3x3x3_64_8x56"].layout_family.x == "NHWGC"
    assert list(bench("explicit_conv").problems()) == list(bench("explicit_conv").problems(ranks=(2,), types=("f16",)))


@pytest.mark.parametrize("ck", ["1 1 2 4 6 3 11 2 2 1 1", "3 1 2 4 6 3 2 3 4 5 6 2 1 1 1 2 1 1 0 1 1 0 1"])
def test_conv_bench_torch_reference_of_1d_and_3d_is_the_layout2_weight_gradient(bench, ck):
    """The run side's cuDNN call and float64 reference (channels-last seen as NC..., dW back to GK..C) for
    1-D and 3-D entries: on the CPU, against the project's own reference."""
    torch = pytest.importorskip("torch")
    import numpy as np

    from convbw_mlir.problem import ConvBwdWeightProblem as P
    from convbw_mlir.reference import reference

    conv = bench("explicit_conv")
    p = P.from_ck(ck, layout=2).with_(dtype="bf16", dw_dtype="bf16")
    e = conv._entry("p", "cudnn", p, None, True)
    x, dy = conv._inputs(e, torch)
    assert x.dtype == torch.bfloat16 and conv._numpy(x, torch).dtype.name == "bfloat16"
    got = conv._as_gkyxc(e, conv._torch_weight(e, x.double(), dy.double(), torch)).numpy()
    want = reference(p, conv._numpy(x, torch).reshape(p.x_shape), conv._numpy(dy, torch).reshape(p.dy_shape))
    np.testing.assert_allclose(got, want.reshape(got.shape), rtol=1e-9, atol=1e-9)


def test_a_bf16_dw_is_checked_against_its_own_rounding_not_f16s(bench):
    """Rounding dW to bf16 alone costs up to 2^-9 of the largest entry: f16's 2e-3 would fail correct kernels."""
    torch = pytest.importorskip("torch")
    exact = torch.tensor([1.0, 0.5], dtype=torch.float64)
    got = exact + torch.tensor([2.5e-3, 0.0], dtype=torch.float64)
    h = bench("harness")
    assert h.check(got, exact, "bf16", torch)["correct"] and not h.check(got, exact, "f16", torch)["correct"]
