"""The explicit strategy: a whole sm_80 GEMM kernel our builders write (convbw_mlir/kernels), chosen by
the plan's ``strategy=explicit``, put in place by convbw-explicit-kernel, compiled by IREE as written.

Numerics need the GPU: bench/explicit_gemm.py checks them there (bench/results/h100_2026-11-23_explicit_gemm.md);
these tests check the plan, the IR's structure and the sm_80 compile on the CPU."""

from __future__ import annotations

import pytest

from convbw_mlir import compile_op
from convbw_mlir.build.iree import executable_intermediates
from convbw_mlir.dispatch.variants import candidates
from convbw_mlir.plan import Plan, PlanError, Split, Strategy, as_gemm, check_plan, decide, explicit_tiling
from convbw_mlir.policies.sm80 import SHARED_MEMORY_CAP, GemmShape, GemmTiling, gemm_shape
from convbw_mlir.problem import ConvBwdWeightProblem as P

GEMM4096 = P(1, 1, 4096, 4096, (64, 64), (1, 1), layout=4, dw_dtype="f32")
SMALL = P(1, 1, 256, 128, (8, 8), (1, 1), layout=4, dw_dtype="f32")  # C = 256, K = 128, HW = 64
RESNET_3X3 = P.from_ck("2 1 256 256 256 3 3 14 14 1 1 1 1 1 1 1 1", layout=4)


def test_layout4_1x1_weight_gradient_is_a_gemm_with_both_operands_reduction_contiguous():
    gemm = as_gemm(GEMM4096)
    assert gemm is not None and gemm.dims("x") == ("N", "G", "C", "W") and gemm.dims("dy") == ("N", "G", "K", "W")
    assert gemm.input_size == (4096,)  # the reduction (H*W) is the innermost dimension of both
    assert gemm_shape(GEMM4096) == GemmShape(groups=1, m=4096, n=4096, images=1, hw=4096)
    assert gemm_shape(GEMM4096).flops == 2 * 4096**3


def test_explicit_plan_carries_the_recipe_tiling_under_the_sm80_shared_memory_cap():
    plan = decide(GEMM4096, "sm_80", strategy="explicit")
    assert plan.strategy is Strategy.EXPLICIT and plan.split is None
    t = explicit_tiling(plan)
    assert (t.bm, t.bn, t.bk, t.stages, t.wm, t.wn) == (128, 256, 64, 3, 64, 64)
    assert t.threads == 256 and t.row == 72  # 8 warps; rows padded to BK + 8
    assert t.shared_bytes() == 165_888 <= SHARED_MEMORY_CAP
    assert Plan.from_dict(plan.to_dict()) == plan


def test_plan_picks_explicit_on_its_own_for_channels_last_only():
    # The plan's own choice takes channels-last problems (docs/decisions.md#explicit-by-default): the
    # layout-4 GEMM keeps IREE's codegen unless asked; RESNET_3X3 in layout 4 is computed in layout 2 by
    # the kernel (decisions.md#layout4), its layout-4 kernel (which gathers x) only when asked.
    for target in ("sm_80", "sm_89"):
        assert decide(GEMM4096, target).strategy is not Strategy.EXPLICIT
        assert decide(RESNET_3X3, target).channels_last
        assert decide(RESNET_3X3, target, layout4="gather").strategy is not Strategy.EXPLICIT
        assert decide(RESNET_3X3.with_(layout=2), target).strategy is Strategy.EXPLICIT


def test_explicit_kernel_fits_each_targets_shared_memory():
    with pytest.raises(PlanError, match="stages: 3 need 165888 B of shared memory, over 101376"):
        decide(SMALL, "sm_86", strategy="explicit", tile_n=256)
    assert decide(SMALL, "sm_86", strategy="explicit", tile_n=128, stages=2).target == "sm_86"
    # without tile options the plan's rule picks a tiling that fits the target's cap
    t = explicit_tiling(decide(SMALL, "sm_86", strategy="explicit"))
    assert t.shared_bytes() <= 101_376


def test_tile_options_reshape_the_explicit_kernel():
    plan = decide(SMALL, "sm_80", strategy="explicit", tile_n=128, stages=2)
    t = explicit_tiling(plan)
    assert (t.bm, t.bn, t.stages, t.wm, t.wn) == (128, 128, 2, 64, 64) and t.threads == 128


