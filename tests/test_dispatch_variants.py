"""Variant generation: the heuristic first, IREE's forms always, valid distinct plans, the new families."""

from __future__ import annotations

import pytest

from convbw_mlir.dispatch import Variant, candidates, heuristic, row_chunk_variant, variant_key
from convbw_mlir.plan import Plan, PlanError, decide
from convbw_mlir.problem import ConvBwdWeightProblem

RESNET_FIRST = ConvBwdWeightProblem.from_ck("2 1 256 64 3 7 7 230 230 2 2 1 1 0 0 0 0")
RESNET_3X3 = ConvBwdWeightProblem.from_ck("2 1 256 64 64 3 3 56 56 1 1 1 1 1 1 1 1")
RESNEXT = ConvBwdWeightProblem.from_ck("2 32 32 8 8 3 3 28 28 1 1 1 1 1 1 1 1")
RESNET_1X1 = ConvBwdWeightProblem.from_ck("2 1 32 128 128 1 1 28 28 1 1 1 1 0 0 0 0")


def test_candidates_start_with_the_heuristics_plan_and_include_every_iree_form():
    found = candidates(RESNET_3X3, "sm_80")
    assert found[0] == heuristic(RESNET_3X3, "sm_80") and found[0].plan == decide(RESNET_3X3, "sm_80")
    assert [v.form for v in found[1:4]] == ["iree_direct", "iree_torch", "iree_fusilli"]
    assert "--iree-dispatch-creation-enable-split-reduction" in found[3].flags


def test_a_problem_with_an_epilogue_gets_no_torch_form_which_has_none():
    from convbw_mlir.problem import Epilogue

    found = candidates(RESNET_3X3.with_(epilogue=Epilogue("scale", alpha=2.0)), "sm_80")
    assert "iree_torch" not in [v.form for v in found] and "iree_direct" in [v.form for v in found]


def test_grouped_problems_get_no_torch_form_and_gain_our_tile_with_splits():
    found = candidates(RESNEXT, "sm_80", max_plans=4)
    assert "iree_torch" not in [v.form for v in found]
    assert heuristic(RESNEXT, "sm_80").plan.strategy == "explicit"  # the explicit kernel splits G>1 too
    assert decide(RESNEXT, "sm_80", strategy="codegen").k_batch == 1  # the rule the issue names: G>1 never split
    ours = [v.plan for v in found if v.plan is not None and v.plan.tile is not None]
    assert any(p.k_batch > 1 for p in ours), "no split grouped matrix-core variant"


def test_the_resnet_first_layer_gets_our_split_kernel_and_codegen_rivals_with_larger_splits():
    """C = 3 (odd): the explicit kernel's register path (docs/decisions.md#first-layers), split to fill the
    machine; codegen's plan (split 4) and its larger splits stay rivals."""
    found = candidates(RESNET_FIRST, "sm_80", max_plans=4)
    assert found[0].plan.strategy == "explicit" and found[0].plan.k_batch > 16
    codegen = [v.plan.k_batch for v in found if v.plan is not None and v.plan.strategy != "explicit"]
    assert 4 in codegen and max(codegen) >= 16


def test_gemm_problems_get_our_mma_tile_beside_ireess_config():
    found = candidates(RESNET_1X1, "sm_80")
    assert any(v.plan is not None and v.plan.gemm and v.plan.tile is not None for v in found)


def test_candidates_are_distinct_valid_plans_with_even_batch_splits():
    for problem in (RESNET_FIRST, RESNET_3X3, RESNEXT, RESNET_1X1):
        found = candidates(problem, "sm_80", max_plans=6)
        assert len(set(found)) == len(found)
        for v in found:
            if v.plan is None:
                continue
            assert decide(problem, "sm_80", **dict(v.options)) == v.plan  # each re-decides to itself
            if v.plan.split is not None and v.plan.split.dim == "n":
                assert v.plan.split.padded_extent == problem.batch


def test_host_candidates_are_our_pipeline_only():
    found = candidates(RESNET_3X3.with_(batch=4), "host")
    assert {v.form for v in found} == {"convbw"} and len(found) >= 2


def test_unknown_target_is_one_error_naming_it():
    with pytest.raises(ValueError, match="gfx9999"):
        candidates(RESNET_3X3, "gfx9999")


