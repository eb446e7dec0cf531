"""Races in the sm_90a kernels (issue 42 item 10): every barrier of ``kernels/gemm_sm90.py`` and
``kernels/conv_sm90.py`` removed, one at a time, is caught by the sm_90a emulator's happens-before check
(tests/sm90_emulator.py ``Race``), which the threads running in step would otherwise hide: the values come out
right without them. The closing cluster barrier's test is in test_explicit_sm90.py. Tiny problems: each
emulation takes well under a second."""

from __future__ import annotations

import numpy as np
import pytest
from sm90_emulator import Race
from test_conv_sm90 import _error
from test_conv_sm90 import emulated as conv_emulated
from test_explicit_sm90 import emulated as gemm_emulated

from convbw_mlir.kernels import conv_sm90
from convbw_mlir.kernels import ir as kir
from convbw_mlir.kernels.conv_sm90 import ConvSm90
from convbw_mlir.kernels.gemm_sm90 import Sm90Tiling

ONE = Sm90Tiling(bn=64, stages=2, consumers=1)  # 256 threads: a producer and one consumer warpgroup
# one tile of 2 k tiles on 2 StreamK workgroups: workgroup 0 contributes its partial, workgroup 1 finishes
STREAMK = ConvSm90(n=2, h=8, w=8, c=64, k=64, fy=1, fx=1, ho=8, wo=8, tiling=ONE, streamk=2)
FUSED = ConvSm90(n=2, h=8, w=8, c=64, k=64, fy=1, fx=1, ho=8, wo=8, tiling=ONE, splits=2, fused=True)
PLAIN = ConvSm90(n=2, h=8, w=8, c=64, k=64, fy=1, fx=1, ho=8, wo=8, tiling=ONE)
# a deeper ring (plan option wgmma-stages): 6 stages over 12 k tiles (two rounds, the parity flipped), and StreamK's
# ring running on across 2 tiles of 6 k tiles on 2 workgroups
DEEP = Sm90Tiling(bn=64, stages=6, consumers=1)
DEEP_PLAIN = ConvSm90(n=12, h=8, w=8, c=64, k=64, fy=1, fx=1, ho=8, wo=8, tiling=DEEP)
DEEP_STREAMK = ConvSm90(n=6, h=8, w=8, c=128, k=64, fy=1, fx=1, ho=8, wo=8, tiling=DEEP, streamk=2)


def without_call(monkeypatch, owner, name: str, skip: int) -> list[int]:
    """``owner.name`` builds everything but its call number ``skip``; returns the calls made (each test checks
    their count, so a kernel that gains or loses one fails there instead of silently losing another)."""
    real = getattr(owner, name)
    made = []

    def patched(*args, **kwargs):
        made.append(skip)
        if len(made) - 1 != skip:
            return real(*args, **kwargs)
        return None

    monkeypatch.setattr(owner, name, patched)
    return made


def test_every_sm90a_form_here_runs_race_free_with_its_barriers():
    for g in (STREAMK, FUSED, PLAIN):
        c, ref = conv_emulated(g)
        assert not np.isnan(c).any() and _error(c, ref) < 1e-6
    for t in (Sm90Tiling(bn=16, stages=2), Sm90Tiling(bn=16, stages=2, cluster=2)):
        c, ref = gemm_emulated(512 if t.cluster > 1 else 128, 32, 192, t)
        assert _error(c, ref) < 1e-6


@pytest.mark.parametrize(
    ("skip", "note"),
    [
        (0, "the finisher's barrier after its leader saw the flags: the other threads read partials unordered"),
        (1, "the contributor's barrier before its leader raises the flag: the flag covers only the leader's stores"),
    ],
)
def test_streamk_seam_without_either_named_barrier_races_on_the_partials(monkeypatch, skip, note):
    made = without_call(monkeypatch, conv_sm90.nvvm, "barrier", skip)
    with pytest.raises(Race, match=r"loads element \(0, 0, 0, \d+, 0\) of binding 3 .* stored with no barrier"):
        conv_emulated(STREAMK)
    assert len(made) == 2, note  # the seam's two sync() calls, finisher's first


@pytest.mark.parametrize(
    ("skip", "note"),
    [
        (0, "the finisher leader's fence after the flags: what the flags published is never acquired"),
        (2, "the contributor's fence after its stores: the flag publishes nothing of them"),
    ],
)
def test_streamk_seam_without_its_flag_fences_races_on_the_partials(monkeypatch, skip, note):
    made = without_call(monkeypatch, conv_sm90, "gpu_fence", skip)
    with pytest.raises(Race, match="of binding 3 .* stored with no barrier, fence or flag"):
        conv_emulated(STREAMK)
    assert len(made) == 3, note


@pytest.mark.parametrize(
    ("skip", "note"),
    [
        (0, "the fence between a split's partial and its count: the counter publishes nothing of it"),
        (1, "the last thread's fence after its count: what the counter published is never acquired"),
    ],
)
def test_fused_split_without_its_counter_fences_races_on_the_partials(monkeypatch, skip, note):
    made = without_call(monkeypatch, conv_sm90, "gpu_fence", skip)
    with pytest.raises(Race, match="of binding 3 .* stored with no barrier, fence or flag"):
        conv_emulated(FUSED)
    assert len(made) == 2, note


def test_conv_without_the_barrier_after_mbarrier_init_races_on_the_ring(monkeypatch):
    made = without_call(monkeypatch, kir, "sync", 0)
    with pytest.raises(Race, match="waits on an mbarrier that thread 0 .* initialized, with no barrier after"):
        conv_emulated(PLAIN)
    assert len(made) == 1


def test_a_deeper_ring_runs_race_free_and_its_missing_init_barrier_is_still_caught(monkeypatch):
    for g in (DEEP_PLAIN, DEEP_STREAMK):
        c, ref = conv_emulated(g)
        assert not np.isnan(c).any() and _error(c, ref) < 1e-6
    made = without_call(monkeypatch, kir, "sync", 0)
    with pytest.raises(Race, match="waits on an mbarrier that thread 0 .* initialized, with no barrier after"):
        conv_emulated(DEEP_PLAIN)
    assert len(made) == 1


@pytest.mark.parametrize(("cluster", "m"), [(1, 128), (2, 512)])
def test_gemm_without_the_barrier_after_mbarrier_init_races_on_the_ring(monkeypatch, cluster, m):
    # cluster 2: the cluster barrier also lets the peer's multicast TMA and arrivals reach initialized barriers
    made = without_call(monkeypatch, kir, "sync", 0)
    with pytest.raises(Race, match="mbarrier .*with no barrier after the init"):
        gemm_emulated(m, 32, 192, Sm90Tiling(bn=16, stages=2, cluster=cluster))
    assert len(made) == cluster  # cluster 2 also closes with one


def test_a_race_is_found_whatever_order_the_emulator_runs_the_workgroups(monkeypatch):
    # happens-before, not timing: the contributor's missing barrier is caught with the finisher run last too
    import sm90_emulator

    real = sm90_emulator._run_cluster
    monkeypatch.setattr(sm90_emulator, "_run_cluster", lambda blocks, body: real(blocks[::-1], body))
    without_call(monkeypatch, conv_sm90.nvvm, "barrier", 1)
    with pytest.raises(Race, match="of binding 3"):
        conv_emulated(STREAMK)
