"""CompiledOp.save / load: own files only, atomic replacement, concurrent saves and loads, permissions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from convbw_mlir import files
from convbw_mlir.build.artifact import CompiledOp
from convbw_mlir.problem import ConvBwdWeightProblem
from convbw_mlir.reference import random_inputs

SMALL = ConvBwdWeightProblem(2, 2, 4, 8, (6, 6), (3, 3), pad_low=1, pad_high=1)
# Saves per process in the concurrency test; CONVBW_STRESS_SAVES=400 reproduces the load.
STRESS_SAVES = int(os.environ.get("CONVBW_STRESS_SAVES", "30"))


def fake_op(tag: str) -> CompiledOp:
    """An op whose every file says ``tag`` (no compile: save and load never look inside the vmfb)."""
    return CompiledOp(
        problem=SMALL,
        target="host",
        stages={"convbw": f"// convbw {tag}\n", "linalg": f"// linalg {tag}\n"},
        vmfb=f"vmfb {tag};".encode() * 2000,
        pipeline=tag,
        flags=[f"--tag={tag}"],
    )


def assert_whole(op: CompiledOp) -> str:
    """The tag of ``op``, after checking that all its parts come from the same save."""
    want = fake_op(op.pipeline)
    assert (op.vmfb, op.stages, op.flags) == (want.vmfb, want.stages, want.flags), f"mixed artifact {op.pipeline}"
    return op.pipeline


def listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_save_refuses_a_folder_holding_other_files_and_leaves_them_alone(tmp_path):
    d = tmp_path / "d"
    (d / "sub").mkdir(parents=True)
    (d / "sub" / "data.bin").write_bytes(b"mine")
    (d / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=rf"artifact: {d} holds 'notes.txt', which no save wrote"):
        fake_op("a").save(d)
    assert listing(d) == ["notes.txt", "sub"] and listing(d / "sub") == ["data.bin"]


def test_save_into_the_working_directory_refuses_when_it_holds_files_and_works_when_empty(tmp_path, monkeypatch):
    (tmp_path / "notes.txt").write_text("mine")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"holds 'notes.txt'"):
        fake_op("a").save(".")
    assert listing(tmp_path) == ["notes.txt"]
    (tmp_path / "empty").mkdir()
    monkeypatch.chdir(tmp_path / "empty")
    fake_op("a").save(".")
    assert assert_whole(CompiledOp.load(".")) == "a"


def test_save_refuses_an_op_json_that_no_save_wrote_and_a_path_that_is_a_file(tmp_path):
    (tmp_path / "op.json").write_text('{"model": "resnet"}')
    with pytest.raises(ValueError, match=r"holds 'op.json', which no save wrote"):
        fake_op("a").save(tmp_path)
    assert (tmp_path / "op.json").read_text() == '{"model": "resnet"}'
    (tmp_path / "f").write_text("x")
    with pytest.raises(ValueError, match=r"artifact: .*/f exists and is not a folder"):
        fake_op("a").save(tmp_path / "f")


def test_save_over_an_earlier_save_replaces_it_and_keeps_one_version(tmp_path):
    d = tmp_path / "art" / "op"
    assert fake_op("first").save(d) == d
    fake_op("second").save(d)
    assert assert_whole(CompiledOp.load(d)) == "second"
    names = [n for n in listing(d) if n != files.LOCK_NAME]
    assert len(names) == 2 and names[0] == "op.json" and files.VERSION_RE.fullmatch(names[1])
    assert listing(d / names[1]) == ["convbw.mlir", "kernel.vmfb", "linalg.mlir", "op.json"]
    assert json.loads((d / "op.json").read_text())["files"] == names[1]
    assert assert_whole(CompiledOp.load(d / names[1])) == "second"  # a version folder loads on its own
    assert listing(tmp_path / "art") == ["op"]  # no temporaries beside it


def test_load_reads_the_older_flat_layout_and_save_replaces_it_whole(tmp_path):
    old = fake_op("flat")
    (tmp_path / "kernel.vmfb").write_bytes(old.vmfb)
    for stage, text in old.stages.items():
        (tmp_path / f"{stage}.mlir").write_text(text)
    meta = {
        "problem": SMALL.to_dict(),
        "target": "host",
        "pipeline": "flat",
        "flags": old.flags,
        "stages": ["convbw", "linalg"],
    }
    (tmp_path / "op.json").write_text(json.dumps(meta))
    assert assert_whole(CompiledOp.load(tmp_path)) == "flat"
    fake_op("new").save(tmp_path)
    assert not {"kernel.vmfb", "convbw.mlir", "linalg.mlir"} & set(listing(tmp_path))
    assert assert_whole(CompiledOp.load(tmp_path)) == "new"


def test_a_save_that_fails_before_the_switch_leaves_the_previous_artifact(tmp_path, monkeypatch):
    fake_op("old").save(tmp_path)

    def fail(*args):
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(files.os, "replace", fail)
        with pytest.raises(OSError, match="No space left"):
            fake_op("new").save(tmp_path)
    assert assert_whole(CompiledOp.load(tmp_path)) == "old"
    fake_op("newer").save(tmp_path)  # and the next save removes what the failed one left
    assert len([n for n in listing(tmp_path) if files.VERSION_RE.fullmatch(n)]) == 1
    assert not [n for n in listing(tmp_path) if n.endswith(".tmp")]


def test_saved_folders_and_files_get_the_umask_permissions(tmp_path):
    previous = os.umask(0o027)
    try:
        d = tmp_path / "new" / "op"
        fake_op("a").save(d)
    finally:
        os.umask(previous)
    version = d / json.loads((d / "op.json").read_text())["files"]
    modes = {str(p.relative_to(tmp_path)): p.stat().st_mode & 0o777 for p in (d, version, d / "op.json")}
    modes |= {str(p.relative_to(tmp_path)): p.stat().st_mode & 0o777 for p in version.iterdir()}
    assert modes[str(d.relative_to(tmp_path))] == 0o750 and modes[str(version.relative_to(tmp_path))] == 0o750
    assert {m for name, m in modes.items() if name.endswith((".json", ".mlir", ".vmfb"))} == {0o640}


def test_atomic_directory_gives_the_umask_permissions_and_replaces_an_earlier_output(tmp_path):
    with files.atomic_directory(tmp_path / "out") as tmp:
        (tmp / "stale").write_text("x")
    previous = os.umask(0o022)
    try:
        with files.atomic_directory(tmp_path / "out") as tmp:
            (tmp / "manifest.json").write_text("{}")
    finally:
        os.umask(previous)
    assert (tmp_path / "out").stat().st_mode & 0o777 == 0o755
    assert listing(tmp_path / "out") == [files.OUTPUT_MARK, "manifest.json"] and listing(tmp_path) == ["out"]


def test_load_refuses_a_files_entry_that_leaves_the_folder(tmp_path):
    fake_op("a").save(tmp_path / "d")
    meta = json.loads((tmp_path / "d" / "op.json").read_text())
    (tmp_path / "d" / "op.json").write_text(json.dumps({**meta, "files": "../d"}))
    with pytest.raises(ValueError, match=r"files: expected v-<32 hex>, got '../d'"):
        CompiledOp.load(tmp_path / "d")


def test_load_of_a_missing_version_names_the_missing_file(tmp_path):
    fake_op("a").save(tmp_path)
    version = json.loads((tmp_path / "op.json").read_text())["files"]
    (tmp_path / version / "kernel.vmfb").unlink()
    with pytest.raises(FileNotFoundError, match=rf"artifact: .*{version}/kernel.vmfb does not exist"):
        CompiledOp.load(tmp_path)


def test_load_reads_the_index_again_when_a_save_removed_the_version_it_was_reading(tmp_path):
    fake_op("old").save(tmp_path)
    seen = []

    def read(raw: bytes) -> CompiledOp:
        seen.append(json.loads(raw)["pipeline"])
        if len(seen) == 1:
            fake_op("new").save(tmp_path)  # lands between this reader's index read and its file reads
        return CompiledOp._from_files(tmp_path, raw)

    assert assert_whole(files.read_versioned(tmp_path, "op.json", read)) == "new"
    assert seen == ["old", "new"]


_WORKER = textwrap.dedent("""
    import collections, json, os, sys, time
    sys.path[:0] = [{tests!r}]
    from test_artifacts import assert_whole, fake_op
    from convbw_mlir.build.artifact import CompiledOp
    me, folder, go, saves = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    open(go + "." + me, "w").close()  # ready
    while not os.path.exists(go):
        time.sleep(0.001)
    # A writer saves and loads; the reader ("r") loads until the writers are done.
    actions = ["save", "load"] * saves if me != "r" else iter(lambda: "load", None)
    seen, errors = collections.Counter(), collections.Counter()
    for n, action in enumerate(actions):
        if me == "r" and os.path.exists(go + ".done"):
            break
        try:
            if action == "save":
                fake_op(f"{{me}}-{{n // 2}}").save(folder)
            else:
                seen[assert_whole(CompiledOp.load(folder)).split("-")[0]] += 1
        except Exception as e:
            errors[f"{{action}}: {{type(e).__name__}}: {{e}}"] += 1
    print(json.dumps({{"seen": seen, "errors": errors}}))
