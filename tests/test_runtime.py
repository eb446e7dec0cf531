"""CompiledOp.run input checks, devices, save/load, and the runtime-only import path."""

import ctypes.util
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from convbw_mlir import compile_op
from convbw_mlir.build.artifact import CompiledOp
from convbw_mlir.problem import ConvBwdWeightProblem
from convbw_mlir.reference import assert_close, random_inputs, reference
from convbw_mlir.runtime import DeviceError, open_device, time_calls

SMALL = ConvBwdWeightProblem(2, 2, 4, 8, (6, 6), (3, 3), pad_low=1, pad_high=1)


def test_run_rejects_wrong_shape_and_dtype(compiled):
    op = compiled(SMALL)
    x, dy = random_inputs(SMALL)
    with pytest.raises(ValueError, match=r"x: expected shape \(2, 6, 6, 2, 4\) \(N/H/W/G/C\), got \(2, 6, 6, 2, 5\)"):
        op.run(np.zeros((2, 6, 6, 2, 5), np.float16), dy)
    with pytest.raises(TypeError, match=r"dy: expected dtype float16 \(f16\), got float32"):
        op.run(x, dy.astype(np.float32))
    with pytest.raises(TypeError, match="x: expected a numpy array, got list"):
        op.run(x.tolist(), dy)


def test_unknown_target_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"target: unknown target 'gfx908'; known: host, gfx90a, gfx942"):
        compile_op(SMALL, "gfx908")


@pytest.mark.skipif(bool(ctypes.util.find_library("amdhip64")), reason="an AMD HIP runtime is installed here")
def test_no_amd_device_is_a_clear_error_not_a_crash(compiled):
    with pytest.raises(DeviceError, match=r"device: the hip driver is not usable here \(needs an AMD GPU"):
        open_device("hip")
    op = compiled(ConvBwdWeightProblem.from_ck("2 1 4 64 64 3 3 14 14 1 1 1 1 1 1 1 1"), "gfx942")
    x, dy = random_inputs(op.problem)
    with pytest.raises(DeviceError, match="hip driver"):
        op.run(x, dy)


def test_missing_cuda_device_index_is_a_clear_error():
    try:
        open_device("cuda", 99)
    except DeviceError as e:
        assert "cuda" in str(e)
    else:  # pragma: no cover - only on a machine with 100 GPUs
        pytest.fail("device index 99 opened")


def test_save_and_load_round_trip_runs_the_same_kernel(compiled, tmp_path):
    op = compiled(SMALL)
    out = op.save(tmp_path / "art" / "small")
    version = out / json.loads((out / "op.json").read_text())["files"]  # the layout: tests/test_artifacts.py
    assert sorted(p.name for p in version.iterdir()) == ["convbw.mlir", "kernel.vmfb", "linalg.mlir", "op.json"]
    assert not [p for p in (tmp_path / "art").iterdir() if p.name.startswith(".")]  # no temporaries left
    loaded = CompiledOp.load(out)
    assert loaded.problem == SMALL and loaded.stages == op.stages and loaded.pipeline == op.pipeline
    x, dy = random_inputs(SMALL, seed=3)
    np.testing.assert_array_equal(loaded.run(x, dy), op.run(x, dy))


def test_load_of_a_folder_that_is_no_artifact_names_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="op.json does not exist"):
        CompiledOp.load(tmp_path)
    (tmp_path / "op.json").write_text("{}")
    with pytest.raises(ValueError, match="artifact: .* is malformed"):
        CompiledOp.load(tmp_path)


def test_saved_kernel_loads_and_runs_without_the_iree_compiler(compiled, tmp_path):
    op = compiled(SMALL)
    op.save(tmp_path / "k")
    x, dy = random_inputs(SMALL, seed=5)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "dy.npy", dy)
    np.save(tmp_path / "want.npy", reference(SMALL, x, dy))
    script = textwrap.dedent(f"""
        import sys
        sys.modules["iree.compiler"] = None  # `import iree.compiler` now fails, as on a runtime-only machine
        import numpy as np
        import convbw_mlir
        from convbw_mlir import CompiledOp
        from convbw_mlir.reference import assert_close
        d = {str(tmp_path)!r}
        op = CompiledOp.load(d + "/k")
        dw = op.run(np.load(d + "/x.npy"), np.load(d + "/dy.npy"))
        print("err", assert_close(op.problem, dw, np.load(d + "/want.npy")))
        assert sys.modules["iree.compiler"] is None  # nothing replaced the blocker by importing it
    """)
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=os.environ.copy())
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("err ")


def test_host_result_matches_reference_after_several_calls(compiled):
    # The kernel and device are cached across calls; repeated runs must stay correct.
    op = compiled(SMALL)
    for seed in range(3):
        x, dy = random_inputs(SMALL, seed=seed)
        assert_close(SMALL, op.run(x, dy), reference(SMALL, x, dy))


def test_timing_batches_are_all_the_same_size_so_every_sample_is_taken_alike():
    import time

    calls: list[int] = []
    syncs: list[int] = []

    def fn():
        calls.append(1)
        time.sleep(2e-4)  # about 10 calls a 2 ms batch

    samples = time_calls(fn, warmup=2, min_reps=8, min_seconds=0.0, sync=lambda: syncs.append(len(calls)))
    sizes = [b - a for a, b in zip(syncs[2:], syncs[3:])]  # after the warm-up and the sizing call
    assert len(samples) == len(sizes) == 8
    assert len(set(sizes)) == 1 and 1 < sizes[0] <= 64
    assert all(2e-4 <= s < 2e-2 for s in samples)


def test_fenced_input_sits_at_the_start_of_a_buffer_whose_rest_is_nan(compiled):
    import iree.runtime as rt

    from convbw_mlir.runtime import Kernel

    kernel = Kernel(compiled(SMALL).vmfb, "local-task")
    a = np.arange(12, dtype=np.float16).reshape(3, 4)
    fenced = kernel.to_device_fenced(a, slack_bytes=64)
    np.testing.assert_array_equal(fenced.to_host(), a)
    buf = fenced._buffer_view.get_buffer()
    whole = rt.DeviceArray(kernel.device, rt.HalBufferView(buf, [buf.byte_length() // 2], rt.HalElementType.FLOAT_16))
    behind = whole.to_host()[a.size :]
    assert behind.size == 32 and np.isnan(behind).all()  # what a kernel reading past ``a`` would pick up


def test_a_kernel_that_stays_inside_its_fenced_inputs_gives_the_same_dw(compiled):
    from convbw_mlir.runtime import Kernel

    kernel = Kernel(compiled(SMALL).vmfb, "local-task")
    x, dy = random_inputs(SMALL)
    got = np.asarray(kernel(kernel.to_device_fenced(x), kernel.to_device_fenced(dy)).to_host())
    assert np.isfinite(got).all()
    assert_close(SMALL, got, reference(SMALL, x, dy))
