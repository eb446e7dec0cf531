"""The explicit strategy on AMD: one kernel builder, the MFMA form (gfx942) and the two WMMA operand forms
(gfx1100 RDNA 3, gfx1200 RDNA 4), plain and implicit GEMM, split-K.

No AMD GPU exists here: these tests prove the plan, the generated IR and the ISA (matrix instructions,
no scratch, LDS, occupancy as planned) and that an LLVM abort costs one compile; numerics are unproven
(docs/explicit-kernels.md, "AMD: what would be needed to trust its numerics")."""

from __future__ import annotations

import pytest

from convbw_mlir import compile_op
from convbw_mlir.kernels.gemm_rdna import FORCE_FORM_ENV
from convbw_mlir.plan import Plan, PlanError, Split, Strategy, decide, explicit_tiling
from convbw_mlir.policies.amd import CdnaTiling
from convbw_mlir.problem import ConvBwdWeightProblem as P
from convbw_mlir.targets import get_target

GEMM = P(1, 1, 256, 128, (8, 8), (1, 1), layout=4, dw_dtype="f32")  # C = 256, K = 128, HW = 64
RESNET_3X3 = P.from_ck("2 1 256 256 256 3 3 14 14 1 1 1 1 1 1 1 1", layout=4)  # padded 3x3, Ho*Wo = 196
RAGGED = P.from_ck("2 1 2 36 256 3 3 7 7 2 2 1 1 1 1 1 1", layout=4)  # K = 36, stride 2: every edge ragged
LAYOUT2_BF16 = P.from_ck("2 1 1 36 24 3 3 7 7 1 1 1 1 1 1 1 1", dtype="bf16")  # NHWGC, K = 36, C = 24, padded
TARGETS = ("gfx942", "gfx1100", "gfx1200")
R3, R4 = "WMMAR3_F32_16x16x16_F16", "WMMAR4_F32_16x16x16_F16"


def test_each_amd_target_takes_the_matrix_form_its_table_entry_names():
    forms = {
        t: decide(GEMM, t, strategy="explicit").tile.intrinsic
        for t in ("gfx942", "gfx950", "gfx1100", "gfx1151", "gfx1200", "gfx1201")
    }
    assert forms == {"gfx942": "MFMA_F32_16x16x16_F16", "gfx950": "MFMA_F32_16x16x16_F16", "gfx1100": R3,
                     "gfx1151": R3, "gfx1200": R4, "gfx1201": R4}  # fmt: skip
    t = explicit_tiling(decide(GEMM, "gfx1200", strategy="explicit"))
    assert (t.wave, t.threads, t.intrinsic) == (32, 256, R4)  # 8 waves of 32 lanes, 32x64 each


def test_amd_plans_split_k_to_fill_the_compute_units_and_round_trip():
    plan = decide(RESNET_3X3, "gfx942", strategy="explicit")
    # 2 x 18 tiles of 128x128 on 304 CUs: 9 splits of 175 k tiles (1568 in all, 32 a tile)
    assert plan.split == Split("r", 9, 175) and Plan.from_dict(plan.to_dict()) == plan
    assert decide(RESNET_3X3, "gfx1200", strategy="explicit").split is None  # 36 tiles on 32 CUs


def test_occupancy_plan_is_the_lds_bound_and_the_register_budget_that_keeps_it():
    t = CdnaTiling()  # 2 x (128 + 128) rows of 40 f16 = 40,960 B: one workgroup a CU
    assert t.planned_occupancy(get_target("gfx942")) == 2 and t.register_budget(get_target("gfx942")) == 256
    r = CdnaTiling(wave=32, intrinsic=R3)  # one workgroup of 8 waves a WGP's 64 KiB, 2 SIMDs: 4 waves each
    assert r.planned_occupancy(get_target("gfx1100")) == 4 and r.register_budget(get_target("gfx1100")) == 256


