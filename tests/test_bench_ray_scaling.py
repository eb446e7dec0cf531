"""bench/ray_scaling.py's model and report on synthetic measurements (its measurement runs at a quiet moment)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture
def scaling(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    sys.modules.pop("ray_scaling", None)
    return importlib.import_module("ray_scaling")


def _data(wall: dict, task_s: float = 2.0, kernels: int = 40) -> dict:
    runs = [{"engine": e, "workers": w, "kernels": kernels, "built": kernels, "wall_s": wall[(e, w)],
             "ray_start_s": 5.0 if e == "ray" else 0.0, "task_s": [task_s] * kernels, "vmfb_bytes": [50_000] * kernels,
             "processes": w} for e, w in (("local", 1), ("local", 2), ("ray", 1), ("ray", 2))]  # fmt: skip
    return {"runs": runs, "ray_empty_task_s": 0.002, "target": "sm_80", "max_plans": 2, "problems": ["a"] * 10,
            "host": "box (2 CPUs)", "date": "2026-11-25"}  # fmt: skip


def test_the_model_divides_compute_over_machines_until_the_drivers_link_bounds_it(scaling):
    one = scaling.estimate(1000, 2.0, 0.0, 0.0, 50_000, machines=1, cpus=2)
    assert one == pytest.approx(1000 * 2.0 / 2)
    assert scaling.estimate(1000, 2.0, 0.0, 0.0, 50_000, machines=10, cpus=2) == pytest.approx(one / 10)
    # 1000 artifacts of 1.25 GB through a 1.25 GB/s link: 1000 s, whatever the machines
    assert scaling.estimate(1000, 2.0, 0.0, 3.0, 1.25e9, machines=64, cpus=2) == pytest.approx(3.0 + 1000)
    # Ray's overhead a task adds to each task; a machine's second CPU at efficiency 0.9 gives 0.9 of the first
    assert scaling.estimate(100, 1.0, 0.5, 0.0, 0, machines=1, cpus=2, efficiency=0.9) == pytest.approx(150 / 1.8)


def test_the_summary_takes_task_cost_uncontended_and_efficiency_from_rays_speedup(scaling):
    data = _data({("local", 1): 80.0, ("local", 2): 42.0, ("ray", 1): 82.0, ("ray", 2): 45.0})
    s = scaling.summary(data)
    assert s["task_s"] == 2.0 and s["kernels"] == 40 and s["ray_start_s"] == 5.0
    assert s["local_speedup_2"] == pytest.approx(80 / 42) and s["efficiency"] == pytest.approx(82 / 45 / 2)
    md = scaling.report(data)
    assert "| ray | 2 | 40 | 40 | 45.0 | 0.889 | 1.82x | 2 |" in md
    assert "| 1 | " in md and "| 64 | " in md and "o, Ray's overhead a task (empty tasks): 2.00 ms" in md
