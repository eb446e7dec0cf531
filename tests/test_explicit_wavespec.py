"""Wave specialization in the explicit sm_80 kernel (layout 2): producer warps copy, consumer warps compute.

Numerics without a GPU: ``tests/sm80_emulator.py`` runs the two roles as thread groups interleaved at
their named barriers, with ``cp.async`` landing only at ``cp.async.wait_group``: the kernel must match
float64 whichever role runs ahead, and a barrier removed or misplaced must show (a wrong result or a
deadlock). The GPU numbers: bench/explicit_wavespec.py, docs/explicit-kernels.md "Wave specialization".
"""

from __future__ import annotations

import numpy as np
import pytest
from sm80_emulator import Deadlock, run_module

from convbw_mlir import compile_op
from convbw_mlir.build.iree import executable_intermediates
from convbw_mlir.kernels import wavespec_sm80
from convbw_mlir.plan import Plan, PlanError, decide, explicit_tiling
from convbw_mlir.policies.sm80 import GemmTiling, gemm_shape, wavespec_problems, wavespec_threads
from convbw_mlir.problem import ConvBwdWeightProblem as P
from convbw_mlir.reference import random_inputs, reference

PADDED = "2 1 2 36 16 3 3 7 7 1 1 1 1 1 1 1 1"  # K = 36 (4-channel copies of dy), padded 3x3, 7x7, N = 2
LONG = "2 1 4 16 8 3 3 8 8 1 1 1 1 1 1 1 1"  # 256 positions: 4 k tiles of 64, more than the 3 stages


def emulated_error(p: P, first: str = "else", **options) -> float:
    """Max error of the emulated module (the kernel, and a split's own stage 2) against float64, relative
    to the largest entry."""
    from convbw_mlir.dialects import convbw
    from convbw_mlir.passes.explicit_kernel import ExplicitKernel
    from convbw_mlir.passes.framework import collect_ops

    from convbw_mlir.ir_imports import new_context

    plan = decide(p, "sm_80", strategy="explicit", **options)
    threads = wavespec_threads(explicit_tiling(plan), plan.wavespec.producers) if plan.wavespec else None
    x, dy = random_inputs(p, seed=3)
    with new_context():
        module = convbw.build_module(p, plan)
        ExplicitKernel().run(module.operation)
        (fn,) = [f for f in collect_ops(module.operation, "func.func") if "translation_info" in f.attributes]
        assert threads is None or f"workgroup_size = [{threads}, 1, 1]" in str(fn.attributes["translation_info"])
        got = run_module(module, [x, dy], first=first).astype(np.float64)
    exact = reference(p, x, dy)
    return float(np.abs(got - exact).max() / np.abs(exact).max())


@pytest.mark.parametrize("first", ["else", "then"])  # producers run ahead / consumers run ahead
@pytest.mark.parametrize(
    ("ck", "options"),
    [
        (LONG, {"producers": 4}),  # 4 k tiles through 3 stages: the empty barriers are waited on
        (LONG, {"producers": 2, "stages": 2, "tile_m": 64, "tile_n": 128, "subgroups_m": 2, "subgroups_n": 2}),
        (PADDED, {"producers": 2, "k_batch": 2}),  # split-K: each split's own k range
        ("2 1 2 16 8 3 3 9 9 2 2 2 2 1 1 1 1", {"producers": 4}),  # stride 2, dilation 2
        ("2 2 4 36 16 3 3 7 7 1 1 1 1 1 1 1 1", {"producers": 4, "k_batch": 3}),  # 2 groups, 3 uneven splits
        ("2 1 3 16 24 1 1 6 6 1 1 1 1 0 0 0 0", {"producers": 2, "tile_m": 128, "tile_n": 128}),  # a plain 1x1
    ],
)  # fmt: skip
def test_wavespec_kernel_matches_float64_whichever_role_runs_ahead(ck, options, first):
    assert emulated_error(P.from_ck(ck), first, **options) < 2e-3