@pytest.mark.parametrize(
    ("problem", "target", "options", "message"),
    [
        (GEMM, "gfx1100", {"stages": 3}, "stages: 3: the AMD forms double-buffer LDS"),
        (P(1, 1, 256, 128, (8, 8), (1, 1), layout=4, dtype="f32"), "gfx942", {},
         "dtype: f32: target gfx942 has no matrix instruction the AMD kernel writes"),
        (P.from_ck("2 1 8 16 16 3 3 7 7 1 1 1 1 1 1 1 1", layout=0), "gfx1100", {},
         "layout: GNCHW/GKCYX/GNKHW (the explicit kernel takes layouts 4, NGCHW/GKCYX/NGKHW, and 2, NHWGC/"),
        (P(1, 2, 16, 16, (6, 6, 6), (3, 3, 3), layout="NDHWGC/GKZYXC/NDHWGK", dtype="bf16"), "gfx942", {},
         "input_size: (6, 6, 6) (the AMD explicit kernel gathers x of 2-D problems only)"),
        (GEMM, "gfx942", {"tile_m": 256, "tile_n": 256}, "tiling: 81920 B of LDS, over 65536"),
        (GEMM, "gfx1200", {"subgroups_m": 3}, "tiling: wave tile"),
    ],
)  # fmt: skip
def test_amd_explicit_refuses_what_it_does_not_compute_naming_the_field(problem, target, options, message):
    with pytest.raises(PlanError) as e:
        decide(problem, target, strategy="explicit", **options)
    assert message in str(e.value)


def test_a_stored_plan_naming_another_targets_wmma_form_is_refused_before_compiling():
    plan = decide(GEMM, "gfx1200", strategy="explicit")
    foreign = Plan(plan.target, plan.strategy, plan.gemm, tile=plan.tile.__class__(**{**vars(plan.tile),
                                                                                       "intrinsic": R3}))  # fmt: skip
    with pytest.raises(PlanError, match=f"tile: intrinsic {R3} is not one of gfx1200's"):
        compile_op(GEMM, "gfx1200", plan=foreign, cache=False)


def _kernel_ir(problem: P, target: str) -> str:
    from convbw_mlir.dialects import convbw
    from convbw_mlir.passes.explicit_kernel import ExplicitKernel

    from convbw_mlir.ir_imports import new_context

    with new_context():
        module = convbw.build_module(problem, decide(problem, target, strategy="explicit"))
        ExplicitKernel().run(module.operation)
        module.operation.verify()
        return str(module)


@pytest.mark.parametrize(
    ("target", "fragment", "count"),
    [("gfx942", "vector<4xf16>, vector<4xf16>, vector<4xf32>", 16),  # 2 k16 steps x 2 x 4 tiles of 16x16
     ("gfx1100", "vector<16xf16>, vector<16xf16>, vector<8xf32>", 16),
     ("gfx1200", "vector<8xf16>, vector<8xf16>, vector<8xf32>", 16)],
)  # fmt: skip
def test_each_form_emits_its_own_operand_vectors(target, fragment, count):
    text = _kernel_ir(GEMM, target)
    op = "amdgpu.mfma" if target == "gfx942" else "amdgpu.wmma"
    lines = [ln for ln in text.splitlines() if op in ln]
    assert len(lines) == count and all(ln.rstrip().endswith(fragment) for ln in lines)
    assert "memref<2x128x40xf16, #gpu.address_space<workgroup>>" in text  # two static LDS buffers


def test_implicit_gemm_gathers_x_in_the_kernel_with_masked_ragged_edges():
    text = _kernel_ir(RAGGED, "gfx1200")
    assert "memref<2x1x256x7x7xf16>" in text  # x bound as it is: no im2col buffer
    assert "vector.from_elements" in text and "arith.select" in text  # 8 gathered elements, zero outside
    assert "scf.if" in text  # K = 36 of a 128 tile: rows past M are not stored


@pytest.fixture(scope="module", params=[(t, name) for t in TARGETS for name in ("gemm", "resnet_3x3", "layout2_bf16")],
                ids=lambda p: f"{p[0]}-{p[1]}")  # fmt: skip
def compiled(request):
    target, name = request.param
    problem = {"gemm": GEMM, "resnet_3x3": RESNET_3X3, "layout2_bf16": LAYOUT2_BF16}[name]
    return target, compile_op(problem, target, strategy="explicit", isolate=True, cache=False)


