"""Layout 4 (NGCHW/GKCYX/NGKHW, torch's NCHW with groups) on NVIDIA computed as layout 2 (issue 23, item 3):
x and dy transposed to channels-last before our kernel, dW transposed from GKYXC back to GKCYX after it
(``convbw-relayout`` on a plan with ``channels_last``), so the channels-last kernels (cp.async copies, the
odd-channel register path, any rank, the depthwise kernel) serve layout-4 problems, not the kernel that
gathers x element by element (docs/decisions.md#layout4). Numerics under the sm_80 emulator against float64;
the plan's choice and its option ``layout4`` (``gather`` keeps the old form reachable)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from sm80_emulator import module_error

from convbw_mlir.plan import Plan, PlanError, check_plan, computed_problem, decide
from convbw_mlir.problem import ConvBwdWeightProblem as P
from convbw_mlir.problem import Epilogue


def l4(groups, batch, c, k, size, filt, **kw) -> P:
    return P(groups, batch, c, k, size, filt, layout=4, **kw)


DENSE = l4(1, 32, 256, 256, (14, 14), (3, 3), pad_low=1, pad_high=1)  # ResNet-50's 3x3 256@14, N = 32


def emulated_error(p: P, plan: Plan, seed: int = 5) -> float:
    from convbw_mlir.passes.explicit_kernel import ExplicitKernel
    from convbw_mlir.passes.relayout import Relayout

    return module_error(p, plan, [Relayout(), ExplicitKernel()], seed=seed)


# -- numerics --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("problem", "options"),
    [
        (l4(1, 2, 8, 16, (6, 6), (3, 3), pad_low=1, pad_high=1), {}),
        (l4(1, 2, 3, 16, (12, 12), (7, 7), stride=2, pad_low=3, pad_high=3), {}),  # C = 3: the register path
        (l4(3, 2, 5, 9, (10, 9), (3, 2), pad_low=(1, 0), pad_high=1), {"k_batch": 2}),  # groups, odd C and K, split
        (l4(2, 2, 8, 8, (20,), (3,), stride=2, pad_low=1, pad_high=1), {}),  # 1-D
        (l4(1, 1, 8, 16, (4, 5, 5), (3, 3, 3), pad_low=1, pad_high=1), {}),  # 3-D
        (l4(2, 2, 16, 8, (5, 5), (1, 1)), {}),  # a plain 1x1: x bound [N*H*W, G, C]
    ],
    ids=["3x3", "first_layer_c3", "groups_odd_split2", "1d_s2", "3d", "1x1_g2"],
)
def test_layout4_as_layout2_matches_float64_under_emulation(problem, options):
    plan = decide(problem, "sm_80", strategy="explicit", layout4="relayout", **options)
    assert plan.channels_last and plan.depthwise is None
    assert emulated_error(problem, plan) < 2e-3


@pytest.mark.parametrize("form", ["relayout", "fold"])
@pytest.mark.parametrize("options", [{}, {"k_batch": 2}], ids=["in_the_store", "in_the_split_sum"])
def test_layout4_forms_apply_the_bilinear_epilogue_to_d_in_gkcyx(options, form):
    """D arrives in dW's layout (GKCYX); the relayout transposes it to GKYXC with x and dy (read untransposed,
    it would meet the wrong entries of dW), the folded form reads it as it is."""
    ep = Epilogue("bilinear", alpha=2.0, beta=-0.5)
    p = l4(2, 4, 8, 16, (8, 8), (3, 3), pad_low=1, pad_high=1).with_(epilogue=ep)
    assert emulated_error(p, decide(p, "sm_80", strategy="explicit", layout4=form, **options)) < 2e-3


def test_layout4_depthwise_goes_to_the_depthwise_kernel_in_layout2():
    p = l4(16, 2, 1, 1, (9, 9), (3, 3), pad_low=1, pad_high=1)
    plan = decide(p, "sm_80", strategy="explicit", layout4="relayout")
    assert plan.channels_last and plan.depthwise is not None
    assert emulated_error(p, plan) < 2e-3


def test_dw_must_be_transposed_back(monkeypatch):
    """Without the transpose back the layout-2 result (GKYXC) read as GKCYX is wrong: the check can fail."""
    from convbw_mlir.passes import relayout

    p = l4(1, 2, 8, 16, (6, 6), (3, 3), pad_low=1, pad_high=1)
    real = relayout.transpose
    monkeypatch.setattr(relayout, "transpose", lambda value, perm: (
        _reshaped if getattr(value.owner, "name", "") == "convbw.conv_bwd_weight" else real)(value, perm))  # fmt: skip
    assert emulated_error(p, decide(p, "sm_80", strategy="explicit", layout4="relayout")) > 0.05


def _reshaped(value, perm):
    """``value`` reshaped to the transpose's result shape, its memory order kept (a transpose left out)."""
    import math

    from convbw_mlir.builders import reassociation
    from convbw_mlir.ir_imports import ir, tensor_d

    t = ir.RankedTensorType(value.type)
    whole = reassociation([list(range(len(t.shape)))])
    flat = tensor_d.CollapseShapeOp(ir.RankedTensorType.get([math.prod(t.shape)], t.element_type), value, whole)
    shape = [t.shape[i] for i in perm]
    return tensor_d.ExpandShapeOp(ir.RankedTensorType.get(shape, t.element_type), flat.result, whole, [], shape).result


