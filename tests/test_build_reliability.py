"""What a hostile new user still broke in the build, cache, artifact and CLI paths (issue 42, items 1, 2, 4, 5
and 9): each test fails on the code before its fix."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from conftest import compiled_op

from convbw_mlir import compile_op
from convbw_mlir.build.artifact import CompiledOp
from convbw_mlir.cli import main
from convbw_mlir.plan import Plan, PlanError, decide
from convbw_mlir.problem import ConvBwdWeightProblem, Epilogue
from convbw_mlir.reference import random_inputs

TINY = ConvBwdWeightProblem.from_ck("1 1 2 4 4 3 8 1 1 0 0")  # compiles for the host in under a second
TINY_CK = "1 1 2 4 4 3 8 1 1 0 0"


# -- item 1: a cache hit's plan has its costs -------------------------------------------------------------
def test_cache_hit_plan_has_the_workspace_and_determinism_of_the_miss(tmp_path):
    miss = compile_op(TINY, "host", cache=tmp_path / "cache")
    hit = compile_op(TINY, "host", cache=tmp_path / "cache")
    assert miss.plan.workspace_bytes is not None and miss.plan.deterministic is not None
    assert (hit.plan.workspace_bytes, hit.plan.deterministic) == (miss.plan.workspace_bytes, miss.plan.deterministic)


def test_convbw_run_prints_its_plan_line_on_a_cache_hit(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CONVBW_CACHE_DIR", str(tmp_path / "cache"))
    lines = []
    for _ in range(2):  # a miss, then a hit
        assert main(["run", "--ck", TINY_CK, "--reps", "1"]) == 0
        lines.append([ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("plan:")])
    assert len(lines[0]) == 1 and lines[1] == lines[0]


# -- item 5: a cache folder that cannot be created is a warning and an uncached compile --------------------
def test_cache_folder_that_cannot_be_created_warns_and_compiles_uncached(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("a user's file\n")
    root = blocker / "cache"  # fails as root too: no folder can be made under a regular file
    with pytest.warns(UserWarning, match=rf"cache: cannot create {root}: Not a directory \(compiling without"):
        op = compile_op(TINY, "host", cache=root)
    assert op.vmfb and op.plan is not None
    assert blocker.read_text() == "a user's file\n" and sorted(tmp_path.iterdir()) == [blocker]


def test_convbw_run_with_a_cache_dir_that_cannot_be_created_warns_and_runs(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("CONVBW_CACHE_DIR", str(blocker / "cache"))
    with pytest.warns(UserWarning, match=r"cache: cannot create .*: Not a directory \(compiling without the cache\)"):
        assert main(["run", "--ck", TINY_CK, "--reps", "1"]) == 0


# -- item 2: a corrupted saved artifact is one error naming the file, never a crash ------------------------
def _saved(tmp_path):
    d = tmp_path / "art"
    compiled_op(TINY).save(d)
    return d, d / json.loads((d / "op.json").read_text())["files"]


@pytest.mark.parametrize("name", ["kernel.vmfb", "linalg.mlir"])
def test_load_refuses_an_artifact_file_with_flipped_bytes_naming_it(tmp_path, name):
    d, version = _saved(tmp_path)
    raw = bytearray((version / name).read_bytes())
    for i in range(len(raw) // 3, len(raw) // 3 + 4):  # a few bytes inside, the size unchanged
        raw[i] ^= 0xA5
    (version / name).write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=rf"^artifact: {re.escape(str(version / name))}: its sha256 differs from"):
        CompiledOp.load(d)


def test_a_saved_artifact_records_the_sha256_of_each_file_and_loads_and_runs(tmp_path):
    d, version = _saved(tmp_path)
    recorded = json.loads((d / "op.json").read_text())["sha256"]
    on_disk = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in version.iterdir() if p.name != "op.json"}
    assert recorded == on_disk and json.loads((version / "op.json").read_text())["sha256"] == recorded
    x, dy = random_inputs(TINY)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_array_equal(CompiledOp.load(d).run(x, dy), compiled_op(TINY).run(x, dy))


def test_an_artifact_saved_before_hashes_loads_unchecked_with_a_warning(tmp_path):
    d, version = _saved(tmp_path)
    for index in (d / "op.json", version / "op.json"):
        meta = json.loads(index.read_text())
        del meta["sha256"]
        index.write_text(json.dumps(meta))
    with pytest.warns(UserWarning, match=r"op.json records no file hashes .*: loaded unchecked; save it again"):
        op = CompiledOp.load(d)
    assert op.vmfb == compiled_op(TINY).vmfb


# -- item 4: an IREE flag value that aborts LLVM never ends the caller ---------------------------------------
def test_a_flag_value_that_aborts_iree_is_a_compile_error_and_the_caller_lives(tmp_path):
    script = textwrap.dedent(f"""
        from convbw_mlir import compile_op
        from convbw_mlir.build.iree import CompileError
        from convbw_mlir.problem import ConvBwdWeightProblem

        p = ConvBwdWeightProblem.from_ck("{TINY_CK}")
        for cache in (False, {str(tmp_path / "cache")!r}):
            try:
                compile_op(p, "host", extra_flags=["--iree-llvmcpu-target-cpu=nonexistentcpu"], cache=cache)
            except CompileError as e:
                print("CompileError:", str(e).splitlines()[0])
        print("alive")
    """)
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    lines = res.stdout.splitlines()
    assert res.returncode == 0 and lines[-1] == "alive", res.stderr[-2000:]
    assert len(lines) == 3 and all(re.match(r"CompileError: IREE crashed \(.*\) compiling .* LLVM ERROR", ln)
                                   for ln in lines[:2]), lines  # fmt: skip


def test_extra_flags_that_are_not_a_list_of_strings_are_refused_naming_the_field():
    for bad in ("--iree-opt-level=O3", [1], 5):
        with pytest.raises(TypeError, match=r"^extra_flags: expected a list of IREE flags \(strings\), got "):
            compile_op(TINY, "host", extra_flags=bad, cache=False)


# -- item 9: signals and messages ---------------------------------------------------------------------------
def _compile_then_signal(tmp_path, sig, group: bool) -> tuple[subprocess.CompletedProcess, list[str]]:
    """``convbw compile`` of a problem not in its (fresh) cache, ``sig`` sent once its compile child starts (to the
    process group with ``group``, as a terminal's Ctrl-C); returns the result and the temporaries left."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp), "CONVBW_CACHE_DIR": str(tmp_path / "cache")}
    cmd = [sys.executable, "-m", "convbw_mlir", "compile", "--ck", TINY_CK, "-o", str(tmp_path / "out.mlir")]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 120
    while not list(tmp.glob("convbw-isolate-*")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    children = [p.name for p in tmp.glob("convbw-isolate-*")]
    assert children, "the compile child never started"
    os.killpg(proc.pid, sig) if group else proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    alive = [p for p in Path("/proc").glob("[0-9]*") if _cmdline_has(p, children[0])]
    assert not alive, "the compile child outlived the command"
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err), [p.name for p in tmp.iterdir()]


def _cmdline_has(proc: Path, text: str) -> bool:
    try:
        return text in (proc / "cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False


def test_sigterm_during_convbw_compile_removes_its_temporaries_and_says_so_in_one_line(tmp_path):
    res, left = _compile_then_signal(tmp_path, signal.SIGTERM, group=False)
    assert (res.returncode, res.stderr, left) == (143, "convbw: terminated\n", [])
    assert not (tmp_path / "out.mlir").exists()


def test_ctrl_c_during_convbw_compile_is_one_line_and_exit_130(tmp_path):
    res, left = _compile_then_signal(tmp_path, signal.SIGINT, group=True)
    assert (res.returncode, res.stderr, left) == (130, "convbw: interrupted\n", [])


MMA = ConvBwdWeightProblem.from_ck("2 1 64 64 64 3 3 28 28 1 1 1 1 1 1 1 1")  # our tile on sm_80


@pytest.mark.parametrize("option", ["stages", "tile_m", "k_batch", "streamk", "merge_groups"])
def test_an_option_past_the_int_range_is_refused_naming_it_not_a_bad_cast(option):
    options = {option: 99999999999999999999}
    if option in ("streamk", "merge_groups"):
        options["strategy"] = "explicit"
    name = option.replace("_", "-")
    with pytest.raises(PlanError, match=rf"^{name}: 99999999999999999999 is past 2147483647 \(2\*\*31 - 1\)"):
        decide(MMA, "sm_80", **options)


def test_a_stored_plan_with_a_field_past_the_int_range_is_refused_naming_it():
    data = decide(MMA, "sm_80", strategy="codegen").to_dict()
    data["tile"]["stages"] = 2**63
    with pytest.raises(PlanError, match=r"^plan\.tile\.stages: 9223372036854775808 is past 2147483647"):
        Plan.from_dict(data)


@pytest.mark.parametrize("target", ["host", "sm_80"])
def test_an_unknown_option_names_the_target_and_the_known_options_not_a_target_repr(target):
    with pytest.raises(ValueError) as e:
        compile_op(TINY, target, cache=False, bogus=1)
    message = str(e.value)
    assert message.startswith(f"options: bogus taken by no pass of the {target} pipeline; known: ")
    assert "Target(" not in message and "k_batch, " in message and "tile_m" in message


def test_fp8_with_too_little_workspace_names_the_bytes_it_needs_not_an_option_never_given():
    fp8 = ConvBwdWeightProblem(groups=1, batch=8, in_channels=64, out_channels=64, input_size=(14, 14),
                               filter_size=(1, 1), dtype="e4m3", dy_dtype="e5m2", layout="channels_last")  # fmt: skip
    least = decide(fp8, "sm_90a").workspace_bytes
    with pytest.raises(ValueError, match=r"^max_workspace_bytes: 10: every plan of .* needs more \(the least: (\d+) "):
        compile_op(fp8, "sm_90a", cache=False, max_workspace_bytes=10)
    assert least > 10


@pytest.mark.parametrize("options", [{}, {"strategy": "explicit"}])
@pytest.mark.parametrize(("target", "layout"), [("sm_80", 2), ("sm_80", 4), ("sm_90a", 2), ("gfx942", 4)])
def test_streamk_with_an_epilogue_names_the_epilogue_as_the_reason(options, target, layout):
    p = MMA.with_(layout=layout, epilogue=Epilogue("scale", 0.5))
    with pytest.raises(PlanError, match=r"^streamk: 'auto' with the scale epilogue \(StreamK writes dW plain"):
        decide(p, target, streamk="auto", **options)