@pytest.mark.parametrize(
    ("problem", "target", "options", "message"),
    [
        (P(1, 1, 64, 64, (4, 8, 8), (3, 3, 3), layout=4), "gfx942", {}, "input_size: (4, 8, 8) (the AMD explicit"),
        (P(1, 1, 256, 128, (8, 8), (1, 1), layout=3), "sm_80", {}, "layout: NGCHW/GKYXC/NGKHW"),  # layout 0: relayout
        (P(1, 1, 256, 128, (8, 8), (1, 1), layout=4, dtype="f32"), "sm_80", {}, "dtype: f32 (f16 or bf16)"),
        (P(1, 1, 256, 128, (8, 8), (1, 1), layout=4, epilogue={"kind": "scale", "alpha": 2.0}), "gfx942", {},
         "epilogue: scale (this kernel writes dW plain)"),
        (SMALL, "host", {}, "explicit kernels are written for NVIDIA (sm_80), CDNA and RDNA only, not target host"),
        (SMALL, "sm_80", {"k_batch": "rows"}, "k-batch: 'rows' does not apply to strategy explicit"),
        (SMALL, "sm_80", {"k_batch": 4}, "split: r x 4 (the explicit kernel splits its reduction, r, at most in its 1"),
        (SMALL, "sm_80", {"stages": 4}, "stages: 4 need 221184 B of shared memory, over 166912"),
        (SMALL, "sm_80", {"subgroups_m": 3}, "tiling: warp tile"),
    ],
)  # fmt: skip
def test_explicit_refuses_what_it_does_not_compute_naming_the_field(problem, target, options, message):
    with pytest.raises(PlanError) as e:
        decide(problem, target, strategy="explicit", **options)
    assert message in str(e.value)


def test_unknown_strategy_is_refused_naming_the_option():
    with pytest.raises(PlanError, match="strategy: expected explicit"):
        decide(SMALL, "sm_80", strategy="fast")


def test_a_given_explicit_plan_with_a_foreign_split_is_refused_before_compiling():
    plan = decide(SMALL, "sm_80", strategy="explicit")
    split = Plan(plan.target, plan.strategy, plan.gemm, tile=plan.tile, split=Split("n", 1, 1))
    with pytest.raises(PlanError, match="split: n x 1"):
        check_plan(SMALL, split)
    with pytest.raises(PlanError, match="dtype: f32 \\(f16 or bf16\\)"):
        compile_op(P(1, 1, 64, 64, (8, 8), (3, 3), layout=4, dtype="f32"), "sm_80", plan=plan, cache=False)


def test_implicit_gemm_view_of_a_padded_3x3_and_its_split():
    """M = K, N = C x taps in dW's own order, reduction N x Ho x Wo; split-K fills the target's SMs once."""
    shape = gemm_shape(RESNET_3X3)
    assert (shape.m, shape.n, shape.reduction) == (256, 256 * 9, 256 * 14 * 14)
    assert shape.conv is not None and shape.conv.pad == (1, 1) and shape.b_vector() == 1 and shape.a_vector() == 4
    plan = decide(RESNET_3X3, "sm_80", strategy="explicit")
    # 2 x 9 workgroup tiles on 108 SMs: 6 splits of 131 k tiles (786 in all)
    assert plan.split == Split("r", 6, 131) and Plan.from_dict(plan.to_dict()) == plan
    assert decide(RESNET_3X3, "sm_80", strategy="explicit", k_batch=3).split == Split("r", 3, 262)


def test_implicit_gemm_kernel_gathers_x_with_bounds_and_sums_splits_after_the_kernel():
    text = compile_op(RESNET_3X3, "sm_80", strategy="explicit", cache=False).stages["linalg"]
    assert "memref<256x1x256x14x14xf16>" in text  # x bound as it is: no im2col buffer
    assert "memref<6x1x256x2304xf32>" in text  # the split partials
    assert "arith.minsi" in text and "arith.select" in text  # clamped addresses, zero outside the image
    assert "flow.dispatch @convbw_explicit_0::@gemm" in text and "linalg.generic" in text  # the sum of splits
    assert "tensor<1x256x256x3x3xf16>" in text


