"""The sm_90a wgmma kernel's 64-row tile on K > 64 (issue 39 goal 2, ``wgmma-rows``): the plan option and its
refusals, the kernel's dW under the sm_90a emulator (exactly the 128-row plan's), the tuner's neighbours on short
reductions, and ``select``, whose learned selector never saw the tile, offered and choosing what it did before."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from convbw_mlir.dispatch import variants
from convbw_mlir.dispatch.select import learned_selector, select
from convbw_mlir.dispatch.variants import SHORT_DENSE_REDUCTION, Variant, candidates
from convbw_mlir.plan import PlanError, check_plan, decide
from convbw_mlir.policies import sm90
from convbw_mlir.problem import ConvBwdWeightProblem
from convbw_mlir.suites import load_suite

RESNET_L4_1X1 = "2 1 32 2048 512 1 1 7 7 1 1 1 1 0 0 0 0"  # K = 2048, N Ho Wo = 1,568: a short dense reduction
HELDBACK = Path(__file__).resolve().parents[1] / "bench" / "heldback"


def _problem(line: str, **fields) -> ConvBwdWeightProblem:
    return ConvBwdWeightProblem.from_ck(line).with_(**{"layout": 2, **fields})


def _rows(plan) -> tuple[int, int]:
    return plan.tile.m, plan.tile.subgroups_m


# -- the option ----------------------------------------------------------------------------------------------
def test_wgmma_rows_64_on_k_over_64_takes_one_consumer_warpgroup_keeping_the_asked_width_and_split():
    p = _problem(RESNET_L4_1X1)
    assert _rows(decide(p, "sm_90a")) == (128, 2)  # the default is unchanged
    for asked in ({}, {"k_batch": 2}, {"tile_n": 64}, {"k_batch": 4, "tile_n": 256}):
        plan = decide(p, "sm_90a", strategy="explicit", wgmma_rows=64, **asked)
        assert sm90.is_sm90(plan) and _rows(plan) == (64, 1) and plan.streamk is None, plan
        assert plan.k_batch == asked.get("k_batch", plan.k_batch) and plan.tile.n == asked.get("tile_n", plan.tile.n)
        check_plan(p, plan)  # a stored plan of it replays
        assert ("wgmma_rows", 64) in plan.decision.options  # op.plan and `convbw select` show what was asked
    assert _rows(decide(p, "sm_90a", strategy="explicit", wgmma_rows=128)) == (128, 2)
    k64 = _problem("2 1 32 64 512 1 1 7 7 1 1 1 1 0 0 0 0")
    assert _rows(decide(k64, "sm_90a", strategy="explicit", wgmma_rows=64)) == (64, 1)  # K <= 64: the default


@pytest.mark.parametrize(
    ("line", "asked", "error"),
    [
        (RESNET_L4_1X1, {"strategy": "explicit", "wgmma_rows": 96}, "wgmma-rows: expected 64 or 128, got 96"),
        (RESNET_L4_1X1, {"strategy": "explicit", "wgmma_rows": "64"}, "wgmma-rows: expected 64 or 128, got '64'"),
        (RESNET_L4_1X1, {"wgmma_rows": 64}, "wgmma-rows: 64 applies to strategy explicit only"),
        (RESNET_L4_1X1, {"strategy": "codegen", "wgmma_rows": 64}, "wgmma-rows: 64 applies to strategy explicit"),
        (RESNET_L4_1X1, {"strategy": "explicit", "wgmma_rows": 64, "streamk": "auto"}, "wgmma-rows: 64 with streamk"),
        (RESNET_L4_1X1, {"strategy": "explicit", "wgmma_rows": 64, "tile_m": 64}, "wgmma-rows: 64 with tile-m 64"),
        (RESNET_L4_1X1, {"strategy": "explicit", "wgmma_rows": 64, "producers": 2}, "wgmma-rows: 64 with producers"),
        ("2 1 32 64 512 1 1 7 7 1 1 1 1 0 0 0 0", {"strategy": "explicit", "wgmma_rows": 128},
         "wgmma-rows: 128 with out_channels 64"),
        ("2 32 32 64 1 3 3 14 14 1 1 1 1 1 1 1 1", {"strategy": "explicit", "wgmma_rows": 64},
         "wgmma-rows: 64 on a problem the wgmma kernel does not take: in_channels: 1"),
        ("2 8 32 64 16 3 3 14 14 1 1 1 1 1 1 1 1", {"strategy": "explicit", "wgmma_rows": 64, "wgmma_merge": 4},
         "wgmma-merge: 4 with wgmma-rows 64"),
    ],
)  # fmt: skip
def test_wgmma_rows_is_one_error_naming_it_where_the_kernel_or_form_cannot_take_it(line, asked, error):
    with pytest.raises(PlanError, match=error.replace("(", r"\(")):
        decide(_problem(line), "sm_90a", **asked)


def test_wgmma_rows_is_refused_on_the_sm80_kernels_targets_and_for_fp8():
    with pytest.raises(PlanError, match=r"wgmma-rows: 64 on target sm_80 \(the wgmma kernel is written for sm_90a\)"):
        decide(_problem(RESNET_L4_1X1), "sm_80", strategy="explicit", wgmma_rows=64)
    fp8 = _problem(RESNET_L4_1X1, dtype="e4m3", dw_dtype="f32")
    with pytest.raises(PlanError, match="wgmma-rows: 64 .the fp8 GEMM takes k-batch and tile-n only"):
        decide(fp8, "sm_90a", strategy="explicit", wgmma_rows=64)


# -- the kernel, emulated --------------------------------------------------------------------------------------
def _dw_of_plan(p: ConvBwdWeightProblem, plan) -> np.ndarray:
    """dW of ``plan``'s sm_90a conv kernel as the pass builds it, under the emulator (split partials summed)."""
    from convbw_mlir.dialects import convbw
    from convbw_mlir.passes.explicit_kernel import ExplicitKernel
    from sm90_emulator import run_conv

    from convbw_mlir.ir_imports import new_context
    from convbw_mlir.kernels.conv_sm90 import from_problem
    from convbw_mlir.kernels.gemm_sm90 import Sm90Tiling
    from convbw_mlir.reference import random_inputs

    t = plan.tile
    g = from_problem(p, Sm90Tiling(bn=t.n, consumers=t.subgroups_m, stages=t.stages), plan.k_batch, 0, 0)
    x, dy = random_inputs(p, seed=3)
    with new_context():
        module = convbw.build_module(p, plan)
        ExplicitKernel().run(module.operation)
        out = run_conv(module, dy.reshape(g.reduction, -1), x.reshape(*x.shape[:-2], -1), g)
    return out.sum(0) if out.ndim == 4 else out


