"""convbw tune (build half, timing half, import), convbw cache, convbw select; errors are one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from convbw_mlir.cli import main


def _convbw(*args: str, cache) -> subprocess.CompletedProcess:
    env = dict(os.environ, CONVBW_CACHE_DIR=str(cache))
    return subprocess.run([sys.executable, "-m", "convbw_mlir", *args], capture_output=True, text=True, env=env)


def test_tune_builds_here_times_apart_imports_and_select_then_hits(tmp_path):
    suite = tmp_path / "tiny.tsv"
    suite.write_text("a\t2 1 4 8 8 3 3 8 8 1 1 1 1 1 1 1 1\nb\t2 1 2 8 8 1 1 8 8 1 1 1 1 0 0 0 0\n")
    cache, art = tmp_path / "cache", tmp_path / "art"
    r = _convbw("tune", "--suite", str(suite), "--target", "host", "--compile-only", "--out", str(art), cache=cache)
    assert r.returncode == 0, r.stderr
    assert "| workers |" in r.stdout and "built 2 problems" in r.stdout
    manifest = json.loads((art / "manifest.json").read_text())
    assert [e["held_out"] for e in manifest["problems"]] == [False, False]
    # the timing half needs only the runtime: the runner's method, then a database beside the results
    env = dict(os.environ, CONVBW_CACHE_DIR=str(cache))
    res = tmp_path / "res" / "results.json"
    t = subprocess.run([sys.executable, "-m", "convbw_mlir.dispatch.tune", str(art), "--out", str(res)],
                       capture_output=True, text=True, env=env)  # fmt: skip
    assert t.returncode == 0, t.stderr
    db_file = tmp_path / "res" / "local-task.host.json"
    assert json.loads(db_file.read_text())["kind"] == "convbw-mlir tuning database"
    assert "| problem | split | winner |" in (tmp_path / "res" / "results.md").read_text()
    r = _convbw("tune", "--import", str(db_file), cache=cache)
    assert r.returncode == 0 and "imported 2 entries" in r.stdout, r.stderr
    r = _convbw("select", "--ck", "2 1 4 8 8 3 3 8 8 1 1 1 1 1 1 1 1", "--target", "host", cache=cache)
    assert r.returncode == 0 and "path: exact (tuned on local-task" in r.stdout, r.stderr
    r = _convbw("select", "--ck", "2 1 4 8 8 3 3 8 8 1 1 1 1 1 1 1 1", "--target", "sm_80", cache=cache)
    assert "path: heuristic" in r.stdout


def test_cache_info_and_clear(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CONVBW_CACHE_DIR", str(tmp_path))
    assert main(["cache", "info"]) == 0
    assert f"cache: {tmp_path}\nentries: 0" in capsys.readouterr().out
    assert main(["cache", "clear"]) == 0 and "removed 0 entries" in capsys.readouterr().out


@pytest.mark.parametrize(
    "args, message",
    [
        (["select", "--ck", "2 1 4 8 8 3 3 8 8 1 1 1 1 1 1 1 1", "--target", "gfx9999"], "--target"),
        (["tune", "--target", "host", "--out", "x"], "no problems"),
        (["tune", "--suite", "seeds", "--types", "f8", "--out", "x"], "--types: unknown element type 'f8'"),
        (["cache", "wipe"], "invalid choice"),
    ],
)
def test_bad_input_is_one_line_and_exit_1(args, message, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("CONVBW_CACHE_DIR", str(tmp_path))
    assert main(args) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_importing_a_malformed_database_is_one_error(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CONVBW_CACHE_DIR", str(tmp_path))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"kind": "convbw-mlir tuning database", "format": 1}))
    assert main(["tune", "--import", str(bad)]) == 1
    assert "missing field 'device'" in capsys.readouterr().err
    assert not (tmp_path / "tuning").exists() or not any((tmp_path / "tuning").iterdir())


def test_tune_help_says_kernels_are_code():
    r = subprocess.run([sys.executable, "-m", "convbw_mlir", "tune", "--help"], capture_output=True, text=True)
    assert "native code" in r.stdout and "trusted source" in r.stdout
