"""The sm_90a wgmma kernel's ring depth (issue 39 goal 2, ``wgmma-stages``; docs/decisions.md#short-reduction-dense
item 3): the plan option and its refusals (a depth past the tile's shared memory names the most that fits), the
kernel's dW under the sm_90a emulator (exactly the 4-stage plan's at other depths, fewer k tiles than stages
included), the tuner's neighbours on short reductions, and ``select``, which never offers them."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from sm90_emulator import dw_of_plan

from convbw_mlir.dispatch.variants import Variant, candidates
from convbw_mlir.plan import PlanError, check_plan, decide
from convbw_mlir.policies import sm90
from convbw_mlir.problem import ConvBwdWeightProblem
from convbw_mlir.targets import TARGETS

RESNET_L4_1X1 = "2 1 32 2048 512 1 1 7 7 1 1 1 1 0 0 0 0"  # K = 2048, N Ho Wo = 1,568: a short dense reduction
SM90A = TARGETS["sm_90a"]


def _problem(line: str, **fields) -> ConvBwdWeightProblem:
    return ConvBwdWeightProblem.from_ck(line).with_(**{"layout": 2, **fields})


# -- the option ----------------------------------------------------------------------------------------------
def test_the_ring_bytes_are_the_kernels_shared_memory_and_the_deepest_ring_fits_227_kib():
    from convbw_mlir.kernels.gemm_sm90 import Sm90Tiling

    for consumers in (1, 2):
        for bn in (64, 128, 192, 256):
            most = sm90.max_stages(64 * consumers, bn, SM90A)
            for stages in (2, 4, most, most + 1):
                t = Sm90Tiling(bn=bn, consumers=consumers, stages=stages)
                assert sm90.ring_bytes(t.bm, bn, stages) == t.shared_bytes
            assert sm90.ring_bytes(64 * consumers, bn, most) <= SM90A.lds_bytes < sm90.ring_bytes(64 * consumers, bn,
                                                                                                  most + 1)  # fmt: skip
    # 227 KiB a workgroup (CUDA guide, cc 9.0): the 128x256 tile holds today's 4, a 64x64 one 14
    assert SM90A.lds_bytes == 227 * 1024
    most = {(r, n): sm90.max_stages(r, n, SM90A) for r in (64, 128) for n in (64, 128, 192, 256)}
    assert most == {(64, 64): 14, (64, 128): 9, (64, 192): 7, (64, 256): 5,
                    (128, 64): 9, (128, 128): 7, (128, 192): 5, (128, 256): 4}  # fmt: skip


def test_wgmma_stages_sets_the_rings_depth_keeping_the_asked_width_split_and_rows():
    p = _problem(RESNET_L4_1X1)
    default = decide(p, "sm_90a")
    assert sm90.is_sm90(default) and default.tile.stages == 4  # the default is unchanged
    for asked in ({"tile_n": 64}, {"tile_n": 64, "k_batch": 2}, {"tile_n": 128, "k_batch": 4},
                  {"tile_n": 64, "wgmma_rows": 64}):  # fmt: skip
        for stages in (2, 3, 6, 7):
            plan = decide(p, "sm_90a", strategy="explicit", wgmma_stages=stages, **asked)
            assert sm90.is_sm90(plan) and plan.tile.stages == stages and plan.streamk is None, plan
            assert plan.tile.n == asked["tile_n"] and plan.k_batch == asked.get("k_batch", plan.k_batch)
            assert plan.tile.m == asked.get("wgmma_rows", 128)
            check_plan(p, plan)  # a stored plan of it replays
            assert ("wgmma_stages", stages) in plan.decision.options  # op.plan and `convbw select` show it
            again = type(plan).from_dict(plan.to_dict())
            assert again == plan and again.to_dict()["tile"]["stages"] == stages  # JSON round trip
    same = decide(p, "sm_90a", strategy="explicit", tile_n=64, wgmma_stages=4)
    assert same == decide(p, "sm_90a", strategy="explicit", tile_n=64)  # 4 is the default's depth
    # no width given: the rule's among those whose ring fits (256 holds 4, 192 5: 6 stages take 128)
    assert decide(p, "sm_90a", strategy="explicit", wgmma_stages=6).tile.n == 128


def test_a_plan_of_another_depth_is_another_cache_key():
    from convbw_mlir.dispatch.variants import variant_key

    p = _problem(RESNET_L4_1X1)
    keys = {
        variant_key(p, "sm_90a", Variant("convbw", decide(p, "sm_90a", strategy="explicit", tile_n=64, **o)), "3.13.0")
        for o in ({}, {"wgmma_stages": 6}, {"wgmma_stages": 8})
    }
    assert len(keys) == 3


@pytest.mark.parametrize(
    ("line", "asked", "error"),
    [
        (RESNET_L4_1X1, {"strategy": "explicit", "wgmma_stages": 1},
         "wgmma-stages: expected an integer of at least 2, got 1"),
        (RESNET_L4_1X1, {"strategy": "explicit", "wgmma_stages": "8"},
         "wgmma-stages: expected an integer of at least 2, got '8'"),
        (RESNET_L4_1X1, {"wgmma_stages": 8}, "wgmma-stages: 8 applies to strategy explicit only"),
        (RESNET_L4_1X1, {"strategy": "codegen", "wgmma_stages": 8}, "wgmma-stages: 8 applies to strategy explicit"),
        (RESNET_L4_1X1, {"strategy": "explicit", "wgmma_stages": 10, "tile_n": 64},
         "wgmma-stages: 10 (the 128x64 tile's ring of 10 stages needs 246,944 bytes of shared memory, past sm_90a's "
         "232,448 a workgroup: at most 9 stages fit)"),
        (RESNET_L4_1X1, {"strategy": "explicit", "wgmma_stages": 5, "tile_n": 256},
         "wgmma-stages: 5 (the 128x256 tile's ring of 5 stages needs .* at most 4 stages fit)"),
        (RESNET_L4_1X1, {"strategy": "explicit", "wgmma_stages": 15, "tile_n": 64, "wgmma_rows": 64},
         "wgmma-stages: 15 (the 64x64 tile's ring .* at most 14 stages fit)"),
        (RESNET_L4_1X1, {"strategy": "explicit", "wgmma_stages": 8, "stages": 8},
         "wgmma-stages: 8 with stages 8 .options of the sm_80"),
        (RESNET_L4_1X1, {"strategy": "explicit", "wgmma_stages": 8, "tile_m": 64}, "wgmma-stages: 8 with tile-m 64"),
        (RESNET_L4_1X1, {"strategy": "explicit", "wgmma_stages": 8, "producers": 2}, "wgmma-stages: 8 with producers"),
        ("2 32 32 64 1 3 3 14 14 1 1 1 1 1 1 1 1", {"strategy": "explicit", "wgmma_stages": 8},
         "wgmma-stages: 8 on a problem the wgmma kernel does not take: in_channels: 1"),
        ("2 8 32 64 16 3 3 14 14 1 1 1 1 1 1 1 1", {"strategy": "explicit", "wgmma_stages": 8, "wgmma_merge": 4},
         "wgmma-merge: 4 with wgmma-stages 8"),
    ],
)  # fmt: skip
def test_wgmma_stages_is_one_error_naming_it_where_the_kernel_or_tile_cannot_take_it(line, asked, error):
    with pytest.raises(PlanError, match=error.replace("(", r"\(").replace(")", r"\)")):
        decide(_problem(line), "sm_90a", **asked)


def test_a_stored_plan_deeper_than_its_tile_fits_is_refused_naming_the_most():
    import dataclasses

    p = _problem(RESNET_L4_1X1)
    plan = decide(p, "sm_90a", strategy="explicit", tile_n=128, wgmma_stages=7)
    deep = dataclasses.replace(plan, tile=dataclasses.replace(plan.tile, stages=8))
    with pytest.raises(PlanError, match="wgmma-stages: 8 .the 128x128 tile's ring .* at most 7 stages fit"):
        check_plan(p, deep)


def test_wgmma_stages_is_refused_on_the_sm80_kernels_targets_and_for_fp8():
    with pytest.raises(PlanError, match=r"wgmma-stages: 8 on target sm_80 \(the wgmma kernel is written for sm_90a\)"):
        decide(_problem(RESNET_L4_1X1), "sm_80", strategy="explicit", wgmma_stages=8)
    fp8 = _problem(RESNET_L4_1X1, dtype="e4m3", dw_dtype="f32")
    with pytest.raises(PlanError, match="wgmma-stages: 8 .the fp8 GEMM takes k-batch and tile-n only"):
        decide(fp8, "sm_90a", strategy="explicit", wgmma_stages=8)


# -- the kernel, emulated --------------------------------------------------------------------------------------
@functools.cache
def _dw(line: str, stages: int | None, **asked) -> np.ndarray:
    """dW of the plan asked for (``stages`` None: the 4-stage plan), under the emulator; one build a plan."""
    from convbw_mlir.reference import random_inputs

    p = _problem(line, dtype="f16", dw_dtype="f32")
    given = {"strategy": "explicit", **asked} | ({} if stages is None else {"wgmma_stages": stages})
    plan = decide(p, "sm_90a", **given)
    assert plan.tile.stages == (4 if stages is None else stages)
    x, dy = random_inputs(p, seed=3)
    return dw_of_plan(p, plan, x, dy)


K128 = "2 1 4 128 64 1 1 8 8 1 1 1 1 0 0 0 0"  # K = 128 (two consumers), 4 k tiles
C128 = "2 1 4 128 128 1 1 8 8 1 1 1 1 0 0 0 0"  # Y X C = 128: one 128-wide tile, 4 k tiles
TWO_KTILES = "2 1 2 128 64 1 1 8 8 1 1 1 1 0 0 0 0"  # 2 k tiles: fewer than the ring's stages
PAD3X3 = "2 1 3 128 64 3 3 6 6 1 1 1 1 1 1 1 1"  # 3x3 pad 1, 108 positions: 2 k tiles, the last ragged


@pytest.mark.parametrize(
    ("line", "asked", "depths"),
    [
        (K128, {"tile_n": 64}, (2, 3, 6, 8, 9)),  # 9: the most the 128x64 tile's ring fits
        (K128, {"tile_n": 64, "k_batch": 2}, (2, 3, 6, 8, 9)),  # 2 k tiles a split
        (K128, {"tile_n": 64, "wgmma_rows": 64}, (3, 8, 14)),  # one consumer; 14: the 64x64 tile's most
        (C128, {"tile_n": 128}, (2, 3, 6, 7)),  # 7: the 128x128 tile's most
        (C128, {"tile_n": 128, "k_batch": 2}, (3, 7)),
        (TWO_KTILES, {"tile_n": 64}, (3, 8, 9)),  # the ring never fills: no deadlock, no stale slot read
        (TWO_KTILES, {"tile_n": 64, "k_batch": 2}, (8,)),  # one k tile a split, 8 stages
        (PAD3X3, {"tile_n": 128}, (3, 6)),  # 9 taps a row of tiles, the reduction's end read as zeros
    ],
)  # fmt: skip
def test_deeper_and_shallower_rings_compute_exactly_the_4_stage_plans_dw_under_emulation(line, asked, depths):
    from convbw_mlir.reference import random_inputs, reference

    want = _dw(line, None, **asked)
    assert not np.isnan(want).any()
    for stages in depths:
        got = _dw(line, stages, **asked)
        assert not np.isnan(got).any() and np.array_equal(got, want), stages  # the same f32 sums, in the same order
    p = _problem(line, dtype="f16", dw_dtype="f32")
    x, dy = random_inputs(p, seed=3)
    exact = reference(p, x, dy)
    assert np.abs(want.reshape(exact.shape) - exact).max() / np.abs(exact).max() < 1e-6


def test_streamk_with_another_depth_computes_exactly_the_4_stage_streamk_dw_under_emulation():
    """StreamK's persistent ring runs on across a workgroup's tiles (the slot and parity of k tile ``i`` of the
    workgroup, not of the tile): 3 StreamK workgroups over 4 column tiles of 4 k tiles each, so segments start
    mid-tile, at depths that divide neither the segment nor the tile's k tiles."""
    line = "2 1 4 128 256 1 1 8 8 1 1 1 1 0 0 0 0"  # 1x1, C = 256: 4 tiles of 64 columns
    want = _dw(line, None, tile_n=64, streamk=3)
    assert not np.isnan(want).any()
    for stages in (2, 3, 6, 9):
        assert np.array_equal(_dw(line, stages, tile_n=64, streamk=3), want), stages