# -- the plan's choice -----------------------------------------------------------------------------------
def test_plan_computes_layout4_in_layout2_where_its_plan_there_is_our_kernel():
    plan = decide(DENSE, "sm_80")
    assert plan.channels_last and plan.strategy == "explicit"
    assert replace(plan, channels_last=False) == decide(DENSE.with_(layout=2), "sm_80")
    assert computed_problem(DENSE, plan).layout == "NHWGC/GKYXC/NHWGK"


def test_a_plain_1x1_keeps_its_layout4_plan_where_nothing_is_gathered():
    gemm = l4(1, 4, 1024, 256, (14, 14), (1, 1))  # layout 4's kernel copies both operands by cp.async
    assert not decide(gemm, "sm_80").channels_last
    assert decide(gemm, "sm_80", layout4="relayout").channels_last  # asked for, the transposes
    strided = gemm.with_(stride=2)  # x at the stride: gathered in layout 4
    assert decide(strided, "sm_80").channels_last


def test_option_layout4_gather_keeps_the_gathered_kernel_and_the_old_default():
    gathered = decide(DENSE, "sm_80", strategy="explicit", layout4="gather")
    assert decide(DENSE, "sm_80", strategy="explicit") == gathered  # a strategy asked alone: layout 4's forms
    assert gathered.strategy == "explicit" and not gathered.channels_last
    assert computed_problem(DENSE, gathered) == DENSE
    assert not decide(DENSE, "sm_80", layout4="gather").channels_last  # codegen's plan in layout 4, as before
    assert decide(DENSE, "sm_80", layout4="relayout") == decide(DENSE, "sm_80")


def test_codegen_host_and_amd_plans_stay_in_layout4():
    assert not decide(DENSE, "sm_80", strategy="codegen").channels_last
    assert not decide(DENSE, "host").channels_last
    assert not decide(DENSE, "gfx942").channels_last


def test_streamk_is_layout4_s_gathered_kernel_only():
    plan = decide(DENSE, "sm_80", strategy="explicit", streamk="auto")
    assert plan.streamk is not None and not plan.channels_last
    with pytest.raises(PlanError, match="StreamK is written for layout 4"):
        decide(DENSE, "sm_80", strategy="explicit", streamk="auto", layout4="relayout")


def test_explicit_kernel_pass_refuses_a_channels_last_layout4_op_not_relayouted():
    from convbw_mlir.dialects import convbw
    from convbw_mlir.passes.explicit_kernel import ExplicitKernel
    from convbw_mlir.passes.framework import PassFailure

    from convbw_mlir.ir_imports import new_context

    with new_context(), pytest.raises(PassFailure, match="convbw-relayout"):
        ExplicitKernel().run(convbw.build_module(DENSE, decide(DENSE, "sm_80")).operation)


@pytest.mark.parametrize(
    ("problem", "target", "options", "message"),
    [
        (DENSE.with_(layout=2), "sm_80", {"layout4": "relayout"}, "layout4: relayout applies to layout-4 problems"),
        (DENSE, "gfx942", {"layout4": "relayout"}, "layout4: relayout is written for NVIDIA targets, not gfx942"),
        (DENSE, "sm_80", {"layout4": "relayout", "strategy": "codegen"}, "layout4: relayout computes layout 2 by"),
        (DENSE, "sm_80", {"layout4": "both"}, "layout4: expected relayout, gather or fold, got 'both'"),
    ],
)
def test_option_layout4_refuses_what_it_cannot_do_naming_it(problem, target, options, message):
    with pytest.raises(PlanError, match=message):
        decide(problem, target, **options)