@pytest.mark.parametrize("k_batch", [1, 2])
@pytest.mark.parametrize("k", [128, 192, 320])  # 2, 3 and 5 tiles of 64 rows (an odd multiple)
def test_64_row_plan_on_k_over_64_computes_exactly_the_128_row_plans_dw_under_emulation(k, k_batch):
    from convbw_mlir.reference import random_inputs, reference

    p = ConvBwdWeightProblem(1, 4, 64, k, (8, 8), (1, 1), dtype="f16", dw_dtype="f32", layout=2)
    wide = decide(p, "sm_90a", strategy="explicit", k_batch=k_batch)
    narrow = decide(p, "sm_90a", strategy="explicit", k_batch=k_batch, wgmma_rows=64)
    assert _rows(wide) == (128, 2) and _rows(narrow) == (64, 1) and wide.k_batch == narrow.k_batch == k_batch
    got, want = _dw_of_plan(p, narrow), _dw_of_plan(p, wide)
    assert not np.isnan(got).any() and np.array_equal(got, want)  # the same f32 sums, in the same order
    x, dy = random_inputs(p, seed=3)
    exact = reference(p, x, dy)
    assert np.abs(got.reshape(exact.shape) - exact).max() / np.abs(exact).max() < 1e-6


# -- the tuner and select -----------------------------------------------------------------------------------
def _rows64_options(vs: list[Variant]) -> list[tuple[int, int]]:
    return [(v.plan.k_batch, v.plan.tile.n) for v in vs if dict(v.options).get("wgmma_rows") == 64]


