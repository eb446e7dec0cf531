"""The benchmark's halves on the CPU: artifacts written and loaded, the runner checking and timing
every contender (and catching a wrong one, surviving one that kills its process), the float64 sample
check and its tolerance, the report rebuilt from saved results."""

import json
import math
import shutil

import numpy as np
import pytest
from stand_in_kernels import hanging_kernel as _hanging_kernel
from stand_in_kernels import segfaulting_kernel as _segfaulting_kernel

from convbw_mlir import compile_op
from convbw_mlir.build.contenders import write_artifacts
from convbw_mlir.measure.children import status_of as _status_of
from convbw_mlir.measure.report import main as report_main
from convbw_mlir.measure.report import summarize
from convbw_mlir.measure.run import (
    error_stats,
    run_manifest,
    sample_indices,
    tolerance_rms,
)
from convbw_mlir.problem import ConvBwdWeightProblem

DENSE = ConvBwdWeightProblem(1, 2, 8, 16, (9, 9), (3, 3), stride=2, pad_low=1, pad_high=1)
GROUPED = ConvBwdWeightProblem(4, 3, 4, 4, (6, 6), (3, 3), pad_low=1, pad_high=1, dtype="bf16")


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    out = tmp_path_factory.mktemp("art") / "host"
    write_artifacts([("dense", DENSE), ("grouped", GROUPED)], "host", out)
    return out


def test_artifacts_hold_every_contender_and_a_manifest(artifacts):
    manifest = json.loads((artifacts / "manifest.json").read_text())
    assert manifest["target"] == "host" and manifest["iree_version"].startswith("3.13")
    dense, grouped = manifest["problems"]
    assert dense["key"] == "dense.f16" and ConvBwdWeightProblem.from_dict(dense["problem"]) == DENSE
    for name in ("convbw", "reference", "iree_direct", "iree_torch", "iree_fusilli"):
        assert dense["contenders"][name]["ok"], name
        assert (artifacts / dense["contenders"][name]["vmfb"]).stat().st_size > 0
    assert dense["contenders"]["convbw"]["config"]["k_batch"] == 1
    # the torch-mlir form needs G=1: recorded as missing, not as a failure of the run
    assert grouped["contenders"]["iree_torch"] == {"ok": False, "error": "no such form for this problem"}
    assert not [p for p in artifacts.parent.iterdir() if p.name.startswith(".")]  # no temporaries left


def test_runner_checks_and_times_every_contender_on_the_host(artifacts):
    results = run_manifest(artifacts, use_torch=False, log=lambda _: None)
    assert [r["key"] for r in results["problems"]] == ["dense.f16", "grouped.bf16"]
    dense = results["problems"][0]
    assert dense["reference_checked"] == "numpy" and dense["reference_check"]["status"] == "ok"
    for name in ("convbw", "iree_direct", "iree_torch", "iree_fusilli"):
        r = dense["contenders"][name]
        assert r["status"] == "ok" and r["n"] >= 20 and r["p10_s"] <= r["median_s"]
        # an f16 result off by its own rounding only: half an ulp, about 2^-11 RMS at the largest entries
        assert r["error_ulps"] <= 0.5 + 1e-6 and r["error_rms"] < 2e-3 and r["error_rms_full"] < r["tolerance_rms"]
    assert results["problems"][1]["contenders"]["iree_torch"]["status"] == "no kernel"


def _with_contender(artifacts, tmp_path, contender: str, vmfb: bytes):
    """A copy of the artifacts whose first problem's ``contender`` is ``vmfb``."""
    bad = tmp_path / "bad"
    shutil.copytree(artifacts, bad)
    manifest = json.loads((bad / "manifest.json").read_text())
    (bad / manifest["problems"][0]["contenders"][contender]["vmfb"]).write_bytes(vmfb)
    return bad


