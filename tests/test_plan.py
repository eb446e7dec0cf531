"""The plan: every decision for a problem on a target is made once, by convbw_mlir.plan.decide, and
the plan travels through the IR as data that round-trips and replays."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

from convbw_mlir.plan import Plan, PlanError, SimtTile, Split, Strategy, Tile, decide
from convbw_mlir.problem import ConvBwdWeightProblem
from convbw_mlir.targets import TARGETS, TilePolicy

DENSE = ConvBwdWeightProblem.from_ck("2 1 32 128 128 3 3 14 14 1 1 1 1 1 1 1 1")
GROUPED = ConvBwdWeightProblem.from_ck("2 32 32 8 8 3 3 28 28 1 1 1 1 1 1 1 1")
DEPTHWISE = ConvBwdWeightProblem.from_ck("2 96 32 1 1 3 3 112 112 2 2 1 1 1 1 1 1")  # rows split pays
ONE_BY_ONE = ConvBwdWeightProblem.from_ck("2 1 32 128 128 1 1 28 28 1 1 1 1 0 0 0 0")


def test_a_plan_round_trips_through_plain_data_and_is_hashable():
    plan = decide(DENSE, "gfx942", k_batch=4)
    again = Plan.from_dict(plan.to_dict())
    assert again == plan and hash(again) == hash(plan)
    assert plan.to_dict()["split"] == {"dim": "n", "k_batch": 4, "chunk": 8}
    assert {plan, again} == {plan}  # usable as a key of a tuner's table


def test_each_family_of_problem_gets_its_strategy_from_one_decision():
    assert decide(DENSE, "gfx942").strategy is Strategy.MMA
    assert decide(DENSE, "host").strategy is Strategy.IREE  # IREE's CPU codegen, no tile
    assert decide(GROUPED, "sm_80", strategy="codegen").strategy is Strategy.IREE  # the policy for grouped problems
    assert decide(GROUPED, "gfx1100").strategy is Strategy.MMA  # RDNA's policy: our tiles
    assert decide(GROUPED, "sm_80", grouped="mma").strategy is Strategy.MMA  # an override wins
    dw = decide(DEPTHWISE, "sm_80", strategy="codegen")  # the default is the depthwise kernel (below)
    assert dw.strategy is Strategy.SIMT and dw.split.promoted == ("n", "o0") and isinstance(dw.simt, SimtTile)
    gemm = decide(ONE_BY_ONE, "gfx942")
    assert gemm.gemm and gemm.strategy is Strategy.IREE
    assert decide(ONE_BY_ONE, "gfx942", gemm="mma").tile is not None


def test_the_split_and_the_tile_are_sized_for_the_planning_target():
    sm80 = decide(DENSE, "sm_80", strategy="codegen")
    assert sm80.split is not None and sm80.tile.intrinsic == "NV_MMA_SYNC_F32_16x8x16_F16"
    host_for_gpu = decide(DENSE, "host", plan_for="sm_80")
    assert host_for_gpu.split == sm80.split and host_for_gpu.tile is None
    assert decide(DENSE, "host").split is None  # no CU model, no split


def test_the_plan_chooses_the_explicit_kernel_for_one_group_channels_last_on_nvidia():
    from convbw_mlir.problem import Epilogue

    assert DENSE.layout == "NHWGC/GKYXC/NHWGK" and decide(DENSE, "sm_80").strategy is Strategy.EXPLICIT
    assert decide(DENSE, "sm_86").strategy is Strategy.EXPLICIT  # its smaller shared memory: the rule's 2 stages
    assert decide(GROUPED, "sm_80").strategy is Strategy.EXPLICIT  # 8 channels a group: matrix cores pay
    assert decide(DENSE.with_(dtype="bf16", dw_dtype="bf16"), "sm_80").strategy is Strategy.EXPLICIT  # measured too
    dw = decide(DEPTHWISE, "sm_80")  # the depthwise kernel, fenced and measured: decisions.md#depthwise-by-default
    assert dw.strategy is Strategy.EXPLICIT and dw.depthwise is not None and dw.depthwise.vector == 4  # wide form
    thin = decide(ConvBwdWeightProblem.from_ck("2 32 32 4 4 3 3 56 56 1 1 1 1 1 1 1 1"), "sm_80")
    assert thin.merge is not None  # 4 channels a group: 16 groups merged in one GEMM (decisions.md#thin-groups)
    assert decide(GROUPED, "sm_80").merge is not None  # 8 a group: merged too
    assert decide(DEPTHWISE, "sm_80", strategy="codegen").strategy is Strategy.SIMT  # asked for, codegen's
    # odd channels (register path) and epilogues (in the store): measured 2026-11-25 (decisions.md#first-layers)
    assert decide(DENSE.with_(in_channels=3), "sm_80").strategy is Strategy.EXPLICIT
    assert decide(DENSE.with_(epilogue=Epilogue("scale", 0.5)), "sm_80").strategy is Strategy.EXPLICIT
    # layout 4: the channels-last kernel between transposes (decisions.md#layout4)
    assert decide(DENSE.with_(layout=4), "sm_80").channels_last
    not_chosen = {
        "AMD": decide(DENSE, "gfx942"),  # compiled, never run: no AMD GPU measured it
        "layout 4, gathered": decide(DENSE.with_(layout=4), "sm_80", layout4="gather"),
        "f32": decide(DENSE.with_(dtype="f32", dw_dtype="f32"), "sm_80"),
        "codegen asked": decide(DENSE, "sm_80", strategy="codegen"),
        "an IREE tile option": decide(DENSE, "sm_80", tile_m=64),
        "a k-batch": decide(DENSE, "sm_80", k_batch=4),
        "an op that arrives split": decide(DENSE, "sm_80", split=Split("n", 2, 16)),
    }
    assert {why: plan.strategy for why, plan in not_chosen.items() if plan.strategy is Strategy.EXPLICIT} == {}
    with pytest.raises(PlanError, match="strategy: expected explicit or codegen"):
        decide(DENSE, "sm_80", strategy="mma")


def test_a_target_s_tile_policy_comes_from_the_target_table_alone(monkeypatch):
    custom = dataclasses.replace(TARGETS["gfx942"], name="gfx942x", tile_policy=TilePolicy(grouped="mma"))
    monkeypatch.setitem(TARGETS, "gfx942x", custom)
    assert decide(GROUPED, "gfx942").strategy is Strategy.IREE
    plan = decide(GROUPED, "gfx942x")
    assert plan.strategy is Strategy.MMA and plan.target == "gfx942x"


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"tile_m": -16}, "tile-m: expected a positive integer, got -16"),
        ({"tile_m": 0}, "tile-m: expected a positive integer, got 0"),
        ({"tile_k": 1.5}, "tile-k: expected a positive integer, got 1.5"),
        ({"stages": True}, "stages: expected a positive integer, got True"),
        ({"k_batch": 0}, "k-batch: expected auto, rows or a positive integer, got 0"),
        ({"k_batch": "some"}, "k-batch: expected auto, rows or a positive integer, got 'some'"),
        ({"grouped": "ours"}, "grouped: expected mma or iree, got 'ours'"),
        ({"plan_for": "gfx908"}, "plan-for: unknown target 'gfx908'"),
        ({"tile_q": 3}, "options: unknown tile-q"),
        ({"tile_m": 24}, "tile-m: 24 is not a multiple of"),
        ({"tile_m": 4096, "tile_k": 64}, "exceeds LDS"),
    ],
)
def test_bad_overrides_are_refused_naming_the_option_and_value(overrides, message):
    with pytest.raises(PlanError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        decide(DENSE, "gfx942", **overrides)


def test_a_tile_given_where_the_strategy_takes_none_is_refused_not_dropped():
    with pytest.raises(PlanError, match="tile-m: strategy iree takes no tile here .grouped"):
        decide(GROUPED, "sm_80", tile_m=64)
    with pytest.raises(PlanError, match="tile-n: strategy simt takes no tile here"):
        decide(DEPTHWISE, "sm_80", strategy="codegen", tile_n=64)
    with pytest.raises(PlanError, match="target: unknown target 'gfx908'"):
        decide(DENSE, "gfx908")


def test_a_malformed_plan_is_refused_with_what_is_wrong():
    good = decide(DENSE, "gfx942").to_dict()
    with pytest.raises(PlanError, match="unknown entries speed"):
        Plan.from_dict({**good, "speed": 3})
    with pytest.raises(PlanError, match="plan.strategy: expected one of mma, simt, iree, explicit, got 'fast'"):
        Plan.from_dict({**good, "strategy": "fast"})
    with pytest.raises(PlanError, match="missing entry 'target'"):
        Plan.from_dict({k: v for k, v in good.items() if k != "target"})
    with pytest.raises(PlanError, match="unknown target"):
        Plan.from_dict({**good, "target": "gfx908"})


@pytest.mark.parametrize(
    "change, message",
    [
        ({"split": {"dim": "n", "k_batch": 2}}, r"plan\.split\.chunk: missing"),
        (
            {"split": {"dim": "n", "k_batch": "2", "chunk": 1}},
            r"plan\.split\.k_batch: expected an integer >= 1, got '2'",
        ),
        ({"split": {"dim": "n", "k_batch": 0, "chunk": 1}}, r"plan\.split\.k_batch: expected an integer >= 1, got 0"),
        ({"split": [2]}, r"plan\.split: expected a dictionary, got \[2\]"),
        ({"tile": {"m": 64}}, r"plan\.tile\.n: missing"),
        ({"simt": {"rows": 1, "groups": 1, "channels": 1, "speed": 2}}, r"plan\.simt: unknown entries speed"),
        ({"streamk": {"workgroups": 4, "fixup": "fast"}}, r"plan\.streamk\.fixup: expected one of linear, tree"),
        ({"gemm": "yes"}, r"plan\.gemm: expected true or false, got 'yes'"),
    ],
)
def test_a_malformed_plan_part_names_the_field_and_value_not_python_internals(change, message):
    good = decide(DENSE, "gfx942").to_dict()
    with pytest.raises(PlanError, match=message) as e:
        Plan.from_dict({**good, **change})
    assert "__init__" not in str(e.value) and "positional" not in str(e.value)


def test_the_passes_carry_out_the_plan_in_the_ir_instead_of_deciding_again():
    from convbw_mlir.build.compile import lowered_text
    from convbw_mlir.pipelines import for_target

    plan = decide(DENSE, "gfx942", k_batch=2, tile_m=64, tile_n=32, stages=3)
    text = lowered_text(DENSE, for_target("gfx942", k_batch=2, tile_m=64, tile_n=32, stages=3))
    assert "k_batch = 2 : i64" in text and "workgroup = [1, 64, 1, 1, 32, 0]" in text
    assert "prefetch_num_stages = 3" in text
    assert plan.tile == Tile(64, 32, 64, 2, 2, 3, "MFMA_F32_16x16x16_F16")
    assert plan.split == Split("n", 2, 16)


def test_numpy_integers_are_taken_as_overrides_and_numpy_floats_and_bools_are_not():
    plan = decide(DENSE, "gfx942", k_batch=np.int64(2), tile_m=np.int32(64))
    assert plan.split.k_batch == 2 and plan.tile.m == 64 and type(plan.tile.m) is int
    with pytest.raises(PlanError, match="k-batch"):
        decide(DENSE, "gfx942", k_batch=np.float64(2.0))
    with pytest.raises(PlanError, match="tile-m"):
        decide(DENSE, "gfx942", tile_m=np.bool_(True))


@pytest.mark.parametrize(
    ("target", "ck", "k_batch", "message"),
    [
        ("host", "2 1 8 16 16 3 3 8 8 1 1 1 1 1 1 1 1", 5, "a batch of 8 in splits of whole images is 4 splits"),
        ("host", "2 1 8 16 16 1 1 8 8 1 1 1 1 0 0 0 0", 64, "is 8 splits, not 64; the nearest that work: 8"),
        ("sm_80", "2 32 8 1 1 3 3 14 14 1 1 1 1 1 1 1 1", 7, "is 4 splits, not 7; the nearest that work: 4 or 8"),
        ("gfx942", "2 1 1 64 64 3 3 14 14 1 1 1 1 1 1 1 1", 2, "a batch of 1 in splits of whole images is 1 split"),
    ],
)
def test_a_k_batch_the_batch_cannot_make_is_refused_naming_it_not_replaced(target, ck, k_batch, message):
    # it was silently planned with another count (issue 42): 5 splits of 8 images as 4, 64 as 8, 2 of 1 as none
    with pytest.raises(PlanError, match=re.escape(f"k-batch: {k_batch} (") + ".*" + re.escape(message)):
        decide(ConvBwdWeightProblem.from_ck(ck), target, k_batch=k_batch)


def test_a_k_batch_the_batch_can_make_is_honoured_and_the_explicit_kernels_count_k_tiles():
    five = ConvBwdWeightProblem.from_ck("2 1 5 16 16 3 3 8 8 1 1 1 1 1 1 1 1")
    assert decide(five, "host", k_batch=3).split == Split("n", 3, 2)  # 5 images in 3 splits of 2, the last padded
    two = ConvBwdWeightProblem.from_ck("2 1 2 64 64 3 3 14 14 1 1 1 1 1 1 1 1")
    assert decide(two, "sm_80", strategy="explicit", k_batch=3).k_batch == 3  # k tiles, not images: not refused


@pytest.mark.parametrize(
    "ck, k_batch, want_split, want_k",
    [
        ("2 1 32 128 128 3 3 14 14 1 1 1 1 1 1 1 1", "auto", 8, 16),  # 784 a split: 49 x 16
        ("2 1 32 128 128 3 3 28 28 1 1 1 1 1 1 1 1", "auto", 16, 32),  # 1568 a split: 49 x 32
        ("2 1 2 256 36 3 3 25 25 1 1 1 1 1 1 1 1", "auto", 1, 64),  # 625 a split: no step; unsplit instead
        ("2 1 64 256 256 3 3 56 56 1 1 1 1 1 1 1 1", "auto", 4, 64),  # 50176 a split: the 64 step divides
    ],
)
def test_a_split_convolution_takes_a_step_that_divides_its_reduction_per_split(ck, k_batch, want_split, want_k):
    # a padded step over a split read past the end of x and dy on the H100 (docs/decisions.md#split-gemm-step)
    plan = decide(ConvBwdWeightProblem.from_ck(ck), "sm_80", k_batch=k_batch, strategy="codegen")
    assert plan.k_batch == want_split
    assert (plan.tile.k if plan.tile else None) == want_k
    assert plan.strategy is (Strategy.MMA if want_k else Strategy.IREE)


@pytest.mark.parametrize(
    "ck, k_batch, per_split",
    [
        ("2 1 2 256 36 3 3 25 25 1 1 1 1 1 1 1 1", 2, 625),  # 3x3: no step of ours divides, IREE's would pad
        ("2 1 32 256 256 1 1 7 7 1 1 1 1 0 0 0 0", 4, 392),  # a 1x1 (GEMM form) IREE tiles itself
    ],
)
def test_a_split_iree_would_pad_is_refused_when_asked_for_and_dropped_when_automatic(ck, k_batch, per_split):
    # every such kernel read past x and dy on the H100 (17 of them: docs/decisions.md#split-iree-step)
    from convbw_mlir.plan import check_plan

    p = ConvBwdWeightProblem.from_ck(ck)
    with pytest.raises(PlanError, match=rf"^k-batch={k_batch}: IREE's own tiling pads the {per_split} reduction "
                                        rf"elements of each of {k_batch} splits \(not a multiple of 16\)"):  # fmt: skip
        decide(p, "sm_80", k_batch=k_batch)
    auto = decide(p, "sm_80")
    check_plan(p, auto)  # what the plan decides by itself is never refused
    stored = dataclasses.replace(auto, strategy=Strategy.IREE, tile=None,
                                 split=Split("n", k_batch, p.batch // k_batch))  # fmt: skip
    with pytest.raises(PlanError, match="read past x and dy"):
        check_plan(p, stored)


def test_a_simt_plan_iree_tiles_itself_never_pads_a_split_reduction():
    # H100, NaN after x and dy: `1 4 3 5 3 4 40 3 3 4 2` split 3 x 1 image (13 output positions a split) read
    # past dy: IREE took mma.sync with the reduction padded to 16 although our plan said SIMT
    # (bench/results/h100_2026-11-25_overread/, docs/decisions.md#split-iree-step)
    from convbw_mlir.plan import check_plan

    repro = ConvBwdWeightProblem.from_ck("1 4 3 5 3 4 40 3 3 4 2")
    # 39 positions, one a lane of the GEMV kernel: the plan keeps codegen's SIMT (docs/decisions.md#gemv-by-default)
    assert decide(repro, "sm_80").strategy is Strategy.SIMT
    plan = decide(repro, "sm_80", strategy="codegen")
    assert plan.strategy is Strategy.SIMT and plan.simt is None and plan.split is None  # unsplit: 3 has no safe split
    with pytest.raises(PlanError, match=r"^k-batch=3: IREE's own tiling pads the 13 reduction elements of each of "
                                        r"3 splits \(not a multiple of 16\)"):  # fmt: skip
        decide(repro, "sm_80", k_batch=3)
    with pytest.raises(PlanError, match="read past x and dy"):
        check_plan(repro, dataclasses.replace(plan, split=Split("n", 3, 1)))
    # a batch that has one: the most splits whose per-split reduction is a multiple of 16 (16 images x 13)
    wider = decide(repro.with_(batch=32), "sm_80", strategy="codegen")
    assert wider.strategy is Strategy.SIMT and wider.split == Split("n", 2, 16)
    # one out channel a group (depthwise): no M loop for IREE's instruction, the split stays (measured inside)
    depthwise = decide(repro.with_(out_channels=1, in_channels=1), "sm_80", strategy="codegen")
    assert depthwise.split == Split("n", 3, 1)


@pytest.mark.parametrize("target", ["sm_80", "gfx942", "gfx1100"])
def test_no_automatic_plan_leaves_iree_a_split_whose_reduction_it_would_pad(target):
    from convbw_mlir.loops import Contraction
    from convbw_mlir.plan import effective_problem
    from convbw_mlir.targets import get_target

    rng = np.random.default_rng(5)
    seen = 0
    for _ in range(400):
        rank = int(rng.integers(1, 4))
        g, c, k = (int(rng.choice([1, 4, 16, 64])), int(rng.choice([1, 2, 3, 4, 8])), int(rng.choice([1, 3, 4, 8])))
        size = int(rng.integers(5, 30 if rank < 3 else 9))
        try:
            p = ConvBwdWeightProblem(groups=g, batch=int(rng.choice([2, 3, 8, 32])), in_channels=c, out_channels=k,
                                     input_size=(size,) * rank, filter_size=(int(rng.choice([1, 3, 4])),) * rank,
                                     stride=int(rng.choice([1, 2, 3])), pad_low=int(rng.integers(0, 3)),
                                     pad_high=int(rng.integers(0, 3)))  # fmt: skip
        except ValueError:
            continue
        plan = decide(p, target)
        iree_tiles = plan.strategy is Strategy.IREE or (plan.strategy is Strategy.SIMT and plan.simt is None)
        if iree_tiles and plan.split is not None and k > 1:  # K = 1: no M loop for IREE's instruction
            seen += 1
            extent = Contraction.build(effective_problem(p, plan.reduction_innermost), plan.split).reduction_extent
            assert extent % get_target(target).intrinsics[p.dtype][0].k == 0, (p.name, plan)
    assert seen > 10  # the property was exercised


def test_a_stored_plan_whose_step_pads_its_split_is_refused_before_compiling():
    from convbw_mlir import compile_op
    from convbw_mlir.plan import check_plan

    p = ConvBwdWeightProblem.from_ck("2 1 32 128 128 3 3 14 14 1 1 1 1 1 1 1 1")
    codegen = decide(p, "sm_80", strategy="codegen")
    padded = dataclasses.replace(codegen, tile=Tile(128, 64, 64, 2, 2, 2, "NV_MMA_SYNC_F32_16x8x16_F16"))
    with pytest.raises(PlanError, match="tile k 64 does not divide the 784 reduction elements of each of 8 splits"):
        check_plan(p, padded)
    with pytest.raises(PlanError, match="read past x and dy"):
        compile_op(p, "sm_80", plan=padded, cache=False)
    check_plan(p, decide(p, "sm_80"))  # the plan's own choice passes


def test_compile_op_takes_a_stored_plans_dictionary_and_refuses_anything_else_by_name():
    from convbw_mlir import compile_op

    p = ConvBwdWeightProblem.from_ck("2 1 4 8 8 3 3 8 8 1 1 1 1 1 1 1 1")
    plan = decide(p, "host", k_batch=2)
    assert compile_op(p, "host", plan=plan.to_dict(), cache=False).plan == plan
    with pytest.raises(PlanError, match=r"plan\.split\.chunk: missing"):
        compile_op(p, "host", plan={**plan.to_dict(), "split": {"dim": "n", "k_batch": 2}}, cache=False)
    with pytest.raises(TypeError, match="plan: expected a Plan, its dictionary or None, got 'fast'"):
        compile_op(p, "host", plan="fast", cache=False)


def test_the_shipped_tuning_database_holds_no_plan_known_to_be_unsafe():
    import json
    from importlib.resources import files

    from convbw_mlir.plan import check_plan

    for path in files("convbw_mlir.tuning").iterdir():
        if path.name.endswith(".json") and not path.name.startswith("selector."):  # a learned selector: no plans
            for entry in json.loads(path.read_text())["entries"]:
                if entry["variant"].get("plan"):
                    check_plan(
                        ConvBwdWeightProblem.from_dict(entry["problem"]), Plan.from_dict(entry["variant"]["plan"])
                    )


def test_an_sm80_tile_narrower_than_its_warp_tile_is_refused_naming_the_tile_option():
    # was "internal error: ZeroDivisionError" (zero subgroups); found by the kernel toolkit's identity sample
    problem = ConvBwdWeightProblem.from_ck("2 1 8 64 64 3 3 14 14 1 1 1 1 1 1 1 1")
    with pytest.raises(PlanError, match=r"^tile-n: 32 \(narrower than the \d+-wide warp tile: give subgroups-n too\)"):
        decide(problem, "sm_80", strategy="explicit", tile_n=32)
    assert decide(problem, "sm_80", strategy="explicit", tile_n=32, subgroups_n=2).tile.n == 32
