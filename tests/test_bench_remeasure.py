"""bench/remeasure.py: the old-against-new table reads the runner's rows; a contender that was not correct (or did
not run) counts in no ratio, and a group left out of the run reads "not measured", never a figure."""

from __future__ import annotations

import json

import pytest
from conftest import bench_script

remeasure = bench_script("remeasure")


def _row(name: str, **us: float | str) -> dict:
    cont = {k: ({"status": "ok", "kernel_s": v * 1e-6, "median_s": 1.0} if isinstance(v, float) else {"status": v})
            for k, v in us.items()}  # fmt: skip
    return {"name": name, "key": f"{name}.f16", "contenders": cont}


def _write(folder, group: str, rows: list[dict]) -> None:
    (folder / f"{group}.json").write_text(json.dumps({"device": "NVIDIA H100 80GB HBM3", "problems": rows}))


def test_ratios_take_kernel_time_and_skip_wrong_or_missing_contenders(tmp_path):
    _write(tmp_path, "dense", [_row("a", ours=10.0, cudnn=5.0), _row("b", ours="WRONG", cudnn=5.0),
                               _row("c", cudnn=8.0), _row("d", ours=20.0, cudnn=40.0)])  # fmt: skip
    res = remeasure.Results(tmp_path)
    got = res.ratios("dense", ["a", "b", "c", "d", "e"], "cudnn", "ours")
    assert got == pytest.approx({"a": 0.5, "d": 2.0})
    assert remeasure._span(got) == "1.00x (0.50-2.00, 2)"
    assert res.device == "NVIDIA H100 80GB HBM3"


def test_summary_counts_correct_contenders_and_unrun_groups_read_not_measured(tmp_path):
    _write(tmp_path, "thin", [_row("a", merged=10.0, onegroup="WRONG", cudnn=12.0)])
    text = remeasure.summary(tmp_path)
    assert "thin: 1 problems, 2/3 ok" in text
    assert "merged 1.20x (1.20-1.20, 1)" in text and "onegroup not measured" in text
    assert remeasure._span({}) == "not measured"