""").format(tests=str(Path(__file__).parent))


def test_concurrent_saves_and_loads_all_succeed_and_never_mix(tmp_path):
    folder, go = tmp_path / "op", tmp_path / "go"
    fake_op("first").save(folder)  # so that the reader has something to load from the start

    def start(who: str) -> subprocess.Popen:
        cmd = [sys.executable, "-c", _WORKER, who, str(folder), str(go), str(STRESS_SAVES)]
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    procs = {who: start(who) for who in "abr"}
    deadline = time.monotonic() + 60
    while not all(Path(f"{go}.{who}").exists() for who in procs) and time.monotonic() < deadline:
        time.sleep(0.01)  # all have imported before any starts, so their loops overlap
    go.touch()
    results = {}
    for who in "abr":
        out, err = procs[who].communicate(timeout=300)
        assert procs[who].returncode == 0, err
        results[who] = json.loads(out)
        if who == "b":
            Path(f"{go}.done").touch()
    assert {who: r["errors"] for who, r in results.items()} == {"a": {}, "b": {}, "r": {}}
    assert results["r"]["seen"].get("a") and results["r"]["seen"].get("b"), results  # it saw both writers
    assert assert_whole(CompiledOp.load(folder)).split("-")[1] == str(STRESS_SAVES - 1)  # the last save won
    assert len([n for n in listing(folder) if files.VERSION_RE.fullmatch(n)]) == 1


def test_run_rejects_a_device_that_is_not_an_index():
    op = fake_op("a")  # the check comes before the vmfb is loaded
    x, dy = random_inputs(SMALL)
    with pytest.raises(TypeError, match=r"device: expected a device index \(an int >= 0\) or None, got 'abc'"):
        op.run(x, dy, device="abc")
    with pytest.raises(TypeError, match=r"got True"):
        op.run(x, dy, device=True)
    with pytest.raises(ValueError, match=r"device: expected a device index \(an int >= 0\) or None, got -1"):
        op.run(x, dy, device=-1)


def test_a_real_kernel_saved_over_itself_loads_and_runs_on_device_0(compiled, tmp_path):
    op = compiled(SMALL)
    op.save(tmp_path / "k")
    op.save(tmp_path / "k")
    loaded = CompiledOp.load(tmp_path / "k")
    x, dy = random_inputs(SMALL, seed=4)
    np.testing.assert_array_equal(loaded.run(x, dy, device=np.int64(0)), op.run(x, dy))
