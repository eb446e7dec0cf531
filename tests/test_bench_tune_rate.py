"""bench/tune_rate.py phases: a tuning run's rate and its steps from results.json files (fabricated, no GPU)."""

import importlib.util
import json
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "tune_rate", Path(__file__).resolve().parents[1] / "bench" / "tune_rate.py"
)
tune_rate = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tune_rate)


def _results(tmp_path: Path, name: str, starts: list[float], walls: list[float], deadline_lines: int) -> Path:
    rows = [
        {"key": f"{i:03d}", "device_index": 0,
         "phases": {"measure_s": 2.0 + s, "prep_wait_s": 0.1, "server_start_s": s, "candidates_s": 1.2,
                    "load_s": 0.9, "timing_s": 0.5, "cudnn_check_s": 0.2, "bookkeeping_s": 0.0}}
        for i, s in enumerate(starts)
    ]  # fmt: skip
    server = [{"path": "server", "devices": 1, "wall_s": w, "problems_per_minute": 0.0} for w in walls]
    folder = tmp_path / name
    folder.mkdir()
    (folder / "results.json").write_text(json.dumps({"problems": rows, "server": server}))
    log = [f"deadline: {900 + i}-x.n32.f16 not timed" for i in range(deadline_lines)] + ["wrote results.json"]
    (folder / "log.txt").write_text("\n".join(log) + "\n")
    return folder / "results.json"


def test_phases_rate_is_the_problems_over_every_passs_wall_and_counts_the_deadline_cut(tmp_path, capsys):
    a = _results(tmp_path, "g01", [6.0, 0.0, 0.0, 0.0], [10.0, 2.0], deadline_lines=0)
    b = _results(tmp_path, "g02", [4.0, 0.0], [5.0, 1.0], deadline_lines=3)
    got = tune_rate.tuner_rate(json.loads(a.read_text()))
    assert got["wall_s"] == 12.0 and got["problems_per_minute_per_gpu"] == 20.0  # 4 problems in 12 s
    assert got["steady"]["wall_s"] == 6.0 and got["steady"]["problems_per_minute_per_gpu"] == 40.0  # less 6 s start
    assert got["phases"]["load_s"]["sum"] == pytest.approx(3.6)
    out = tmp_path / "phases.json"
    assert tune_rate.main(["phases", str(a), str(b), "--out", str(out)]) == 0
    table = capsys.readouterr().out
    assert "| **all** | 6 | 3 | 18.0 |" in table and "**20.0**" in table  # 6 problems in 18 s; g02's 3 cut
    assert "measure_s: server_start 45%, candidates 33%" in table  # of pass 1's 22 s, the largest first
    assert json.loads(out.read_text())["all"]["cut"] == 3


def test_phases_refuses_a_results_file_without_server_runs(tmp_path, capsys):
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"problems": [{"key": "a"}]}))
    assert tune_rate.main(["phases", str(path)]) == 1
    assert "no 'server' record" in capsys.readouterr().err


def test_pass2_effect_bands_problems_by_pass1s_gap_and_counts_winners_pass2_changed():
    def row(first_us: float, second_us: float, again: tuple[float, float]) -> dict:
        ok = lambda t: {"status": "ok", "median_s": t * 1e-5, "kernel_s": t * 1e-6}  # noqa: E731
        return {"contenders": {"a": ok(first_us), "b": ok(second_us), "cudnn": ok(0.1)},
                "pass2": {"a": ok(again[0]), "b": ok(again[1])}}  # fmt: skip

    rows = [row(10.0, 10.05, (10.4, 10.0)),  # 0.5% apart, pass 2 turns it round: mean a 10.2, b 10.025
            row(10.0, 10.8, (10.0, 10.8)),  # 8% apart, kept
            row(10.0, 13.0, (10.0, 13.0)),  # 30%: outside every band
            {"contenders": row(1, 2, (1, 2))["contenders"]}]  # never re-timed  # fmt: skip
    bands = {tuple(b["gap"]): b for b in tune_rate.pass2_effect(rows)}
    first, eight = bands[(0.0, 0.01)], bands[(0.05, 0.10)]
    assert (first["retimed"], first["changed"], eight["retimed"], eight["changed"]) == (1, 1, 1, 0)
    assert first["max_loss"] == pytest.approx(10.2 / 10.025 - 1) and eight["max_loss"] == 0.0
    assert sum(b["retimed"] for b in bands.values()) == 2
