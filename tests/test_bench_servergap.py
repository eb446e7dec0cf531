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