def test_a_variant_round_trips_and_its_key_covers_plan_flags_and_versions():
    v = candidates(RESNET_3X3, "sm_80")[4]
    assert Variant.from_dict(v.to_dict()) == v and Variant.from_dict(v.to_dict()).options == v.options
    keys = {
        variant_key(RESNET_3X3, "sm_80", v, "3.13.0"),
        variant_key(RESNET_3X3, "sm_80", v, "3.14.0"),
        variant_key(RESNET_3X3, "sm_80", heuristic(RESNET_3X3, "sm_80"), "3.13.0"),
        variant_key(RESNET_3X3, "sm_80", Variant("iree_fusilli"), "3.13.0"),
        variant_key(RESNET_3X3, "sm_80", Variant("iree_direct"), "3.13.0"),
        variant_key(RESNET_3X3.with_(batch=128), "sm_80", v, "3.13.0"),
    }
    assert len(keys) == 6


def test_malformed_variants_are_refused_naming_the_field():
    with pytest.raises(ValueError, match="form"):
        Variant("cutlass")
    with pytest.raises(ValueError, match="needs plan"):
        Variant("convbw")
    with pytest.raises(ValueError, match="options"):
        Variant.from_dict({"form": "convbw", "plan": decide(RESNET_3X3, "sm_80").to_dict(), "options": {"warp": 2}})
    with pytest.raises(PlanError):
        Variant.from_dict({"form": "convbw", "plan": {"target": "sm_80", "strategy": "magic"}})


def test_row_chunk_variant_splits_output_rows_for_a_single_image():
    p = ConvBwdWeightProblem.from_ck("2 1 1 8 8 3 3 16 16 1 1 1 1 1 1 1 1")
    v = row_chunk_variant(p, "host", 4)
    assert isinstance(v.plan, Plan) and v.plan.split.dim == "o0" and v.plan.split.k_batch == 4


def test_a_variant_whose_intrinsic_the_target_cannot_run_is_refused():
    plan = decide(RESNET_3X3, "gfx942", k_batch=1)  # an MFMA tile
    rdna = Plan.from_dict({**plan.to_dict(), "target": "gfx1100"})
    with pytest.raises(ValueError, match="intrinsic MFMA_.* does not run on gfx1100"):
        Variant("convbw", rdna)


def test_where_the_plan_chose_the_explicit_kernel_iree_codegen_and_its_grid_are_the_rivals():
    found = candidates(RESNET_3X3, "sm_80")
    assert found[0].plan.strategy == "explicit"
    codegen = decide(RESNET_3X3, "sm_80", strategy="codegen")
    assert any(v.options == (("strategy", "codegen"),) and v.plan == codegen for v in found)
    assert any(v.plan is not None and v.plan.strategy == "mma" and v.plan.k_batch != codegen.k_batch for v in found)
    # layout 4: the channels-last kernel between transposes first (decisions.md#layout4); the gathered kernel
    # (strategy explicit alone) and codegen in layout 4 are its rivals
    layout4 = candidates(RESNET_3X3.with_(layout=4), "sm_80")
    assert layout4[0].plan.strategy == "explicit" and layout4[0].plan.channels_last
    rivals = {v.options: v.plan for v in layout4}
    assert not rivals[(("strategy", "explicit"),)].channels_last and rivals[(("strategy", "explicit"),)].tile
    assert rivals[(("strategy", "codegen"),)].strategy != "explicit"


def test_where_the_plan_merges_thin_groups_one_group_a_gemm_is_a_rival(monkeypatch):
    from convbw_mlir.policies import switches

    monkeypatch.setattr(switches, "MERGE_BY_DEFAULT", True)
    found = candidates(RESNEXT, "sm_80")
    assert found[0].plan.merge is not None
    one = decide(RESNEXT, "sm_80", strategy="explicit", merge_groups=1)
    assert any(v.plan == one for v in found)


def test_distinct_keeps_the_heuristic_first_drops_repeated_plans_and_logs_a_refusal():
    from convbw_mlir.dispatch.variants import distinct

    said = []
    options = [
        ("same", {}),  # the heuristic's own plan again: dropped
        ("split", {"strategy": "explicit", "k_batch": 2}),
        ("bad", {"tile_m": 3}),  # refused by the plan: logged, not raised
        ("split again", {"strategy": "explicit", "k_batch": 2}),
    ]
    found = distinct(RESNEXT, "sm_80", options, log=said.append)
    assert found[0] == heuristic(RESNEXT, "sm_80") and [v.label for v in found[1:]] == ["split"]
    assert len(said) == 1 and said[0].startswith("  bad: refused: ")
