"""The package's layers are a contract: import-linter's contracts in pyproject.toml (``[tool.importlinter]``)
hold on the package as it installs, a new upward import breaks them naming the modules, and no import
circle joins the product's modules (grimp's graph, function-level imports included).

The package is staged as the wheel lays it out (``dialects/`` and ``passes/`` inside ``convbw_mlir/``): the
editable install maps those folders from elsewhere, which the tools' file walk would not see.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"

# Strongly connected components of the module graph with more than one module (Tarjan), printed one per line.
CYCLES = """
import sys, grimp
graph = grimp.build_graph("convbw_mlir", exclude_type_checking_imports=True)
edges = {m: sorted(graph.find_modules_directly_imported_by(m) & graph.modules) for m in sorted(graph.modules)}
index, low, stack, on, found = {}, {}, [], set(), []
def visit(v):
    index[v] = low[v] = len(index); stack.append(v); on.add(v)
    for w in edges[v]:
        if w not in index:
            visit(w); low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop(); on.discard(w); comp.append(w)
            if w == v: break
        if len(comp) > 1: found.append(sorted(comp))
sys.setrecursionlimit(10000)
for v in edges:
    if v not in index: visit(v)
print(len(edges)); [print(" ".join(c)) for c in found]
"""


def _stage(into: Path) -> Path:
    into.mkdir(parents=True, exist_ok=True)
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info")
    shutil.copytree(ROOT / "convbw_mlir", into / "convbw_mlir", ignore=skip)
    for folder in ("dialects", "passes"):
        shutil.copytree(ROOT / folder, into / "convbw_mlir" / folder, ignore=skip)
    return into


def _env(staged: Path) -> dict:
    import os

    return {**os.environ, "PYTHONPATH": str(staged)}


def _lint(staged: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT_IMPORTS), str(ROOT / "pyproject.toml"), "--no-cache"], cwd=staged,
                          env=_env(staged), capture_output=True, text=True, timeout=300)  # fmt: skip


def _cycles(staged: Path) -> list[str]:
    res = subprocess.run([sys.executable, "-c", CYCLES], cwd=staged, env=_env(staged), capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    count, *cycles = res.stdout.splitlines()
    assert int(count) > 60, res.stdout  # the whole package was seen, dialects and passes included
    return cycles


@pytest.fixture(scope="module")
def staged(tmp_path_factory) -> Path:
    return _stage(tmp_path_factory.mktemp("staged"))


def test_every_layer_contract_holds(staged):
    res = _lint(staged)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert "2 kept, 0 broken" in res.stdout


def test_an_upward_import_breaks_the_layers_naming_both_modules(tmp_path):
    staged = _stage(tmp_path)
    problem = staged / "convbw_mlir" / "problem.py"
    problem.write_text(problem.read_text() + "\n\ndef _upward():\n    from convbw_mlir.dispatch import api\n")
    res = _lint(staged)
    assert res.returncode != 0
    assert "convbw_mlir.problem is not allowed to import convbw_mlir.dispatch" in res.stdout


def test_the_product_imports_no_benchmark(tmp_path):
    staged = _stage(tmp_path)
    run = staged / "convbw_mlir" / "measure" / "run.py"
    run.write_text(run.read_text() + "\n\ndef _bench():\n    import bench.fenced_fuzz\n")
    res = _lint(staged)
    assert res.returncode != 0 and "convbw_mlir.measure.run -> bench" in res.stdout


def test_no_import_circle_joins_the_products_modules(staged):
    assert _cycles(staged) == []


def test_a_seeded_circle_is_found(tmp_path):
    staged = _stage(tmp_path)
    targets = staged / "convbw_mlir" / "targets.py"
    targets.write_text(targets.read_text() + "\n\ndef _circle():\n    from convbw_mlir import limits\n")
    assert _cycles(staged) == ["convbw_mlir.limits convbw_mlir.targets"]