def test_runner_reports_a_wrong_kernel_as_wrong(artifacts, tmp_path):
    # Same shapes, other padding: a kernel that runs fine and computes something else.
    wrong = compile_op(DENSE.with_(pad_low=(2, 0), pad_high=(0, 2)), "host")
    bad = _with_contender(artifacts, tmp_path, "iree_direct", wrong.vmfb)
    results = run_manifest(bad, filt="dense", use_torch=False, log=lambda _: None)
    r = results["problems"][0]["contenders"]["iree_direct"]
    assert r["status"] == "WRONG" and "RMS > tolerance" in r["error"] and "median_s" not in r
    assert r["error_rms"] > 0.1 and r["error_rms"] > 100 * r["tolerance_rms"]


def test_report_rebuilds_table_and_speedups_from_saved_results(artifacts, tmp_path):
    results = run_manifest(artifacts, use_torch=False, log=lambda _: None)
    path = tmp_path / "results.json"
    path.write_text(json.dumps(results))
    assert report_main([str(path)]) == 0
    text = path.with_suffix(".md").read_text()
    assert (
        "| dense.f16 |" in text and "| grouped.bf16 |" in text and "geomean speedup vs the better IREE default" in text
    )
    assert "## Accuracy against float64" in text and "- crashed: none" in text
    s = summarize(results)
    ours, base = s["rows"][0][1], s["rows"][0][2]
    assert s["rows"][0][4] == pytest.approx(base / ours)


def test_gpu_reference_of_a_strided_1x1_copies_x_at_the_stride_and_matches_numpy():
    from convbw_mlir.build.contenders import build_contender
    from convbw_mlir.build.iree import compile_module
    from convbw_mlir.reference import assert_close, random_inputs, reference
    from convbw_mlir.runtime import Kernel

    problem = ConvBwdWeightProblem.from_ck("2 2 3 8 4 1 1 7 7 2 2 1 1 0 0 0 0")  # CK's ck2d_b, smaller
    text, _ = build_contender(problem, "reference", "host")
    assert "util.optimization_barrier" in text  # the subsample copy, its own dispatch
    x, dy = random_inputs(problem, seed=3)
    got = Kernel(compile_module(text, "host"), "local-task").run(x, dy)
    assert_close(problem, got, reference(problem, x, dy))


def test_a_kernel_that_kills_its_process_reads_crashed_and_every_other_result_stands(artifacts, tmp_path):
    bad = _with_contender(artifacts, tmp_path, "iree_direct", _segfaulting_kernel(DENSE))
    lines = []
    results = run_manifest(bad, use_torch=False, log=lines.append)
    dense, grouped = results["problems"]
    crashed = dense["contenders"]["iree_direct"]
    assert crashed["status"] == "crashed" and "SIGSEGV" in crashed["error"], crashed
    assert any("iree_direct" in line and "SIGSEGV" in line for line in lines)
    # the contenders before and after it, and the next problem, as if nothing had happened
    assert dense["reference_checked"] == "numpy"
    for name in ("convbw", "iree_torch", "iree_fusilli"):
        assert dense["contenders"][name]["status"] == "ok", name
    for name in ("convbw", "iree_direct", "iree_fusilli"):
        assert grouped["contenders"][name]["status"] == "ok", name


def test_a_kernel_that_never_ends_is_killed_and_reads_crashed_and_the_rest_runs(artifacts, tmp_path):
    bad = _with_contender(artifacts, tmp_path, "iree_torch", _hanging_kernel(DENSE))
    results = run_manifest(bad, filt="dense", use_torch=False, log=lambda _: None, timeout_s=10)
    r = results["problems"][0]["contenders"]
    assert r["iree_torch"] == {"status": "crashed", "error": "no progress for 10 s (killed)"}
    assert all(r[n]["status"] == "ok" for n in ("convbw", "iree_direct", "iree_fusilli"))


def test_runner_cli_rejects_a_timeout_that_is_not_positive(artifacts, capsys):
    from convbw_mlir.measure.run import main

    assert main([str(artifacts), "--timeout", "0"]) == 1
    assert capsys.readouterr().err.strip() == "error: --timeout: expected seconds > 0, got 0.0"


