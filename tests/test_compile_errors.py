"""IREE failures become CompileError: in process where IREE reports them, through a child process where
IREE kills the process that compiles (convbw_mlir.build.isolate)."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from convbw_mlir import ConvBwdWeightProblem, compile_op
from convbw_mlir.build.iree import CompileError, compile_module
from convbw_mlir.build.isolate import CompilerCrash, call
from convbw_mlir.reference import assert_close, random_inputs, reference

# 2**62 f16 elements: IREE's stream pass rejects the byte size (2**63 overflows) from its worker
# threads, where a Python diagnostic handler aborted the interpreter ("the GIL is released").
HUGE = "4611686018427387904xf16"
IREE_REJECTS = f"""
func.func @huge(%x: tensor<{HUGE}>) -> tensor<{HUGE}> {{
  %e = tensor.empty() : tensor<{HUGE}>
  %r = linalg.generic {{indexing_maps = [affine_map<(i) -> (i)>, affine_map<(i) -> (i)>],
                        iterator_types = ["parallel"]}}
      ins(%x : tensor<{HUGE}>) outs(%e : tensor<{HUGE}>) {{
  ^bb0(%a: f16, %b: f16):
    %n = arith.negf %a : f16
    linalg.yield %n : f16
  }} -> tensor<{HUGE}>
  return %r : tensor<{HUGE}>
}}
"""
# IREE 3.13 segfaults on an op of an unregistered dialect.
IREE_SEGFAULTS = 'func.func @f() {\n  "foo.bar"() : () -> ()\n  return\n}\n'
SMALL = ConvBwdWeightProblem.from_ck("1 1 2 4 4 3 8 1 1 0 0")


def test_iree_error_in_its_worker_threads_raises_compile_error_and_the_process_lives():
    # In a child: before the fix this aborted the interpreter (exit 134), which would end pytest too.
    code = textwrap.dedent(f"""
        from convbw_mlir.build.iree import CompileError, compile_module
        try:
            compile_module({IREE_REJECTS!r}, "host", source_name="huge.mlir")
        except CompileError as e:
            print("CompileError:", e)
        print("alive")
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    lines = res.stdout.splitlines()
    assert lines[0].startswith("CompileError: huge.mlir:4:8: error: 'stream.async.dispatch' op has invalid Read")
    assert "huge.mlir:2:1: note: called from" in res.stdout  # IREE's notes come along, one a line
    assert lines[-1] == "alive"


def test_iree_error_message_keeps_severity_location_and_text():
    with pytest.raises(CompileError) as e:
        compile_module("func.func @f(%a: i32) -> i32 {\n  return %b : i32\n}\n", "host", source_name="bad.mlir")
    assert str(e.value) == "bad.mlir:2:10: error: use of undeclared SSA value name"


def test_isolated_compile_turns_an_iree_segfault_into_compile_error_naming_the_signal():
    t0 = time.perf_counter()
    with pytest.raises(CompilerCrash) as e:
        call(compile_module, IREE_SEGFAULTS, "host", what="foo.mlir for host")
    assert str(e.value).startswith("IREE crashed (SIGSEGV) compiling foo.mlir for host")
    assert isinstance(e.value, CompileError) and e.value.returncode == -11
    assert time.perf_counter() - t0 < 120


def test_isolated_compile_op_returns_an_op_that_runs_correctly():
    op = compile_op(SMALL, "host", isolate=True)
    assert op.target == "host" and "linalg.generic" in op.stages["linalg"]
    x, dy = random_inputs(SMALL)
    assert_close(SMALL, op.run(x, dy), reference(SMALL, x, dy))
    assert op.stages == compile_op(SMALL, "host").stages  # the same compile, only elsewhere


def test_isolated_compile_op_reraises_the_childs_error_as_is():
    with pytest.raises(ValueError, match="no_such_option"):
        compile_op(SMALL, "host", isolate=True, no_such_option=1)
    with pytest.raises(ValueError, match="target"):
        compile_op(SMALL, "gfx908", isolate=True)


def test_isolated_call_past_its_timeout_is_killed_and_reported():
    t0 = time.perf_counter()
    with pytest.raises(CompilerCrash, match=r"^IREE timed out after 1 s compiling a sleep$") as e:
        call(time.sleep, 60, what="a sleep", timeout=1)
    assert e.value.returncode is None and time.perf_counter() - t0 < 30


@pytest.mark.parametrize(
    "fn, args, message",
    [
        (os._exit, (3,), "IREE crashed (exit 3) compiling x"),
        (os.abort, (), "IREE crashed (SIGABRT) compiling x"),
    ],
)
def test_isolated_call_names_how_the_child_died(fn, args, message):
    with pytest.raises(CompilerCrash) as e:
        call(fn, *args, what="x")
    assert str(e.value) == message


def test_a_child_ended_by_ctrl_c_is_an_interrupt_not_a_compiler_crash():
    # A terminal's Ctrl-C goes to the whole process group; where the child dies of it before the caller sees its
    # own, the caller must still say "interrupted" (exit 130), not "IREE crashed (SIGINT)".
    with pytest.raises(KeyboardInterrupt):
        call(signal.raise_signal, signal.SIGINT, what="x")


def test_isolated_call_rejects_a_non_positive_timeout():
    with pytest.raises(ValueError, match="timeout: must be > 0 seconds, got 0"):
        call(np.zeros, 1, what="x", timeout=0)
    with pytest.raises(ValueError, match="timeout: applies to isolate=True"):
        compile_op(SMALL, "host", timeout=5)


def test_isolated_call_finds_a_function_of_a_module_run_with_python_m(tmp_path):
    # `python bench/isa_matrix.py` hands its own functions over: they live in `__main__` there.
    (tmp_path / "twice_mod.py").write_text(
        "from convbw_mlir.build.isolate import call\n"
        "def twice(x):\n    return 2 * x\n"
        "if __name__ == '__main__':\n    print(call(twice, 21, what='x'))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    res = subprocess.run([sys.executable, "-m", "twice_mod"], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout == "42\n"


def test_isolated_call_finds_a_function_of_a_script_run_by_its_path(tmp_path):
    # `python bench/isa_matrix.py`: the child loads the script by its path (its main does not run again).
    (tmp_path / "helper.py").write_text("FACTOR = 2\n")
    (tmp_path / "twice_script.py").write_text(
        "from convbw_mlir.build.isolate import call\n"
        "import helper\n"
        "def twice(x):\n    return helper.FACTOR * x\n"
        "if __name__ == '__main__':\n    print(call(twice, 21, what='x'))\n"
    )
    res = subprocess.run([sys.executable, str(tmp_path / "twice_script.py")], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path.parent)  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout == "42\n"
