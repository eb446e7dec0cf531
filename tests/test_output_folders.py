"""Output folders (--out, --into, --cache-dir): a folder holding anything but an earlier output of ours is
refused naming what is there, a file is refused, an earlier output is replaced atomically; no user file is
ever deleted (issue 21, item 1)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from convbw_mlir import files
from convbw_mlir.cli import main
from convbw_mlir.dispatch.db import TuningDB

ONE = "t\t2 2 2 8 8 1 1 8 8 1 1 1 1 0 0 0 0\n"


@pytest.fixture
def suite(tmp_path: Path) -> Path:
    path = tmp_path / "one.tsv"
    path.write_text(ONE)
    return path


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("command", ["tune", "bench"])
def test_out_refuses_a_folder_holding_user_files_and_keeps_them(command, suite, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CONVBW_CACHE_DIR", str(tmp_path / "cache"))
    work = tmp_path / "mywork"
    (work / "chapters").mkdir(parents=True)
    (work / "thesis.tex").write_text("x")
    (work / "chapters" / "one.tex").write_text("y")
    before = _snapshot(work)
    rc = main([command, "--suite", str(suite), "--target", "host", "--compile-only", "--out", str(work)])
    err = capsys.readouterr().err
    assert rc == 1 and err.count("\n") == 1
    assert f"--out: {work} holds 'chapters', which convbw did not write (1 more such entries)" in err
    assert _snapshot(work) == before and sorted(os.listdir(tmp_path)) == ["mywork", "one.tsv"]


@pytest.mark.parametrize("command", ["tune", "bench"])
def test_out_refuses_a_path_that_is_a_file(command, suite, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CONVBW_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "notes").write_text("mine")
    rc = main([command, "--suite", str(suite), "--target", "host", "--compile-only", "--out", str(tmp_path / "notes")])
    assert (
        rc == 1
        and capsys.readouterr().err == f"convbw: error: --out: {tmp_path / 'notes'} exists and is not a folder\n"
    )
    assert (tmp_path / "notes").read_text() == "mine"


def test_an_earlier_output_is_replaced_whole_and_a_file_added_to_it_is_refused(tmp_path):
    out = tmp_path / "out"
    with files.atomic_directory(out) as tmp:
        (tmp / "manifest.json").write_text("1")
        (tmp / "k.vmfb").write_text("1")
    with files.atomic_directory(out) as tmp:
        (tmp / "manifest.json").write_text("2")
    assert _snapshot(out) == {files.OUTPUT_MARK: b'{"names": ["manifest.json"]}\n', "manifest.json": b"2"}
    (out / "results.json").write_text("measured on the GPU")
    with pytest.raises(ValueError, match=r"--out: .*out holds 'results.json', which convbw did not write"):
        with files.atomic_directory(out) as tmp:
            (tmp / "manifest.json").write_text("3")
    assert (out / "manifest.json").read_text() == "2" and not [p for p in os.listdir(tmp_path) if p != "out"]
    files.record_output(out, "results.json")  # what convbw tune/bench write there after the build
    with files.atomic_directory(out) as tmp:
        (tmp / "manifest.json").write_text("4")
    assert sorted(os.listdir(out)) == [files.OUTPUT_MARK, "manifest.json"]


def test_a_folder_that_changed_during_the_build_is_refused_and_kept(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=r"holds 'late.txt'"):
        with files.atomic_directory(out) as tmp:
            out.mkdir()
            (out / "late.txt").write_text("mine")
            (tmp / "manifest.json").write_text("1")
    assert os.listdir(tmp_path) == ["out"] and os.listdir(out) == ["late.txt"]


def test_into_refuses_a_folder_that_holds_other_files(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CONVBW_CACHE_DIR", str(tmp_path / "cache"))
    src = tmp_path / "db.json"
    TuningDB("local-task", "host", "3.13").save(src)
    home = tmp_path / "home"
    home.mkdir()
    (home / "notes.txt").write_text("mine")
    assert main(["tune", "--import", str(src), "--into", str(home)]) == 1
    assert "--into: " in capsys.readouterr().err and os.listdir(home) == ["notes.txt"]
    assert main(["tune", "--import", str(src), "--into", str(tmp_path / "dbs")]) == 0
    assert main(["tune", "--import", str(src), "--into", str(tmp_path / "dbs")]) == 0  # a database folder: ours
    assert os.listdir(tmp_path / "dbs") == ["local-task.host.json"]
    assert main(["tune", "--import", str(src)]) == 0  # the default: <cache>/tuning, in a tagged cache root
    assert (tmp_path / "cache" / "CACHEDIR.TAG").is_file()
    assert json.loads((tmp_path / "cache" / "tuning" / "local-task.host.json").read_text())["target"] == "host"


def test_the_epilogue_benchmark_refuses_an_out_folder_holding_user_files(suite, tmp_path, capsys):
    from conftest import bench_script

    epilogue_main = bench_script("epilogue").main

    work = tmp_path / "mywork"
    work.mkdir()
    (work / "manifest.json").write_text("my own manifest")
    assert epilogue_main(["compile", "--suite", str(suite), "--target", "host", "--out", str(work)]) == 1
    assert "holds 'manifest.json', which convbw did not write" in capsys.readouterr().err
    assert os.listdir(work) == ["manifest.json"] and (work / "manifest.json").read_text() == "my own manifest"