def test_channels_last_plan_round_trips_and_is_refused_for_other_layouts():
    plan = decide(DENSE, "sm_80")
    assert plan.to_dict()["channels_last"] is True and Plan.from_dict(plan.to_dict()) == plan
    assert "channels_last" not in decide(DENSE, "sm_80", layout4="gather").to_dict()
    check_plan(DENSE, plan)
    one = DENSE.with_(layout=3, filter_size=(1, 1), pad_low=(0, 0), pad_high=(0, 0))  # layout 3's 1x1 stays a GEMM
    with pytest.raises(PlanError, match="plan.channels_last: a problem in layout NGCHW/GKYXC/NGKHW"):
        check_plan(one, replace(decide(DENSE.with_(filter_size=(1, 1), pad_low=(0, 0), pad_high=(0, 0)), "sm_80",
                                       layout4="relayout"), channels_last=True))  # fmt: skip
    with pytest.raises(PlanError, match="plan.channels_last: expected true or false"):
        Plan.from_dict({**plan.to_dict(), "channels_last": "yes"})


def test_channels_last_workspace_holds_the_transposed_copies():
    """x and dy in f16; unsplit, dW (GKYXC) too; a split's stage 2 writes dW transposed (IREE's allocations:
    tests/test_plan_properties.py)."""
    inputs = 2 * (32 * 256 * 14 * 14) * 2
    plan, flat = decide(DENSE, "sm_80"), decide(DENSE.with_(layout=2), "sm_80")
    assert plan.split is not None and plan.workspace_bytes == flat.workspace_bytes + inputs
    one = {"strategy": "explicit", "k_batch": 1}
    plan, flat = decide(DENSE, "sm_80", layout4="relayout", **one), decide(DENSE.with_(layout=2), "sm_80", **one)
    assert plan.split is None and plan.workspace_bytes == flat.workspace_bytes + inputs + 256 * 256 * 9 * 2


# -- the folded form (layout4=fold): x's windows by cp.async, the taps' shifts in shared memory --------------
@pytest.mark.parametrize(
    ("problem", "options"),
    [
        (l4(1, 2, 8, 16, (6, 6), (3, 3), pad_low=1, pad_high=1), {}),
        (l4(3, 2, 5, 9, (10, 6), (3, 3), pad_low=1, pad_high=1), {"k_batch": 2}),  # groups, odd C and K, split
        (l4(1, 2, 4, 16, (9, 10), (3, 3), dilation=2, pad_low=2, pad_high=2), {}),  # dilated; 90: ragged tiles
        (l4(2, 2, 8, 8, (20,), (3,), pad_low=2, pad_high=0), {}),  # 1-D, asymmetric padding
        (l4(1, 1, 8, 16, (4, 4, 6), (3, 3, 3), pad_low=1, pad_high=1), {}),  # 3-D
        (l4(1, 2, 3, 16, (8, 8), (7, 7), pad_low=3, pad_high=3), {}),  # a 7x7 with 3 channels: windows past the plane
    ],
    ids=["3x3", "groups_odd_split2", "dilated_ragged", "1d", "3d", "7x7_c3"],
)
def test_folded_layout4_matches_float64_under_emulation(problem, options):
    plan = decide(problem, "sm_80", layout4="fold", **options)
    assert plan.folded and plan.strategy == "explicit" and not plan.channels_last
    assert emulated_error(problem, plan) < 2e-3


def test_folded_form_masks_the_taps_that_wrap_into_the_next_row(monkeypatch):
    """The flattened shift of a tap left of the image reads the previous row's last element: without the
    column masks the result is wrong (so the check can fail)."""
    from convbw_mlir.kernels.ir import Ix

    p = l4(1, 2, 8, 16, (6, 6), (3, 3), pad_low=1, pad_high=1)
    real_lt = Ix.lt
    calls = {"n": 0}

    def lt(self, a, b):  # the column bounds are compared against the row's width 6: make them always true
        if isinstance(b, int) and b == 6 and not isinstance(a, int):
            return arith_true()
        return real_lt(self, a, b)

    def arith_true():
        from convbw_mlir.ir_imports import arith_d, ir

        calls["n"] += 1
        return arith_d.constant(ir.IntegerType.get_signless(1), 1)

    monkeypatch.setattr(Ix, "lt", lt)
    error = emulated_error(p, decide(p, "sm_80", layout4="fold"))
    assert calls["n"] and error > 0.05


