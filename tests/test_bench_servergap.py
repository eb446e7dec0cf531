"""bench/servergap.py (issue 39's server gap): the table puts each path's runs side by side and its ratios take
only correct contenders, a path's runs averaged."""

from __future__ import annotations

import json

from conftest import bench_script

servergap = bench_script("servergap")


def _run(folder, name: str, path: str, **us: float | str) -> None:
    cont = {k: ({"status": "ok", "kernel_s": v * 1e-6, "median_s": 2 * v * 1e-6, "kernel_launch_us": [v, v, v + 1]}
                if isinstance(v, float) else {"status": v}) for k, v in us.items()}  # fmt: skip
    rows = [{"name": "large", "key": "large.f16", "contenders": cont}]
    doc = {"device": "NVIDIA H100 80GB HBM3", "path": path, "problems": rows}
    (folder / f"{name}.json").write_text(json.dumps(doc))


def test_the_table_compares_each_server_path_with_the_child_runner_over_its_runs(tmp_path):
    _run(tmp_path, "0a", "a", ours80=700.0, cudnn=320.0)
    _run(tmp_path, "1b", "b", ours80=860.0, cudnn="WRONG")
    _run(tmp_path, "2c", "c", ours80=700.0, cudnn=330.0)
    _run(tmp_path, "3c", "c", ours80=720.0, cudnn=330.0)
    text = servergap.table(tmp_path)
    assert text.startswith("# servergap: NVIDIA H100 80GB HBM3")
    assert "| large | ours80 | 700.0 | 860.0 | 700.0 | 720.0 | 0.814 | 0.986 | 700/700/701 |" in text
    assert "| large | cudnn | 320.0 | - | 330.0 | 330.0 | - | 0.970 | 330/330/331 |" in text  # WRONG: in no ratio
    assert "a / b: geomean 0.814 over 1 contenders" in text and "a / c: geomean 0.978 over 2 contenders" in text
    assert "| large | ours80 | 1400.0 | 1720.0 |" in text  # the wall clock's table


def test_the_table_of_a_run_cut_short_before_any_path_says_so(tmp_path):
    assert servergap.table(tmp_path) == "no run finished"


def test_a_run_on_the_h100s_durations_measures_both_server_paths_twice_within_its_budget(tmp_path, monkeypatch):
    """The H100 run of 2026-12-06 (0a 57 s, 1b 15 s, budget 120) skipped 2c on a's 57 s, then crashed on the
    skipped entry (KeyError 's'): the fixed server was never measured."""
    import types

    now = [0.0]
    took = {"a": 56.7, "b": 14.6, "c": 14.6}

    def fake_run(cmd, **_):
        if cmd[0] == "nvidia-smi":
            raise OSError("no nvidia-smi")
        now[0] += took[cmd[4]]  # python, script, measure-one, DIR, PATH, OUT: the path's time passes
        return types.SimpleNamespace(returncode=0)

    monkeypatch.setattr(servergap, "time", types.SimpleNamespace(time=lambda: now[0]))
    monkeypatch.setattr(servergap.subprocess, "run", fake_run)
    monkeypatch.setattr(servergap.subprocess, "Popen", lambda *a, **k: (_ for _ in ()).throw(OSError("none")))
    monkeypatch.setattr(servergap.signal, "signal", lambda *a: None)
    assert servergap.run(tmp_path, tmp_path / "out", budget=120) == 0
    runs = json.loads((tmp_path / "out" / "runs.json").read_text())["runs"]
    assert [r["run"] for r in runs if "s" in r] == ["0a", "1b", "2c", "3c", "4b"]
    assert [r["run"] for r in runs if "skipped" in r] == ["5a"]  # 116 s spent, a takes ~57


def test_a_path_is_expected_to_take_as_long_as_its_kind_took_and_a_skipped_run_breaks_no_estimate():
    # the H100 run of 2026-12-06: 0a 57 s, 1b 15 s; 2c was skipped on a's 57 s, and the next path's estimate crashed
    runs = [{"run": "0a", "s": 56.7}, {"run": "1b", "s": 14.6}, {"run": "2c", "skipped": "71 s spent"}]
    assert servergap.expected_s("c", runs) == 14.6 and servergap.expected_s("b", runs) == 14.6
    assert servergap.expected_s("a", runs) == 56.7
    assert servergap.expected_s("c", runs[:1]) == 56.7  # no server run yet: the longest of any
    assert servergap.expected_s("a", []) == 0.0