def test_padded_channels_with_another_depth_compute_exactly_the_4_stage_plans_dw_under_emulation():
    line = "2 1 4 128 72 1 1 8 8 1 1 1 1 0 0 0 0"  # C = 72: two 64-channel boxes a tap
    want = _dw(line, None, tile_n=64, wgmma_pad_channels=True)
    assert not np.isnan(want).any()
    for stages in (3, 8):
        assert np.array_equal(_dw(line, stages, tile_n=64, wgmma_pad_channels=True), want), stages


# -- the tuner and select -----------------------------------------------------------------------------------
def _deeper_options(vs: list[Variant]) -> list[tuple[int, int, int]]:
    return [(v.plan.tile.stages, v.plan.k_batch, v.plan.tile.n) for v in vs if dict(v.options).get("wgmma_stages")]


def test_tuner_leaves_deeper_rings_out_after_they_ran_slower_than_4_stages_on_an_h100():
    """Pack wgmmastages (bench/results/h100_2026-12-06_wgmmastages): at the plan's own split and width a deeper ring
    ran 2% slower than 4 stages over 16 tuned-model pairs, so by the pack's pre-written rule the grid drops them; the
    option stays a user's (and a stored plan's) to ask for."""
    short = _problem(RESNET_L4_1X1)  # 1,568 rows: where the grid used to add 7 and 6 stages
    split = _problem("2 1 32 256 256 3 3 14 14 1 1 1 1 1 1 1 1")  # 6,272 rows: the plan splits
    k64 = _problem("2 1 32 64 512 1 1 7 7 1 1 1 1 0 0 0 0")  # K <= 64: the 64-row tile's ring
    for p in (short, split, k64):
        every = candidates(p, "sm_90a", max_plans=64, iree=False)
        assert sm90.is_sm90(every[0].plan) and len(every) > 4 and not _deeper_options(every)
    asked = decide(short, "sm_90a", strategy="explicit", wgmma_stages=6)
    assert asked.tile.stages == 6
