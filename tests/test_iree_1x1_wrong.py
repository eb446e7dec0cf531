"""IREE 3.13's own forms of a 1x1 compute a wrong dW on NVIDIA (docs/decisions.md#iree-1x1-wrong): no path of
the product offers, tunes to, replays or compiles one there; the host's forms, and other problems', stay."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest

from convbw_mlir.build.compile import lowered_text
from convbw_mlir.dispatch import TuningDB, heuristic
from convbw_mlir.dispatch.build import compile_variant
from convbw_mlir.dispatch.select import select
from convbw_mlir.dispatch.tune import _decide, build_database
from convbw_mlir.dispatch.variants import IREE_FORMS, Variant, candidates, known_wrong
from convbw_mlir.pipelines import for_target
from convbw_mlir.problem import ConvBwdWeightProblem

# the H200 run's first problem (bench/results/h200_2026-11-26_iree_1x1_wrong), and a 3x3 beside it
ONE_BY_ONE = ConvBwdWeightProblem.from_ck("2 1 128 2048 512 1 1 7 7 1 1 1 1 0 0 0 0")
THREE_BY_THREE = ConvBwdWeightProblem.from_ck("2 1 8 256 256 3 3 14 14 1 1 1 1 1 1 1 1")


@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
def test_candidates_offer_no_iree_form_of_a_1x1_on_nvidia(target):
    forms = {v.form for v in candidates(ONE_BY_ONE, target, max_plans=0)}
    assert forms == {"convbw"}


def test_iree_forms_stay_where_they_are_not_known_wrong():
    assert {v.form for v in candidates(THREE_BY_THREE, "sm_80", max_plans=0)} == {"convbw", *IREE_FORMS}
    assert all(known_wrong(ONE_BY_ONE, "host", f) is None for f in IREE_FORMS)  # the CPU's are right
    assert known_wrong(ONE_BY_ONE, "sm_80", "convbw") is None


def _row(iree_s: float) -> dict:
    return {"name": "a", "problem": ONE_BY_ONE.to_dict(), "heuristic": "convbw[heuristic]",
            "variants": {"convbw[heuristic]": heuristic(ONE_BY_ONE, "sm_80").to_dict()},
            "contenders": {"convbw[heuristic]": {"status": "ok", "median_s": 100e-6},
                           "iree_direct": {"status": "ok", "median_s": iree_s}}}  # fmt: skip


def test_the_tuner_never_selects_a_known_wrong_iree_form_even_if_its_check_passed():
    row = _row(30e-6)  # faster, and a sampled check that happened to pass
    assert _decide(row, target="sm_80")["winner"] == "convbw[heuristic]"
    db = build_database({"device": "d", "target": "sm_80", "iree_version": "3.13.0", "date": "x", "problems": [row]})
    assert db.lookup(ONE_BY_ONE)["variant"]["form"] == "convbw"


def test_select_never_replays_a_stored_iree_form_of_a_1x1():
    db = TuningDB("NVIDIA H200", "sm_80", "3.13.0")
    db.add(ONE_BY_ONE, Variant("iree_direct"), median_s=30e-6, why="fastest correct")
    with pytest.warns(UserWarning, match="form: iree_direct of a 1x1 on sm_80"):
        sel = select(ONE_BY_ONE, "sm_80", dbs=[db], selector=False)
    assert sel.variant.form == "convbw"


@pytest.mark.parametrize("form", IREE_FORMS)
def test_compiling_a_known_wrong_iree_form_is_refused_naming_it(form):
    with warnings.catch_warnings(), pytest.raises(ValueError, match=f"form: {form} of a 1x1 on sm_90a"):
        compile_variant(ONE_BY_ONE, "sm_90a", Variant(form))


@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("options", [{"strategy": "codegen"}, {"strategy": "codegen", "gemm": "mma"}])
def test_our_codegen_gemm_of_a_1x1_feeds_dy_first(target, options):
    # IREE's mma.sync kernel is right on the dy-first GEMM and wrong on the x-first one (the H200 run): keep it so
    text = lowered_text(ONE_BY_ONE, for_target(target, **options))
    ins = re.search(r"linalg\.generic .*ins\([^:]*: (tensor<[^>]*>), (tensor<[^>]*>)\).*convbw\.contraction", text)
    assert ins is not None and ins.group(1).endswith("x2048xf16>") and ins.group(2).endswith("x512xf16>")


def test_iree_still_gives_the_reproducer_its_mma_sync_config():
    # known_wrong rests on this config of IREE 3.13 (the measured one); another IREE may pick another: re-measure
    from convbw_mlir.build.iree import executable_intermediates

    text = (Path(__file__).parents[1] / "docs" / "repro" / "iree_mma_sync_x_first_gemm.mlir").read_text()
    files = executable_intermediates(text, "sm_80").files
    configured = "".join(body for name, body in files.items() if name.startswith("configured"))
    assert "mma_kind = #iree_gpu.mma_layout<NV_MMA_SYNC_F32_16x8x16_F16>" in configured
    assert "promote_operands = [0, 1]" in configured and "matmul_like_16x16x6272" in configured


def test_no_shipped_database_entry_is_a_known_wrong_iree_form():
    import convbw_mlir

    for path in (Path(convbw_mlir.__file__).parent / "tuning").glob("*.json"):
        if path.name.startswith("selector."):  # a learned selector (trees), not a database: it stores no entries
            continue
        db = TuningDB.load(path)
        for entry in db.entries.values():
            problem = ConvBwdWeightProblem.from_dict(entry["problem"])
            assert known_wrong(problem, db.target, entry["variant"]["form"]) is None, (path.name, entry["name"])
