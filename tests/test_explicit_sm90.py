"""The sm_90a target and the Hopper GEMM (issue 24): the hand-written target, the kernel's numerics under
the sm_90a emulator (tests/sm90_emulator.py: TMA with the 128-byte swizzle, mbarrier phases, wgmma
through matrix descriptors and its m64nNk16 accumulator layout, warp roles), its refusals. The GPU
numbers: docs/explicit-kernels.md "Hopper"."""

from __future__ import annotations

import numpy as np
import pytest
from sm90_emulator import Deadlock, d_fragment, run_gemm

from convbw_mlir.ir_imports import ir, new_context
from convbw_mlir.kernels import gemm_sm90
from convbw_mlir.kernels import ir as kir
from convbw_mlir.kernels.gemm_sm90 import Sm90Tiling, accumulator_coords, descriptor, gemm_module
from convbw_mlir.kernels.ir import Pipeline
from convbw_mlir.targets import get_target


def emulated(m: int, n: int, k: int, t: Sm90Tiling, out: str = "f32", seed: int = 0,
             dtype: str = "f16") -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    from convbw_mlir.problem import numpy_dtype

    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k)).astype(numpy_dtype(dtype))
    b = rng.standard_normal((n, k)).astype(numpy_dtype(dtype))
    with new_context(), ir.Location.unknown():
        module = gemm_module(m, n, k, t, dtype, out)
        c = run_gemm(module, a, b, (t.bm, t.bn // t.cluster), numpy_dtype(out))
    return c, a.astype(np.float64) @ b.astype(np.float64).T


def _error(c: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(c.astype(np.float64) - ref).max() / np.abs(ref).max())


def test_sm90a_target_is_hand_written_and_takes_no_target_flag():
    t = get_target("sm_90a")
    assert t.iree_flags() == []  # the module's hal.device.targets selects it (IREE 3.13 has no sm_90 flag)
    assert 'arch = "sm_90a"' in t.device_targets() and "max_workgroup_memory_bytes = 232448" in t.device_targets()
    assert (t.compute_units, t.lds_bytes, t.wgmma_n[0], t.wgmma_n[-1]) == (132, 232448, 8, 256)
    assert get_target("sm_80").device_targets() == ""


@pytest.mark.parametrize(
    ("fields", "shape", "out"),
    [
        ({"bn": 16, "stages": 2}, (128, 32, 320), "f32"),  # 2 consumers, 5 k tiles round a 2-stage ring
        ({"bn": 24, "stages": 3, "consumers": 1}, (64, 48, 448), "f16"),  # 1 consumer, f16 out, 7 k tiles
        # persistent: 3 workgroups take 2x3 tiles of 3 k tiles each (2 each), the ring running on across them
        ({"bn": 16, "stages": 2, "persistent": 3}, (256, 48, 192), "f32"),
        # clusters of 2 sharing B by TMA multicast: one block per tile pair, then a persistent pair
        ({"bn": 16, "stages": 2, "cluster": 2}, (512, 32, 192), "f32"),
        ({"bn": 32, "stages": 3, "cluster": 2, "persistent": 2}, (512, 64, 256), "f32"),
    ],
)
def test_wgmma_gemm_matches_float64_under_emulation(fields, shape, out):
    c, ref = emulated(*shape, Sm90Tiling(**fields), out)
    assert not np.isnan(c).any()  # every element written, nothing read before its TMA landed
    assert _error(c, ref) < (1e-6 if out == "f32" else 2e-3)


def test_bf16_gemm_with_bf16_output_matches_float64_under_emulation():
    c, ref = emulated(128, 32, 192, Sm90Tiling(bn=32, stages=2, persistent=1), "bf16", dtype="bf16")
    assert not np.isnan(c.astype(np.float32)).any() and _error(c.astype(np.float32), ref) < 1e-2


def test_accumulator_coords_follow_the_ptx_m64nNk16_layout():
    rows, cols = d_fragment(32)
    coords = accumulator_coords(32)
    assert all((coords[v][0] == rows[:, v]).all() and (coords[v][1] == cols[:, v]).all() for v in range(16))
    # each (row, column) of the 64 x 32 tile is held by exactly one thread and value
    assert len({(r, c) for r, c in zip(rows.ravel(), cols.ravel())}) == 64 * 32


def test_a_producer_that_skips_the_empty_wait_is_caught(monkeypatch):
    """The emulator runs the producer ahead: without its wait on empty[s] it refills a stage before the
    consumers read it and completes full[s]'s phases ahead of them, so they wait on a phase that is
    gone (the ring's protocol is tested, not assumed)."""
    real = gemm_sm90.nvvm.mbarrier_try_wait_parity
    calls = []

    def skip_first_kind(addr, phase, ticks):  # the producer's wait is the first one built
        calls.append(addr)
        if len(calls) > 1:
            real(addr, phase, ticks)

    monkeypatch.setattr(gemm_sm90.nvvm, "mbarrier_try_wait_parity", skip_first_kind)
    with pytest.raises(Deadlock):
        emulated(128, 16, 512, Sm90Tiling(bn=16, stages=2))


def test_waits_on_the_wrong_parity_read_stages_before_their_tma_landed(monkeypatch):
    """Every wait one phase off: the consumers pass full[s] before the producer filled it (a fresh
    barrier passes parity 1) and multiply NaN shared memory."""
    real = Pipeline.stage_and_phase

    def flipped(self, kt):
        s, phase = real(self, kt)
        return s, gemm_sm90.arith.xori(phase, self.b.c(1))

    monkeypatch.setattr(Pipeline, "stage_and_phase", flipped)
    c, _ = emulated(128, 16, 256, Sm90Tiling(bn=16, stages=2))
    assert np.isnan(c).all()


@pytest.mark.parametrize(
    ("fields", "message"),
    [({"bn": 12}, "bn: 12 is not a wgmma N"), ({"bk": 32}, "bk: 32"), ({"consumers": 3}, "consumers: 3")],
)
def test_tiling_refuses_what_wgmma_and_the_swizzle_cannot_take(fields, message):
    with pytest.raises(ValueError, match=message):
        Sm90Tiling(**fields)


def test_gemm_refuses_sizes_off_the_tile():
    with (
        new_context(),
        ir.Location.unknown(),
        pytest.raises(ValueError, match="n: 40 is not a multiple of the tile's 16"),
    ):
        gemm_module(128, 40, 128, Sm90Tiling(bn=16))


def test_torch_entry_keeps_sm80_kernels_on_a_hopper_device(monkeypatch):
    """With sm_90a in the table, a compute-capability-9.0 device asked without a problem gets the sm_80
    kernels (sm_90a only for a problem the sm_90a kernel takes: tests/test_sm90_product.py); the
    arch-specific name must not break the choice."""
    torch = pytest.importorskip("torch")
    from convbw_mlir.torch import entry

    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: (9, 0))
    assert entry.target_for(torch.device("cuda", 0)) == ("sm_80", "cuda", 0)


def test_releasing_stages_without_waiting_for_their_wgmmas_lets_the_producer_overwrite_them(monkeypatch):
    """Without ``wgmma.wait_group 1`` before the release, a stage goes back to the producer while the
    wgmmas reading it are in flight; the emulator's wgmmas read shared memory when their group retires
    (here: at the final ``wait_group 0``), so the refilled stages give a wrong result."""
    real = gemm_sm90.nvvm.wgmma_wait_group_sync_aligned

    def only_the_last(group):
        if group == 0:
            real(group)

    monkeypatch.setattr(gemm_sm90.nvvm, "wgmma_wait_group_sync_aligned", only_the_last)
    c, ref = emulated(128, 16, 512, Sm90Tiling(bn=16, stages=2))
    assert _error(c, ref) > 1e-2


def test_gate_bench_compiles_a_variant_to_sm90a_ptx_with_its_launch(tmp_path):
    """bench/hopper_gemm.py's compile half (the run half needs a Hopper GPU): the PTX and the export IREE
    wrote for it (block, dynamic shared memory), which the direct launch uses as they are."""
    from conftest import bench_script

    bench = bench_script("hopper_gemm")
    entry = bench.compile_variant("check_ws128x256_s4_p3_512x768x512", tmp_path)
    t = Sm90Tiling(persistent=3)
    assert (entry["grid"], entry["block"], entry["shared"]) == ([3, 1, 1], [384, 1, 1], t.shared_bytes)
    ptx = (tmp_path / "check_ws128x256_s4_p3_512x768x512.ptx").read_text()
    assert ".target sm_90a" in ptx and f".entry {entry['kernel']}(" in ptx


def test_cluster_pair_without_multicast_never_fills_its_b_tiles(monkeypatch):
    """Each workgroup of a pair loads half of B for both; without the multicast mask its peer's half never
    lands, so the full barrier's bytes never complete."""
    real = gemm_sm90.nvvm.cp_async_bulk_tensor_shared_cluster_global

    def own_only(*args, multicast_mask=None, **kwargs):
        return real(*args, **kwargs)

    monkeypatch.setattr(gemm_sm90.nvvm, "cp_async_bulk_tensor_shared_cluster_global", own_only)
    with pytest.raises(Deadlock):
        emulated(512, 32, 192, Sm90Tiling(bn=16, stages=2, cluster=2))


def test_cluster_pair_must_meet_before_exit(monkeypatch):
    """Without the closing cluster barrier a workgroup can exit while its peer still arrives on its
    empty barriers (the emulator runs rank 0 first, so its peer's last releases come after it left)."""
    real = kir.sync
    calls = []

    def first_only(cluster):
        calls.append(cluster)
        if len(calls) == 1:
            real(cluster)

    monkeypatch.setattr(kir, "sync", first_only)
    with pytest.raises(AssertionError, match="workgroup that has exited"):
        emulated(512, 32, 192, Sm90Tiling(bn=16, stages=2, cluster=2))


def test_gate_verdict_takes_the_best_correct_f16_kernel_against_620_and_cublas():
    from conftest import bench_script

    bench = bench_script("hopper_gemm")
    rows = [
        {"name": "ws_a", "kind": "ours", "correct": True, "single_tflops": 650.0},
        {"name": "ws_fast_wrong", "kind": "ours", "correct": False, "single_tflops": 900.0},
        {"name": "ws_bf16", "kind": "ours", "correct": True, "single_tflops": 700.0},
        {"name": "cublas_f16", "kind": "torch", "correct": True, "single_tflops": 760.0},
    ]
    assert bench._verdict(rows).endswith("MET: best ws_a 650.0 TFLOP/s, 0.86x cuBLAS f16.")
    assert "NOT met" in bench._verdict([{**rows[0], "single_tflops": 600.0}])


def test_descriptor_fields_are_where_the_emulator_decodes_them():
    d = descriptor(0x2C400)
    assert (d & 0x3FFF) << 4 == 0x2C400  # start address >> 4, 14 bits (shared addresses < 256 KiB)
    assert ((d >> 32) & 0x3FFF) << 4 == 1024 and d >> 62 == 1  # 8-row groups 1024 B apart; 128-byte swizzle
