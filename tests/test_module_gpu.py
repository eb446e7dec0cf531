"""bench/module_gpu.py end to end on the host: the tiny ResNet's training step and its weight gradients alone, compiled
with our passes and by IREE alone, run through IREE's runtime (local-task), checked against float64 autograd."""

from __future__ import annotations

import json

import pytest
from conftest import bench_script

pytest.importorskip("torch", reason="the step is a torch export and the reference torch's autograd")


def test_the_gpu_bench_compiles_runs_and_checks_a_tiny_step_on_the_host(tmp_path):
    module_gpu = bench_script("module_gpu")
    meta = module_gpu.compile_all(tmp_path / "dir", "tiny", batch=2, size=16, target="host")
    assert meta["driver"] == "local-task" and len(meta["raised"]["step"]) == len(meta["convs"]) == 6
    report = module_gpu.run_all(tmp_path / "dir", tmp_path / "out", runs=1)
    for kind in ("step", "wgrad"):
        assert report["results"][kind]["correct"], report["results"]
        assert report["results"][f"{kind}_ours"]["worst_error"] < 1e-2
    assert json.loads((tmp_path / "out" / "module_gpu.json").read_text())["results"]["step"]["correct"]
    assert "| training step (whole) |" in (tmp_path / "out" / "module_gpu.md").read_text()


def test_the_gpu_bench_names_an_unknown_model():
    module_gpu = bench_script("module_gpu")
    with pytest.raises(ValueError, match="--model: expected one of resnet18, tiny, got 'vgg'"):
        module_gpu.build("vgg", 0, None)
