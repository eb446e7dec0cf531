"""Size limits: IREE's per-backend buffer limits (check_limits) and memory checks before allocating."""

import dataclasses
import tracemalloc

import numpy as np
import pytest

import convbw_mlir.runtime as runtime
from convbw_mlir import limits
from convbw_mlir.cli import main
from convbw_mlir.limits import INT32_MAX, LIMITS, MAX_BINDING_BYTES, buffers, check_limits
from convbw_mlir.problem import INT64_MAX, ConvBwdWeightProblem
from convbw_mlir.reference import random_inputs, reference, reference_bytes
from convbw_mlir.runtime import NotEnoughMemoryError, available_memory, check_memory
from convbw_mlir.targets import TARGETS

GiB = 2**30
SMALL = ConvBwdWeightProblem(2, 2, 4, 8, (6, 6), (3, 3), pad_low=1, pad_high=1)
# x f16 of 8 * 1450 * 1450 * 64 elements: 2.005 GiB, just over 2**31 bytes (bench/large_operands.py)
OVER_2G = ConvBwdWeightProblem(1, 8, 64, 64, (1450, 1450), (3, 3), pad_low=1, pad_high=1)
UNDER_2G = OVER_2G.with_(input_size=(1448, 1448))


def with_available(monkeypatch, nbytes):
    monkeypatch.setattr(runtime, "available_memory", lambda: nbytes)


# -- IREE's limits per backend ----------------------------------------------------------------------


def test_every_target_backend_has_limits_with_sources():
    for target in TARGETS.values():
        lim = LIMITS[target.backend]
        assert lim.sources and MAX_BINDING_BYTES[target.backend] == lim.max_buffer_bytes


def test_iree_313_takes_operands_over_2_and_4_gib_on_every_backend():
    over_4g = OVER_2G.with_(batch=16)
    assert dict(buffers(UNDER_2G))["x"] < 2**31 < dict(buffers(OVER_2G))["x"] < 2**32 < dict(buffers(over_4g))["x"]
    for target in ("host", "gfx942", "sm_80", TARGETS["sm_80"]):  # a name, or the Target compile_op holds
        for p in (UNDER_2G, OVER_2G, over_4g):
            check_limits(p, target)
    assert LIMITS["hip"].buffer_instruction_bytes == INT32_MAX  # the 32-bit path AMD leaves above 2 GiB


def test_a_buffer_over_a_32_bit_backend_limit_is_refused_naming_size_and_limit(monkeypatch):
    narrow = dataclasses.replace(LIMITS["cuda"], index_bits=32)
    monkeypatch.setitem(limits.LIMITS, "cuda", narrow)
    check_limits(UNDER_2G.with_(pad_low=0, pad_high=0), "sm_80")  # x: 2147024896 bytes, under 2**31 - 1
    with pytest.raises(
        ValueError, match=r"^x: 2152960000 bytes, more than the 2147483647 bytes .* on sm_80 \(IREE cuda"
    ):
        check_limits(OVER_2G, "sm_80")
    check_limits(OVER_2G, "gfx942")  # other backends keep their own limits


def test_an_f32_accumulator_over_int64_bytes_is_refused_though_dw_fits():
    # dW has 2**61 f16 entries (2**62 bytes, a valid problem); its f32 accumulator needs 2**63 bytes
    p = ConvBwdWeightProblem(2**20, 1, 2**21, 2**20, (1,), (1,))
    with pytest.raises(ValueError, match=rf"^dw f32 accumulator: {2**63} bytes, more than the {INT64_MAX} bytes"):
        check_limits(p, "host")


# -- memory, checked before allocating ----------------------------------------------------------------


def test_available_memory_is_a_positive_byte_count_here():
    assert available_memory() > 0


def test_check_memory_names_the_first_array_that_does_not_fit_with_what_came_before():
    check_memory([("x", 3 * GiB), ("dy", GiB)], available=4 * GiB)
    with pytest.raises(NotEnoughMemoryError, match=r"^x: 954.0 GiB needed, 22.9 GiB available$"):
        check_memory([("x", int(954 * GiB)), ("dy", 1)], available=int(22.9 * GiB))
    with pytest.raises(ValueError, match=r"^dy: 2.0 GiB needed \(5.0 GiB with the 3.0 GiB before it\), 4.0 GiB"):
        check_memory([("x", 3 * GiB), ("dy", 2 * GiB)], available=4 * GiB)


def test_random_inputs_refuse_arrays_that_do_not_fit_before_allocating_them(monkeypatch):
    with_available(monkeypatch, GiB)
    tracemalloc.start()
    try:
        with pytest.raises(NotEnoughMemoryError, match=r"^x: 2.0 GiB needed, 1.0 GiB available"):
            random_inputs(OVER_2G)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2**20  # nothing the size of x was allocated
    with_available(monkeypatch, 3 * GiB)
    with pytest.raises(NotEnoughMemoryError, match=r"^dy: 2.0 GiB needed \(4.0 GiB with the 2.0 GiB before it\)"):
        random_inputs(OVER_2G)


