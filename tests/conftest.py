"""Shared fixtures: compiled kernels are cached for the whole session (compiles dominate test time)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from convbw_mlir.problem import ConvBwdWeightProblem

ROOT = Path(__file__).resolve().parents[1]
SUITES = ROOT / "convbw_mlir" / "suites"

_CACHE: dict = {}

# compile_op goes through the kernel cache: tests (and the processes they start) use a private temporary
# one, never the user's ~/.cache (convbw_mlir/dispatch/cache.py).
SESSION_CACHE = tempfile.mkdtemp(prefix="convbw-test-cache-")
os.environ["CONVBW_CACHE_DIR"] = SESSION_CACHE
# The runner's device locks are machine-wide (convbw_mlir/measure/gpu_lock.py): a session's stand-in devices
# get their own, so that test runs side by side never wait on each other's (hanging) kernels.
SESSION_LOCKS = tempfile.mkdtemp(prefix="convbw-test-gpu-locks-")
os.environ["CONVBW_GPU_LOCK_DIR"] = SESSION_LOCKS


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(SESSION_CACHE, ignore_errors=True)  # ~14 MB of kernels a run otherwise left in the temp folder
    shutil.rmtree(SESSION_LOCKS, ignore_errors=True)


def compiled_op(problem: ConvBwdWeightProblem, target: str = "host", **options):
    """compile_op, memoized per (problem, target, options) across the test session."""
    from convbw_mlir import compile_op

    key = (problem, target, tuple(sorted(options.items())))
    if key not in _CACHE:
        _CACHE[key] = compile_op(problem, target, **options)
    return _CACHE[key]


def bench_script(name: str):
    """A script of the top-level ``bench/`` loaded as a module: benchmarks are scripts that use the product,
    not part of it (the product imports none of them)."""
    import importlib.util
    import sys

    path = ROOT / "bench" / f"{name}.py"
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))  # as when run: its sibling modules import
    spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def suite(name: str) -> list[tuple[str, str]]:
    """(name, ckProfiler problem arguments) of convbw_mlir/suites/<name>.tsv."""
    rows = []
    for line in (SUITES / f"{name}.tsv").read_text().splitlines():
        if line.strip():
            label, args = line.split("\t")
            rows.append((label, args))
    return rows


@pytest.fixture(scope="session")
def compiled():
    return compiled_op


@pytest.fixture(scope="session")
def _torch_kernel_folder(tmp_path_factory):
    return tmp_path_factory.mktemp("torch_art")


@pytest.fixture
def torch_switch_off():
    """Every test of the torch switch starts and ends with torch's own convolution_backward and fresh counters."""
    from convbw_mlir import torch as ct

    ct.disable()
    ct.reset_stats()
    yield
    ct.disable()


@pytest.fixture(scope="module")
def torch_artifacts(_torch_kernel_folder):
    """The torch entry's CONVBW_ARTIFACTS for a module's tests: one folder per test run, so the torch tests compile
    a kernel once (the DDP test's processes load them from it too)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("CONVBW_ARTIFACTS", str(_torch_kernel_folder))
    yield
    mp.undo()
