"""fp8 in the sm_90a GEMM (issue 24 item 4): e4m3 / e5m2 operands, wgmma m64nNk32 on K-major descriptors,
f32 accumulation, ``scale_a * scale_b`` in the epilogue, f32 or bf16 out, under the sm_90a emulator
(tests/sm90_emulator.py: global memory holds the fp8 codes, the wgmma decodes them by its type attributes).
The reference is float64 on the same fp8-rounded inputs; the bound is docs/explicit-kernels.md "fp8"."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from sm90_emulator import run_gemm

from convbw_mlir.ir_imports import ir, new_context
from convbw_mlir.kernels import gemm_sm90
from convbw_mlir.kernels.gemm_sm90 import Sm90Tiling, gemm_module

E4M3, E5M2 = np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e5m2)
MLIR = {E4M3: "f8E4M3FN", E5M2: "f8E5M2"}


def emulated_fp8(m: int, n: int, k: int, t: Sm90Tiling, a_type=E4M3, b_type=E5M2, out: str = "f32",
                 scales: tuple[float, float] = (0.5, 3.0), seed: int = 0) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """The kernel's C and float64's ``scale_a scale_b A B^T`` on the same fp8-rounded inputs."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k)).astype(a_type)
    b = (4 * rng.standard_normal((n, k))).astype(b_type)
    with new_context(), ir.Location.unknown():
        module = gemm_module(m, n, k, t, MLIR[a_type], out, MLIR[b_type])
        dt = np.float32 if out == "f32" else np.dtype(ml_dtypes.bfloat16)
        c = run_gemm(module, a, b, (t.bm, t.bn // t.cluster), dt, scales)
    ref = scales[0] * scales[1] * (a.astype(np.float64) @ b.astype(np.float64).T)
    return c.astype(np.float64), ref


def _error(c: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(c - ref).max() / np.abs(ref).max())


@pytest.mark.parametrize(
    ("fields", "shape", "types", "out"),
    [
        ({"bn": 16, "stages": 2}, (128, 32, 384), (E4M3, E5M2), "f32"),  # 3 k tiles of 128 round a 2-stage ring
        ({"bn": 24, "stages": 3, "consumers": 1}, (64, 48, 640), (E4M3, E4M3), "bf16"),  # e4m3 x e4m3, bf16 out
        ({"bn": 16, "stages": 2, "persistent": 3}, (256, 48, 256), (E5M2, E4M3), "f32"),  # persistent ring
        ({"bn": 32, "stages": 2, "cluster": 2}, (256, 32, 256), (E4M3, E5M2), "f32"),  # B by TMA multicast
        # split-K, the weight gradient's shape (few output tiles, a long reduction): 3 splits of 2 k tiles
        ({"bn": 16, "stages": 2, "splits": 3}, (128, 16, 768), (E4M3, E5M2), "f32"),
        # promote: each k tile's partial (scale-d 0) added into f32 accumulators; persistent, so the carried
        # accumulators restart per tile
        ({"bn": 32, "stages": 2, "promote": True, "persistent": 2}, (256, 64, 384), (E4M3, E5M2), "bf16"),
    ],
)
def test_fp8_gemm_matches_float64_on_the_same_fp8_inputs_under_emulation(fields, shape, types, out):
    c, ref = emulated_fp8(*shape, Sm90Tiling(elem_bytes=1, **fields), *types, out)
    assert not np.isnan(c).any()  # every element written, nothing read before its TMA landed
    # f32: the accumulation's rounding only; bf16: dW's rounding, 2^-8 of the value (docs "fp8")
    assert _error(c, ref) < (1e-6 if out == "f32" else 2**-8)


def test_fp8_tiling_takes_128_elements_a_swizzled_row():
    t = Sm90Tiling(elem_bytes=1)
    assert (t.bk, t.a_bytes, t.b_bytes) == (128, 128 * 128, 256 * 128)
    with pytest.raises(ValueError, match="bk: 64: the 128-byte swizzle takes 128 8-bit elements"):
        Sm90Tiling(elem_bytes=1, bk=64)


def test_fp8_scales_multiply_the_accumulators():
    c, ref = emulated_fp8(64, 16, 128, Sm90Tiling(bn=16, stages=2, consumers=1, elem_bytes=1), scales=(2.0**-7, 40.0))
    assert _error(c, ref) < 1e-6


def test_fp8_wgmma_reading_e5m2_codes_as_e4m3_is_wrong(monkeypatch):
    """The emulator decodes the bytes by the wgmma's type attributes: B's e5m2 codes read as e4m3 (one
    type for both operands, the 16-bit kernel's habit) give another product."""
    real = gemm_sm90._wgmma

    def one_type(b, t, acc, a, bb, rows, elem, **kwargs):
        return real(b, t, acc, a, bb, rows, (elem[0], elem[0]), **kwargs)

    monkeypatch.setattr(gemm_sm90, "_wgmma", one_type)
    c, ref = emulated_fp8(64, 16, 128, Sm90Tiling(bn=16, stages=2, consumers=1, elem_bytes=1))
    assert _error(c, ref) > 0.1


def test_fp8_wgmma_with_k16_steps_is_refused_by_the_emulator(monkeypatch):
    """8-bit wgmma is k32: the 16-bit step (16 elements, half of a 32-byte step) would skip half of K."""
    monkeypatch.setattr(gemm_sm90, "STEP_BYTES", 16)
    with pytest.raises(AssertionError, match="wgmma k = 16"):
        emulated_fp8(64, 16, 128, Sm90Tiling(bn=16, stages=2, consumers=1, elem_bytes=1))


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: gemm_module(64, 16, 128, Sm90Tiling(bn=16), "f8E4M3FN", "f32", "f16"), "dtype: 'f8E4M3FN/f16'"),
        (lambda: gemm_module(64, 16, 128, Sm90Tiling(bn=16), "f8E4M3FN", "f32", "f8E5M2"), "elem_bytes: 2"),
        (lambda: gemm_module(64, 16, 128, Sm90Tiling(bn=16, elem_bytes=1), "f8E4M3FN", "f16"), "out: 'f16'"),
        (lambda: gemm_module(128, 16, 192, Sm90Tiling(bn=16, elem_bytes=1), "f8E4M3FN"), "k: 192 is not a multiple"),
        (lambda: gemm_module(128, 16, 384, Sm90Tiling(bn=16, elem_bytes=1, splits=2), "f8E4M3FN"), "splits: 2 does"),
        (
            lambda: gemm_module(128, 16, 256, Sm90Tiling(bn=16, elem_bytes=1, splits=2), "f8E4M3FN", "bf16"),
            "out: 'bf16'",
        ),
        (lambda: Sm90Tiling(splits=2, persistent=4), "splits: 2 "),
    ],
)
def test_fp8_gemm_refuses_types_and_sizes_it_cannot_take(build, message):
    with new_context(), ir.Location.unknown(), pytest.raises(ValueError, match=message):
        build()