def test_amd_explicit_kernel_isa_has_matrix_instructions_no_scratch_and_planned_occupancy(compiled):
    target, op = compiled
    tgt = get_target(target)
    t = explicit_tiling(op.plan)
    kernel = op.isa_report().main
    assert kernel.mma and set(kernel.mma) <= tgt.mnemonics(op.problem.dtype)  # the target's v_mfma_* / v_wmma_*
    assert kernel.scratch_bytes == 0 and op.isa_report().scratch_bytes == 0
    assert kernel.lds_bytes == t.lds_bytes() == 40_960 and kernel.workgroup_size == t.threads
    assert kernel.occupancy == t.planned_occupancy(tgt)
    assert (kernel.vgpr or 0) + (kernel.agpr or 0) <= t.register_budget(tgt)


def test_rdna3_form_forced_onto_gfx1200_aborts_llvm_in_the_child_and_is_a_compile_error_here(monkeypatch):
    from convbw_mlir.build.isolate import CompilerCrash

    monkeypatch.setenv(FORCE_FORM_ENV, R3)
    with pytest.raises(CompilerCrash) as e:
        compile_op(GEMM, "gfx1200", strategy="explicit", isolate=True, cache=False)
    assert e.value.returncode is not None and e.value.returncode < 0  # killed by a signal (SIGABRT)
    assert "Cannot select" in str(e.value)
    monkeypatch.delenv(FORCE_FORM_ENV)
    op = compile_op(GEMM, "gfx1200", strategy="explicit", isolate=True, cache=False)  # the caller goes on
    assert "v_wmma_f32_16x16x16_f16" in op.isa_report().main.mma


def test_an_llvm_abort_costs_the_dispatcher_that_one_variant(monkeypatch, tmp_path):
    from convbw_mlir.dispatch import Registry
    from convbw_mlir.dispatch.variants import Variant

    monkeypatch.setenv(FORCE_FORM_ENV, R3)  # reaches only the explicit kernel's builder
    registry = Registry("gfx1200", cache=tmp_path / "cache")
    registry.declare(GEMM, Variant("convbw", decide(GEMM, "gfx1200", strategy="explicit")))
    registry.declare(GEMM, Variant("convbw", decide(GEMM, "gfx1200")))
    explicit, plain = registry.build(max_workers=2, progress=False).results
    assert not explicit.ok and "SIGABRT" in explicit.error
    assert plain.ok and plain.op.isa_report().main.mma_count > 0


@pytest.mark.parametrize(("target", "form"), [("gfx942", "MFMA"), ("gfx1100", "WMMAR3"), ("gfx1200", "WMMAR4")])
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_the_plan_takes_the_amd_kernel_for_layout_2_and_bf16_only_with_strategy_explicit(target, form, dtype):
    p = P.from_ck("2 1 32 128 128 3 3 14 14 1 1 1 1 1 1 1 1", dtype=dtype)  # layout 2: NHWGC/GKYXC/NHWGK
    assert p.layout == "NHWGC/GKYXC/NHWGK"
    assert decide(p, target).strategy != Strategy.EXPLICIT  # never by default: compiled and emulated, not run
    plan = decide(p, target, strategy="explicit")
    assert plan.tile.intrinsic == f"{form}_F32_16x16x16_{dtype.upper()}"


def test_layout_2_loads_whole_vectors_of_channels_and_stores_them_transposed_into_lds():
    text = _kernel_ir(LAYOUT2_BF16, "gfx1200")
    assert "memref<49x1x36xbf16>" in text and "memref<1x7x7x1x24xbf16>" in text  # dy (N*Ho*Wo) x G x K, x as it is
    assert "memref<2x128x40xbf16, #gpu.address_space<workgroup>>" in text  # layout 4's k-contiguous LDS rows
    assert ": memref<49x1x36xbf16>, vector<4xbf16>" in text  # 36 = 4 x 9: 8-byte loads of dy
    assert ": memref<1x7x7x1x24xbf16>, vector<8xbf16>" in text  # 24 = 8 x 3: 16-byte loads of x
    assert "memref.load" not in text  # no element-wise global loads
    assert "amdgpu.wmma 16x16x16" in text and "vector<8xbf16>, vector<8xbf16>, vector<8xf32>" in text
