"""The bench scripts that time kernels run one measuring child at a time unless told otherwise (issue 39 item 1,
docs/timing.md): the claims of docs/timing.md's table were measured with their ``--jobs`` defaults of 4 to 12."""

from __future__ import annotations

import pytest
from conftest import bench_script

# (script, its run function that main calls with (dir, out, <budget or classes>, jobs, ...))
TIMING_SCRIPTS = [
    ("explicit_conv", "run_all"),
    ("first_layers", "run_all"),
    ("explicit_wavespec", "run"),
    ("hopper_conv", "run_all"),
    ("classes", "run"),
]


@pytest.mark.parametrize(("script", "runner"), TIMING_SCRIPTS)
def test_timing_scripts_measure_one_child_at_a_time_by_default(script, runner, monkeypatch, tmp_path):
    module = bench_script(script)
    calls = []
    monkeypatch.setattr(module, runner, lambda *args: calls.append(args) or 0)
    assert module.main(["run", str(tmp_path), "--out", str(tmp_path / "out")]) == 0
    assert calls and calls[0][3] == 1, f"{script} run: jobs {calls[0][3] if calls else None} by default"


@pytest.mark.parametrize(("script", "runner"), TIMING_SCRIPTS)
def test_timing_scripts_still_take_jobs_when_asked(script, runner, monkeypatch, tmp_path):
    module = bench_script(script)
    calls = []
    monkeypatch.setattr(module, runner, lambda *args: calls.append(args) or 0)
    module.main(["run", str(tmp_path), "--out", str(tmp_path / "out"), "--jobs", "3"])
    assert calls[0][3] == 3