@pytest.mark.parametrize(
    ("problem", "message"),
    [
        (l4(1, 2, 8, 16, (9, 9), (3, 3), stride=2, pad_low=1, pad_high=1), "stride: \\(2, 2\\) \\(the folded form"),
        (l4(1, 2, 8, 16, (9, 9), (3, 3)), "input_size: \\(9, 9\\) \\(the folded form needs the output as wide"),
        (l4(1, 2, 8, 16, (7, 7), (3, 3), pad_low=1, pad_high=1), "output_size: \\(7, 7\\) \\(an odd plane"),
        (DENSE.with_(layout=2), "layout4: fold applies to layout-4 problems"),
    ],
    ids=["strided", "unpadded", "odd_plane", "layout2"],
)
def test_folded_form_refuses_what_it_cannot_shift_naming_it(problem, message):
    with pytest.raises(PlanError, match=message):
        decide(problem, "sm_80", layout4="fold")


def test_folded_form_is_ours_on_nvidia_only():
    with pytest.raises(PlanError, match="layout4: fold is an explicit kernel of ours, not strategy codegen"):
        decide(DENSE, "sm_80", layout4="fold", strategy="codegen")
    with pytest.raises(PlanError, match="layout4: fold is written for NVIDIA targets"):
        decide(DENSE, "gfx942", layout4="fold")


def test_folded_plan_round_trips_and_is_asked_for_only():
    plan = decide(DENSE, "sm_80", layout4="fold")
    assert plan.to_dict()["folded"] is True and Plan.from_dict(plan.to_dict()) == plan
    assert not decide(DENSE, "sm_80").folded and not decide(DENSE, "sm_80", strategy="explicit").folded
    check_plan(DENSE, plan)


# -- layout 0 (GNCHW/GKCYX/GNKHW) takes the same route --------------------------------------------------------
FUZZ0087 = P(4, 1, 32, 32, (5, 5, 5), (3, 3, 3), stride=(1, 1, 2), dilation=(1, 1, 2), pad_low=(0, 0, 3),
             pad_high=(0, 0, 3), dtype="bf16", dw_dtype="bf16", layout=0)  # fmt: skip


def test_layout0_is_planned_in_layout2_where_iree_s_own_form_was_wrong():
    # fenced fuzz seed 29 (bench/results/h200_2026-11-26_classes_after/fuzz29.md): IREE's own form, 4.3 RMS wrong
    plan = decide(FUZZ0087, "sm_80")
    assert plan.channels_last and plan.strategy == "explicit"
    assert computed_problem(FUZZ0087, plan).layout == "NHWGC/GKYXC/NHWGK"
    with pytest.raises(PlanError, match=r"^layout4: gather is layout 4's kernel"):
        decide(FUZZ0087, "sm_80", layout4="gather")
    # the forms asked for too (IREE's own in layout 0 were wrong with k_batch 1 and 2 alike): codegen in layout 2
    for options in ({"k_batch": 1}, {"strategy": "codegen"}):
        asked = decide(FUZZ0087, "sm_80", **options)
        assert asked.channels_last and asked.strategy != "explicit"
    with pytest.raises(PlanError, match=r"^k-batch: 2 \(a batch of 1"):  # one image: 2 splits are refused, not made 1
        decide(FUZZ0087, "sm_80", k_batch=2)
    assert not decide(FUZZ0087, "gfx942").channels_last  # AMD: nothing measured there


@pytest.mark.parametrize(
    "problem",
    [P(2, 2, 8, 16, (6, 6), (3, 3), pad_low=1, pad_high=1, layout=0),
     P(2, 1, 8, 8, (4, 5, 6), (3, 3, 3), stride=(1, 1, 2), dilation=(1, 1, 2), pad_low=(0, 0, 3), pad_high=(0, 0, 3),
       layout=0)],
    ids=["2d", "3d_dilated_strided"],
)  # fmt: skip
def test_layout0_as_layout2_matches_float64_under_emulation(problem):
    plan = decide(problem, "sm_80")
    assert plan.channels_last
    assert emulated_error(problem, plan) < 2e-3