def test_tuner_tries_the_64_row_tile_on_short_dense_reductions_unsplit_and_split_at_two_widths():
    p = _problem(RESNET_L4_1X1)
    base, *rivals = candidates(p, "sm_90a", max_plans=12, iree=False)
    kb, n = base.plan.k_batch, base.plan.tile.n
    assert _rows(base.plan) == (128, 2) and p.batch * 49 <= SHORT_DENSE_REDUCTION
    want = list(dict.fromkeys((k, w) for w in (n, 64) for k in (1, kb)))
    assert _rows64_options(rivals) == want
    assert all(_rows(v.plan) == (64, 1) for v in rivals if dict(v.options).get("wgmma_rows"))
    assert _rows64_options(candidates(p, "sm_90a", max_plans=2, iree=False)) == [want[0]]  # second: unsplit first
    split = _problem("2 1 32 256 256 3 3 14 14 1 1 1 1 1 1 1 1")  # 6,272 rows: at the bound, the plan splits
    base, *rivals = candidates(split, "sm_90a", max_plans=12, iree=False)
    assert base.plan.k_batch > 1 and {(1, base.plan.tile.n), (base.plan.k_batch, 64)} <= set(_rows64_options(rivals))
    longer = _problem("2 1 64 256 256 3 3 14 14 1 1 1 1 1 1 1 1")  # 12,544 rows: past the bound
    assert not _rows64_options(candidates(longer, "sm_90a", max_plans=12, iree=False))
    k64 = _problem("2 1 32 64 512 1 1 7 7 1 1 1 1 0 0 0 0")  # K <= 64: the plan's tile is 64 rows already
    assert not _rows64_options(candidates(k64, "sm_90a", max_plans=12, iree=False))
    every = candidates(p, "sm_90a", max_plans=64, iree=False)
    without = candidates(p, "sm_90a", max_plans=64, iree=False, wgmma_rows=False)  # what select offers
    assert without == [v for v in every if not set(variants.UNSEEN) & set(dict(v.options))]
    assert len(_rows64_options(every)) == 2 and not _rows64_options(without)


def _held_back_rows() -> list[ConvBwdWeightProblem]:
    return [
        p.with_(layout=2) for tsv in ("dense2d.tsv", "dense2d_b.tsv") for t in ("bf16", "f16")
        for _, p in load_suite(HELDBACK / tsv, t)
    ]  # fmt: skip


def select_run(monkeypatch):
    """A function that runs ``select`` with the installed learned selector on every held-back row (bench/heldback.py
    select) and returns each row's path, variant and plan, then what the selector was offered on each: the list a
    test compares before and after a change to the tuner's grid."""
    selector = learned_selector("sm_90a")
    assert selector is not None
    offered: list = []
    choose = selector.choose

    def recording(problem, options):
        offered.append([(v.name, v.plan) for v in options])
        return choose(problem, options)

    monkeypatch.setattr(selector, "choose", recording)
    rows = _held_back_rows()

    def run() -> list:
        offered.clear()
        chosen = [select(p, "sm_90a", dbs=[], selector=selector) for p in rows]
        return [(s.path, s.variant.name, s.variant.plan) for s in chosen] + list(offered)

    return run


def test_select_offers_and_chooses_on_both_held_back_sets_as_without_the_64_row_tile(monkeypatch):
    """The installed selector's trees never saw a 64-row wgmma tile on K > 64: what select offers it (and so its
    choice) on every held-back row (bench/heldback.py select) is what it was before the tile joined the grid."""
    run, rows = select_run(monkeypatch), _held_back_rows()
    now = run()
    # the tile is in the tuner's candidates of some of these rows (the default max_plans select asks for)
    assert sum(bool(_rows64_options(candidates(p, "sm_90a", iree=False))) for p in rows) >= 10
    monkeypatch.setattr(variants, "_rows64", lambda problem, base: iter(()))  # the grid before the tile
    before = run()
    assert len(now) == 2 * len(rows) == 232 and now == before