def test_fp8_bench_compiles_a_split_k_variant_to_sm90a_ptx(tmp_path):
    """bench/hopper_fp8.py's compile half: the split-K fp8 kernel's grid carries the splits, its PTX the
    e5m2 x e4m3 wgmma and the f32 atomic adds of the partials."""
    from conftest import bench_script

    bench = bench_script("hopper_fp8")
    name = "check_fp8_split4_256x512x2048"
    entry = bench.hopper_gemm.compile_variant(name, tmp_path, bench.VARIANTS[name])
    assert entry["grid"] == [2, 2, 4] and entry["dtype_b"] == "f8E4M3FN"
    ptx = (tmp_path / f"{name}.ptx").read_text()
    assert "wgmma.mma_async.sync.aligned.m64n256k32.f32.e5m2.e4m3" in ptx and ".add.f32" in ptx


def test_promote_without_waiting_for_the_partial_reads_it_before_its_wgmma_retired(monkeypatch):
    """With promotion the consumer adds each k tile's partial right after its group; without
    ``wgmma.wait_group 0`` there it would read accumulators still in flight (the emulator refuses)."""
    real = gemm_sm90.nvvm.wgmma_wait_group_sync_aligned
    monkeypatch.setattr(gemm_sm90.nvvm, "wgmma_wait_group_sync_aligned", lambda group: group and real(group))
    with pytest.raises(AssertionError, match="accumulators read before wgmma.wait_group retired"):
        emulated_fp8(64, 16, 256, Sm90Tiling(bn=16, stages=2, consumers=1, elem_bytes=1, promote=True))


def test_promote_refuses_a_tile_too_wide_for_two_accumulator_sets():
    with pytest.raises(ValueError, match="bn: 256: promote keeps two accumulator sets"):
        Sm90Tiling(elem_bytes=1, promote=True)


def test_fp8_bench_verdict_compares_the_best_correct_fp8_kernel_with_our_f16_one():
    """A fp8 kernel with bf16 out is no f16 baseline (its name holds "f16" inside "bf16")."""
    from conftest import bench_script

    bench = bench_script("hopper_fp8")
    rows = [
        {"name": "gemm_f16_ours", "kind": "ours", "correct": True, "tflops": 700.0},
        {"name": "gemm_fp8_e4m3_e5m2_bf16_promote", "kind": "ours", "correct": True, "tflops": 1130.0},
        {"name": "gemm_fp8_e4m3_e5m2_bf16", "kind": "ours", "correct": False, "tflops": 1200.0},
        {"name": "gemm_cublas_fp8_e4m3_e5m2_bf16", "kind": "torch", "correct": True, "tflops": 1400.0},
    ]
    (gemm, _) = bench.verdict(rows)
    assert gemm == (
        "gemm: fp8 >= 1.6x our f16: MET: gemm_fp8_e4m3_e5m2_bf16_promote 1130.0 TFLOP/s, 1.61x gemm_f16_ours 700.0."
    )