def test_the_plain_kernel_still_matches_under_asynchronous_copies():
    """The emulator's cp.async now lands at wait_group: the plain pipeline's accounting holds there."""
    assert emulated_error(P.from_ck(LONG), "else") < 2e-3


def _without(monkeypatch, name: str, keep) -> None:
    """Drop the calls of wavespec_sm80's ``name`` (a barrier helper) for which ``keep(first)`` is false."""
    real = getattr(wavespec_sm80, name)
    monkeypatch.setattr(wavespec_sm80, name, lambda ix, first, *a: real(ix, first, *a) if keep(first) else None)


def _broken(first: str, **options) -> bool:
    """The emulated kernel fails: a wrong (or NaN) result, or a deadlock at its barriers."""
    try:
        return not emulated_error(P.from_ck(LONG), first, **options) < 2e-3
    except Deadlock:
        return True


def test_without_the_empty_barrier_the_producers_lap_the_consumers(monkeypatch):
    """Producers running ahead refill stages still being read, and their full arrivals of two laps
    complete a barrier without the consumers (bar.arrive counts threads, not phases): a deadlock."""
    _without(monkeypatch, "_wait", lambda first: first == 1)  # producers no longer wait on empty[s]
    _without(monkeypatch, "_arrive", lambda first: first == 1)  # (nor do consumers arrive on it)
    assert _broken("else", producers=4)


def test_without_the_full_barrier_the_consumers_read_copies_that_have_not_landed(monkeypatch):
    _without(monkeypatch, "_wait", lambda first: first != 1)
    _without(monkeypatch, "_arrive", lambda first: first != 1)
    assert _broken("then", producers=4)


def test_announcing_a_stage_before_its_copies_complete_is_wrong(monkeypatch):
    """The producers' cp.async.wait_group before bar.arrive full[s] is what makes the stage whole."""
    from convbw_mlir.kernels import wavespec_sm80 as ws

    real = ws.nvvm.cp_async_wait_group
    monkeypatch.setattr(ws.nvvm, "cp_async_wait_group", lambda n: real(n + 1 if n > 0 else n))  # one group short
    assert _broken("then", producers=4)


def test_consumers_waiting_for_the_next_stage_before_freeing_theirs_deadlock_with_two_stages(monkeypatch):
    """The order the module doc argues: arrive empty[kt] before waiting full[kt+1]. With two stages the
    other order deadlocks: the producers announce kt+1 only after issuing kt+2, into the stage of kt."""
    from convbw_mlir.kernels import wavespec_sm80 as ws

    real_arrive, real_wait = ws._arrive, ws._wait
    held: list = []

    def arrive(ix, first, stage, count):  # hold the consumers' empty arrival until after the next wait
        if first == 1:
            return real_arrive(ix, first, stage, count)
        held.append((ix, first, stage, count))

    def wait(ix, first, stage, count):
        real_wait(ix, first, stage, count)
        while held:
            real_arrive(*held.pop())

    monkeypatch.setattr(ws, "_arrive", arrive)
    monkeypatch.setattr(ws, "_wait", wait)
    with pytest.raises(Deadlock):
        emulated_error(P.from_ck(LONG), "else", producers=4, stages=2, tile_m=64, tile_n=128, subgroups_m=2,
                       subgroups_n=2)  # fmt: skip


def test_plan_records_producers_beside_the_same_tiling_and_split():
    p = P.from_ck(PADDED)
    plain = decide(p, "sm_80", strategy="explicit", k_batch=2)
    ws = decide(p, "sm_80", strategy="explicit", k_batch=2, producers=4)
    assert (ws.tile, ws.split) == (plain.tile, plain.split) and plain.wavespec is None
    assert ws.wavespec.producers == 4 and Plan.from_dict(ws.to_dict()) == ws
    assert ws.to_dict()["wavespec"] == {"producers": 4}