@pytest.mark.parametrize(
    "p",
    [
        ConvBwdWeightProblem(1, 8, 32, 32, (64, 64), (3, 3), pad_low=1, pad_high=1),
        ConvBwdWeightProblem(2, 4, 16, 64, (40, 40), (1, 1)),
        ConvBwdWeightProblem(1, 8, 32, 32, (64, 64), (3, 3), stride=2, layout=0),
    ],
)
def test_reference_bytes_estimates_the_peak_numpy_allocates(p):
    x, dy = random_inputs(p)
    tracemalloc.start()
    try:
        reference(p, x, dy)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak * 0.99 <= reference_bytes(p) <= peak * 1.3


def test_reference_refuses_float64_copies_that_do_not_fit(monkeypatch):
    x, dy = random_inputs(SMALL)
    with_available(monkeypatch, 1000)
    with pytest.raises(NotEnoughMemoryError, match=r"^reference \(float64 copies of x and dy; sample_reference"):
        reference(SMALL, x, dy)


def test_host_run_refuses_device_copies_that_do_not_fit(compiled, monkeypatch):
    op = compiled(SMALL)
    x, dy = random_inputs(SMALL)
    with_available(monkeypatch, x.nbytes + 1)  # the device copy of x fits, that of dy does not
    with pytest.raises(
        NotEnoughMemoryError, match=r"^dy \(device copy\): 2.2 KiB needed \(3.4 KiB with the 1.1 KiB before it\)"
    ):
        op.run(x, dy)
    with_available(monkeypatch, 0)
    with pytest.raises(NotEnoughMemoryError, match=r"^x \(contiguous copy\)"):
        runtime.check_inputs(SMALL, np.asfortranarray(x), dy)  # any driver: the copy is host memory
    runtime.check_inputs(SMALL, x, dy, driver="cuda")  # device copies are not host memory there


def test_cli_run_of_a_billion_images_is_one_line_naming_the_size(monkeypatch, capsys):
    # was: numpy's _ArrayMemoryError traceback ("Unable to allocate 954. GiB")
    with_available(monkeypatch, int(22.9 * GiB))
    argv = ["run", "-n", "1000000000", "-c", "4", "-k", "4", "--input", "8x8", "--filter", "3x3"]
    assert main(argv) == 1
    assert capsys.readouterr().err == "convbw: error: x: 476.8 GiB needed, 22.9 GiB available\n"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["-n", "100000000000000000000"], "batch: 100000000000000000000 does not fit in int64"),
        (["-n", "3037000500", "--input", "3037000500", "--filter", "3"], "x: batch * input_size * groups"),
    ],
)
def test_cli_sizes_over_int64_are_one_line_naming_the_field(argv, message, capsys):
    base = {"-n": "1", "-c": "4", "-k": "4", "--input": "8x8", "--filter": "3x3"}
    base.update(dict(zip(argv[::2], argv[1::2])))
    assert main(["run", *[a for kv in base.items() for a in kv]]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"convbw: error: {message}") and err.count("\n") == 1


# -- bench/large_operands.py, its cases shrunk (--tiny) and run on the CPU -------------------------------


def _large_operands():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "bench" / "large_operands.py"
    spec = importlib.util.spec_from_file_location("large_operands", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_large_operand_cases_cross_2_and_4_gib():
    sizes = {name: dict(buffers(p)) for name, p in _large_operands().cases().items()}
    assert sizes["x_under_2g"]["x"] < 2**31 - 1 < sizes["x_over_2g"]["x"] < 2**32 < sizes["x_over_4g"]["x"]
    assert sizes["gemm_x_over_4g"]["x"] > 2**32 and "x padded" not in sizes["gemm_x_over_4g"]
    assert sizes["dy_over_4g"]["dy"] > 2**32 > 2**31 > sizes["dy_over_4g"]["x"]


def test_large_operands_script_compiles_runs_and_catches_a_wrong_entry(tmp_path, monkeypatch, capsys):
    from convbw_mlir.build.artifact import CompiledOp

    bench = _large_operands()
    args = ["--tiny", "--target", "host", "--filter", "gemm"]
    assert bench.main(["--compile-only", "--out", str(tmp_path), *args]) == 0
    assert bench.main(["--run", str(tmp_path), "--samples", "16", "--filter", "gemm"]) == 0
    assert "gemm_x_over_4g: x 4,147,200 B, dy 4,147,200 B: max error" in capsys.readouterr().out
    run = CompiledOp.run

    def one_wrong_entry(self, x, dy, device=None):
        dw = run(self, x, dy, device)
        dw[-1, -1, -1, -1, -1] += 1.0  # the last entry is always sampled
        return dw

    monkeypatch.setattr(CompiledOp, "run", one_wrong_entry)
    assert bench.main(["--run", str(tmp_path), "--samples", "16"]) == 1
    assert "WRONG" in capsys.readouterr().out