def test_a_kernel_that_raises_is_recorded_alone_and_the_rest_runs(artifacts, tmp_path):
    bad = _with_contender(artifacts, tmp_path, "convbw", b"not a vmfb")
    results = run_manifest(bad, filt="dense", use_torch=False, log=lambda _: None)
    r = results["problems"][0]["contenders"]
    assert r["convbw"]["status"] == "failed" and r["convbw"]["error"]
    assert r["convbw"]["config"]["k_batch"] == 1  # the compile side's record is kept
    assert all(r[n]["status"] == "ok" for n in ("iree_direct", "iree_torch", "iree_fusilli"))


def test_device_faults_seen_on_the_h100_read_crashed_and_other_errors_failed():
    # both messages as the H100 gave them (bench/results/h100_2026-11-23_crash.json)
    seen = [
        "Error invoking function: c/runtime/src/iree/hal/drivers/cuda/cuda_device.c:190: ABORTED; CUDA error "
        "'CUDA_ERROR_ILLEGAL_ADDRESS' (700): an illegal memory access was encountered; while invoking native "
        "function hal.fence.await; while calling variadic import;",
        "Error invoking function: ABORTED; while invoking native function hal.device.queue.dealloca; "
        "while calling import;",
    ]
    assert [_status_of(m) for m in seen] == ["crashed", "crashed"]
    assert (
        _status_of(RuntimeError("Error creating vm module from FlatBuffer: INVALID_ARGUMENT; FlatBuffer")) == "failed"
    )


def test_beyond_numpy_every_verdict_rests_on_the_float64_sample_and_a_wrong_gpu_reference_is_caught(
    artifacts, tmp_path
):
    # numpy_max_flops=0 makes the small problems run as the large ones do: no whole float64 reference
    results = run_manifest(artifacts, filt="dense", use_torch=False, log=lambda _: None, numpy_max_flops=0)
    dense = results["problems"][0]
    assert dense["reference_checked"] == "float64 sample (256 entries)"
    assert dense["reference_check"]["status"] == "ok" and dense["reference_check"]["entries"] == 256
    assert dense["contenders"]["convbw"]["status"] == "ok" and "error_rms_full" in dense["contenders"]["convbw"]

    wrong = compile_op(DENSE.with_(pad_low=(2, 0), pad_high=(0, 2), dw_dtype="f32"), "host")
    bad = _with_contender(artifacts, tmp_path, "reference", wrong.vmfb)
    results = run_manifest(bad, filt="dense", use_torch=False, log=lambda _: None, numpy_max_flops=0)
    dense = results["problems"][0]
    assert dense["reference_checked"].startswith("GPU reference WRONG vs float64")
    r = dense["contenders"]["convbw"]  # judged on the sample alone, not against the wrong reference
    assert r["status"] == "ok" and "error_rms_full" not in r


@pytest.mark.parametrize(
    "problem",
    [
        DENSE,
        GROUPED,
        ConvBwdWeightProblem(1, 2, 3, 5, (11,), (4,), stride=2, dilation=2, pad_low=3, pad_high=0),
        ConvBwdWeightProblem(2, 2, 3, 2, (5, 6, 7), (2, 3, 2), stride=(1, 2, 3), pad_low=(0, 1, 2), pad_high=1),
        ConvBwdWeightProblem(1, 2, 3, 4, (7, 8), (3, 3), stride=3, dilation=(1, 2), pad_low=4, layout="torch"),
        ConvBwdWeightProblem(3, 2, 2, 3, (6, 5), (2, 2), pad_low=(1, 0), pad_high=(0, 3), layout=0, dtype="bf16"),
    ],
    ids=["dense", "grouped_bf16", "1d_dilated", "3d_strided", "torch_pad_beyond_filter", "gnchw_asymmetric"],
)
def test_the_runner_s_sampled_entries_are_distinct_and_checked_in_float64(problem):
    from convbw_mlir.reference import random_inputs, reference, sample_reference

    x, dy = random_inputs(problem, seed=5)
    full = reference(problem, x, dy).ravel()
    few = sample_indices(problem, entries=7, seed=1)
    coords = np.stack(np.unravel_index(few, problem.dw_shape), axis=1)
    assert len(set(few)) == min(7, full.size)
    assert np.allclose(sample_reference(problem, x, dy, coords), full[few], rtol=1e-12)