@pytest.mark.parametrize(
    ("problem", "options", "message"),
    [
        (PADDED, {"producers": 3}, "producers: expected 2 or 4 producer warps, got 3"),
        (PADDED, {"producers": "4"}, "producers: expected 2 or 4 producer warps, got '4'"),
        (PADDED, {"producers": 4, "strategy": None}, "producers: 4 applies to strategy explicit only"),
        ("2 1 256 256 256 3 3 14 14 1 1 1 1 1 1 1 1", {"producers": 2},  # the rule's 128x256: 8 warps
         "producers: 2 with the 128x256 tiling's 8 warps: 10 warps x 32 x ~232 registers = 74240 > 65536"),
        (PADDED, {"producers": 4, "tile_n": 256}, "producers: 4 with the 128x256 tiling's 8 warps"),
        (PADDED, {"producers": 4, "streamk": 132}, "producers: 4 with streamk"),
    ],
)  # fmt: skip
def test_producers_refusals_name_the_option_and_value(problem, options, message):
    options = {"strategy": "explicit", **options}
    with pytest.raises(PlanError) as e:
        decide(P.from_ck(problem), "sm_80", **options)
    assert message in str(e.value)


def test_producers_refused_in_layout_4_and_on_amd_targets():
    with pytest.raises(PlanError, match=r"producers: 4 in layout NGCHW/GKCYX/NGKHW \(wave specialization is"):
        decide(P.from_ck(PADDED).with_(layout=4), "sm_80", strategy="explicit", producers=4)
    with pytest.raises(PlanError, match="producers: 2 on target gfx942 .*sm_80 only"):
        decide(P.from_ck(PADDED).with_(layout=4), "gfx942", strategy="explicit", producers=2)


def test_a_stored_plan_with_producers_is_checked_again():
    from convbw_mlir.plan import check_plan

    p = P.from_ck("2 1 256 256 256 3 3 14 14 1 1 1 1 1 1 1 1")
    plan = Plan.from_dict({**decide(p, "sm_80", strategy="explicit").to_dict(), "wavespec": {"producers": 4}})
    with pytest.raises(PlanError, match="producers: 4 with the 128x256 tiling"):
        check_plan(p, plan)


def test_register_budget_admits_4_warp_tilings_and_refuses_the_8_warp_recipe():
    shape = gemm_shape(P.from_ck("2 1 256 256 256 3 3 14 14 1 1 1 1 1 1 1 1"))
    for tiling in (GemmTiling(128, 128, 64, 3, 64, 64), GemmTiling(64, 128, 64, 3, 32, 64)):
        for producers in (2, 4):
            assert wavespec_problems(shape, tiling, producers) == []
    assert "65536" in wavespec_problems(shape, GemmTiling(), 2)[0]


def test_wavespec_kernel_compiles_for_sm80_in_a_child_with_named_barriers():
    p = P.from_ck("2 1 4 64 32 3 3 14 14 1 1 1 1 1 1 1 1")
    tiling = {"tile_m": 64, "tile_n": 128, "subgroups_m": 2, "subgroups_n": 2}  # 4 consumer warps of 32x64
    op = compile_op(p, "sm_80", strategy="explicit", producers=4, isolate=True, cache=False, **tiling)
    assert op.plan.wavespec.producers == 4 and len(op.vmfb) > 10_000
    llvm = executable_intermediates(op.stages["linalg"], "sm_80").isa
    for instruction in ("llvm.nvvm.barrier.cta.sync.aligned.count", "llvm.nvvm.barrier.cta.arrive.aligned.count",
                        "llvm.nvvm.cp.async.cg.shared.global.16.s", "llvm.nvvm.ldmatrix.sync.aligned.m8n8.x4.trans.b16",
                        "llvm.nvvm.mma.m16n8k16.row.col.f32.f32"):  # fmt: skip
        assert instruction in llvm
    assert '"nvvm.maxntid"="256,1,1"' in llvm  # 4 consumer + 4 producer warps