def test_explicit_kernel_ir_has_the_pipeline_structure_of_the_plan():
    """Per k tile of the default tiling: 4 + 8 copies a thread, 4 k16 steps of 8 ldmatrix.x4 and 32 mma.sync."""
    from convbw_mlir.dialects import convbw
    from convbw_mlir.passes.explicit_kernel import ExplicitKernel
    from convbw_mlir.passes.framework import collect_ops

    from convbw_mlir.ir_imports import new_context

    with new_context():
        module = convbw.build_module(GEMM4096, decide(GEMM4096, "sm_80", strategy="explicit"))
        ExplicitKernel().run(module.operation)
        module.operation.verify()
        (loop,) = collect_ops(module.operation, "scf.for")
        body = [op.name for op in loop.regions[0].blocks[0].operations]
        assert body.count("nvgpu.device_async_copy") == 12
        assert body.count("nvgpu.ldmatrix") == 4 * 8 and body.count("nvgpu.mma.sync") == 4 * 32
        assert body.count("nvvm.cp.async.commit.group") == 1 and body.count("gpu.barrier") == 1
        # the last step's prefetch waits for the next tile before reading it
        assert body.index("nvvm.cp.async.wait.group") < body.index("gpu.barrier") < len(body) - 40
        assert len(loop.results) == 32 + 8  # accumulators and the prefetched fragments
        assert not collect_ops(module.operation, convbw.OP_NAME)


def test_explicit_kernel_compiles_for_sm80_in_a_child_with_its_plan_recorded():
    op = compile_op(SMALL, "sm_80", strategy="explicit", isolate=True, cache=False)
    assert op.plan == decide(SMALL, "sm_80", strategy="explicit") and len(op.vmfb) > 10_000
    llvm = executable_intermediates(op.stages["linalg"], "sm_80").isa
    for instruction in ("llvm.nvvm.cp.async.cg.shared.global.16", "llvm.nvvm.ldmatrix.sync.aligned.m8n8.x4.b16",
                        "llvm.nvvm.mma.m16n8k16.row.col.f32.f32"):  # fmt: skip
        assert instruction in llvm


def test_f16_output_is_rounded_in_the_kernel():
    p = P(1, 1, 256, 128, (8, 8), (1, 1), layout=4, dw_dtype="f16")
    op = compile_op(p, "sm_80", strategy="explicit", cache=False)
    assert "arith.truncf" in op.stages["linalg"] and "memref<1x128x256xf16>" in op.stages["linalg"]


def test_dispatcher_offers_the_explicit_kernel_as_a_variant_where_the_plan_takes_it():
    names = {v.plan.strategy for v in candidates(GEMM4096, "sm_80") if v.plan is not None}
    assert Strategy.EXPLICIT in names
    refused = P(1, 1, 64, 64, (8, 8), (3, 3), layout=4, dtype="f32")
    assert all(v.plan is None or v.plan.strategy is not Strategy.EXPLICIT for v in candidates(refused, "sm_80"))
    # the CDNA form compiles but never ran (no AMD GPU here): not offered to the tuner
    assert all(v.plan is None or v.plan.strategy is not Strategy.EXPLICIT for v in candidates(GEMM4096, "gfx942"))


def test_cdna_form_compiles_with_mfma_no_scratch_and_two_waves_a_simd():
    p = P(1, 1, 1024, 1024, (32, 32), (1, 1), layout=4, dw_dtype="f32")
    op = compile_op(p, "gfx942", strategy="explicit", isolate=True, cache=False)
    assert op.plan.tile.intrinsic == "MFMA_F32_16x16x16_F16" and op.plan.tile.stages == 2
    kernel = op.isa_report().main  # the GEMM (the default plan splits K: a second kernel sums)
    assert kernel.mma.get("v_mfma_f32_16x16x16_f16", 0) > 0 and kernel.scratch_bytes == 0
    assert kernel.lds_bytes == 2 * (128 + 128) * 40 * 2 and kernel.workgroup_size == 512
    assert kernel.occupancy >= 2


def test_tiling_lists_every_reason_it_cannot_run_a_shape():
    why = GemmTiling(stages=4, wm=48).problems(GemmShape(1, 100, 4096, 1, 4096))
    assert any(w.startswith("tiling: warp tile 48x64") for w in why) and any(w.startswith("stages: 4") for w in why)
