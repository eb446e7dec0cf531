"""StreamK in the explicit sm_80 kernel (convbw_mlir/kernels/streamk_sm80.py): the plan's option and its
refusals, the workgroup clamp, and the isolated sm_80 compile.

Numerics: tests/test_explicit_emulated.py runs the kernel as built (its partition, flag waits, linear and
tree fixups) under the sm_80 emulator against float64; bench/explicit_streamk.py checks it on the GPU
(docs/explicit-kernels.md "StreamK"); lit/explicit/streamk*.test check the kernel's IR."""

from __future__ import annotations

import pytest

from convbw_mlir import compile_op
from convbw_mlir.build.iree import executable_intermediates
from convbw_mlir.kernels.streamk_sm80 import StreamK
from convbw_mlir.plan import Plan, PlanError, Split, StreamKPlan, check_plan, decide
from convbw_mlir.policies.sm80 import GemmTiling, gemm_shape
from convbw_mlir.problem import ConvBwdWeightProblem as P

CK = P.from_ck("2 1 32 256 64 1 1 56 56 1 1 1 1 0 0 0 0", layout=4)  # CK's StreamK problem: 2 tiles x 1568 k tiles


def test_streamk_plan_records_workgroups_and_fixup_and_round_trips():
    plan = decide(CK, "sm_80", strategy="explicit", streamk=132, streamk_fixup="tree")
    assert plan.streamk == StreamKPlan(132, "tree") and plan.split is None
    assert Plan.from_dict(plan.to_dict()) == plan
    assert plan.to_dict()["streamk"] == {"workgroups": 132, "fixup": "tree"}


def test_streamk_is_off_by_default_and_auto_takes_the_targets_sms():
    assert decide(CK, "sm_80", strategy="explicit").streamk is None
    assert decide(CK, "sm_80", strategy="explicit", streamk="auto").streamk == StreamKPlan(108, "linear")


@pytest.mark.parametrize(
    ("target", "options", "message"),
    [
        ("sm_80", {"streamk": 132}, r"streamk: 132 applies to strategy explicit only"),
        ("sm_80", {"strategy": "explicit", "streamk": 132, "k_batch": 4}, r"k-batch: 4: StreamK replaces split-K"),
        ("sm_80", {"strategy": "explicit", "streamk": 0}, r"streamk: expected auto or a positive number.*got 0"),
        ("sm_80", {"strategy": "explicit", "streamk": "many"}, r"streamk: expected .* got 'many'"),
        ("sm_80", {"strategy": "explicit", "streamk": 132, "streamk_fixup": "ring"}, r"streamk-fixup: .* got 'ring'"),
        ("sm_80", {"strategy": "explicit", "streamk_fixup": "tree"}, r"streamk-fixup: tree needs streamk"),
        ("gfx942", {"strategy": "explicit", "streamk": 132}, r"streamk: 132 on target gfx942"),
    ],
)
def test_streamk_options_are_refused_naming_the_option_and_value(target, options, message):
    with pytest.raises(PlanError, match=message):
        decide(CK, target, **options)


def test_streamk_refuses_what_the_explicit_kernel_does_not_take_by_name():
    with pytest.raises(PlanError, match=r"layout: GNCHW"):
        decide(CK.with_(layout=0), "sm_80", strategy="explicit", streamk=132)
    with pytest.raises(PlanError, match=r"dtype: f32 \(f16 or bf16\)"):
        decide(CK.with_(dtype="f32", dw_dtype="f32"), "sm_80", strategy="explicit", streamk=132)


def test_a_given_streamk_plan_with_a_split_or_bad_fixup_is_refused_before_compiling():
    plan = decide(CK, "sm_80", strategy="explicit", streamk=132)
    with pytest.raises(PlanError, match=r"split: r x 4 \(StreamK replaces split-K\)"):
        check_plan(CK, Plan(**{**plan.__dict__, "split": Split("r", 4, 392)}))
    with pytest.raises(PlanError, match=r"streamk-fixup: 'ring'"):
        check_plan(CK, Plan(**{**plan.__dict__, "streamk": StreamKPlan(132, "ring")}))
    with pytest.raises(PlanError, match=r"streamk: 0 workgroups"):
        check_plan(CK, Plan(**{**plan.__dict__, "streamk": StreamKPlan(0)}))


def test_streamk_clamps_workgroups_to_the_k_iterations_so_none_is_idle():
    assert StreamK.of(gemm_shape(P(1, 1, 256, 128, (8, 8), (1, 1), layout=4)), GemmTiling(), 132).workgroups == 1
    assert StreamK.of(gemm_shape(CK), GemmTiling(), 132) == StreamK(2, 1568, 132)


@pytest.mark.parametrize("fixup", ["linear", "tree"])
def test_streamk_kernel_compiles_for_sm80_in_a_child_with_flag_atomics_and_fences(fixup):
    op = compile_op(CK, "sm_80", strategy="explicit", streamk=132, streamk_fixup=fixup, isolate=True, cache=False)
    assert op.plan.streamk == StreamKPlan(132, fixup) and len(op.vmfb) > 10_000
    llvm = executable_intermediates(op.stages["linalg"], "sm_80").isa
    for instruction in ("atomicrmw add", "acq_rel", "llvm.nvvm.membar.gl", "llvm.nvvm.mma.m16n8k16.row.col.f32.f32",
                        "llvm.nvvm.cp.async.cg.shared.global.16"):  # fmt: skip
        assert instruction in llvm