def test_errors_are_in_rms_units_and_ulps_of_the_type():
    exact = np.array([1.0, -2.0, 0.0, 4.0])  # rms 2.29
    got = exact + np.array([0, 0, 0, 2.0**-8])  # one f16 ulp at 4 is 2^-8
    s = error_stats(got, exact, "f16")
    assert s["error_ulps"] == pytest.approx(1.0) and s["error_rms"] == pytest.approx(2.0**-8 / math.sqrt(5.25))
    assert s["worst"] == 3 and s["peak"] == pytest.approx(4 / math.sqrt(5.25))
    # near zero an error is measured at the typical magnitude: an f16 ulp at rms 2.29 is 2^-9
    s = error_stats(exact + np.array([0, 0, 2.0**-9, 0]), exact, "f16")
    assert s["error_ulps"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="dw_dtype: unknown element type 'f64'"):
        tolerance_rms(DENSE, "f64", 1.0)


def test_tolerance_of_a_tiny_epilogue_scale_passes_a_correctly_rounded_f16_dw_and_not_twice_it():
    from convbw_mlir.problem import Epilogue
    from convbw_mlir.reference import random_inputs, reference

    # alpha 1e-8: an f16 dW of subnormals and zeros, as a correct kernel rounds it (issue 42)
    p = ConvBwdWeightProblem(2, 4, 8, 8, (8, 8), (3, 3), pad_low=1, pad_high=1, dtype="f16",
                             epilogue=Epilogue("scale", 1e-8))  # fmt: skip
    x, dy = random_inputs(p)
    exact = reference(p, x, dy)
    rms = float(np.sqrt(np.mean(exact**2)))
    rounded = (np.float32(1e-8) * reference(p.plain, x, dy).astype(np.float32)).astype(np.float16)
    s = error_stats(rounded, exact, "f16", rms)
    assert s["error_rms"] <= tolerance_rms(p, "f16", s["peak"], rms=rms)
    assert s["error_rms"] > tolerance_rms(p, "f16", s["peak"])  # the relative bound alone failed it
    wrong = error_stats((2 * exact).astype(np.float16), exact, "f16", rms)
    assert wrong["error_rms"] > tolerance_rms(p, "f16", wrong["peak"], rms=rms)


def _truncating_dot(products: np.ndarray, k: int) -> np.ndarray:
    """Rows of ``products`` summed as a tensor core does: k exact products a step into an f32 truncated to zero."""
    acc = np.zeros(products.shape[0])
    for step in range(0, products.shape[1], k):
        exact = acc + products[:, step : step + k].sum(axis=1)
        rounded = exact.astype(np.float32).astype(np.float64)
        over = np.abs(rounded) > np.abs(exact)  # rounded away from zero: step back one f32
        rounded[over] = np.nextafter(rounded[over].astype(np.float32), np.float32(0)).astype(np.float64)
        acc = rounded
    return acc


def test_tolerance_covers_a_truncating_accumulator_over_a_long_reduction_and_no_more():
    # 64 dW entries, L = 2^16 f16 products each, accumulated in one chain of L/16 truncated steps
    problem = ConvBwdWeightProblem(1, 16, 4, 1, (64, 64), (1, 1), dtype="f16", dw_dtype="f32")
    length = problem.gemm[3]
    rng = np.random.default_rng(0)
    a = rng.standard_normal((64, length)).astype(np.float16).astype(np.float64)
    b = rng.standard_normal((64, length)).astype(np.float16).astype(np.float64)
    exact = (a * b).sum(axis=1)
    got = _truncating_dot(a * b, 16)
    s = error_stats(got, exact, "f32")
    tol = tolerance_rms(problem, "f32", s["peak"])
    # the model (u n / sqrt(3) per entry) predicts the size: within the tolerance, not 100 times below it
    assert tol / 100 < s["error_rms"] < tol
    # round to nearest over the same chain is far more accurate: the reference kernel's model is tighter
    assert tolerance_rms(problem, "f32", s["peak"], mma=False) < tol / 5
