"""The canonical linalg form passes IREE's GPU pipelines (compile only; no GPU here).

Running these kernels is the GPU-run issue's business; here we prove that what the lowering emits is
accepted by IREE 3.13's rocm (CDNA, RDNA) and cuda backends, with x first, dy second and dW with the
filter channel innermost (docs/iree-facts.md "The linalg form IREE's GPU codegen takes": dy first fails
on every GPU target).
"""

import pytest

from convbw_mlir.problem import ConvBwdWeightProblem

PROBLEMS = {
    "3x3_pad1_g1": ConvBwdWeightProblem.from_ck("2 1 4 64 64 3 3 14 14 1 1 1 1 1 1 1 1"),
    "grouped_stride2_bf16": ConvBwdWeightProblem.from_ck("2 4 2 16 8 3 3 13 13 2 2 1 1 1 1 1 1", dtype="bf16"),
    "1d_nchw_torch": ConvBwdWeightProblem(1, 2, 8, 16, (32,), (3,), pad_low=1, pad_high=1, layout="torch"),
}


@pytest.mark.parametrize("target", ["gfx942", "gfx1100", "sm_80"])
@pytest.mark.parametrize("name", list(PROBLEMS))
def test_lowered_form_compiles_for_gpu_targets(compiled, name, target):
    op = compiled(PROBLEMS[name], target)
    # The vmfb is a zip holding the VM flatbuffer (identifier "IREE") and the target's executable format.
    assert op.vmfb[:2] == b"PK" and b"IREE" in op.vmfb[:128]
    assert (b"cuda-nvptx-fb" if target.startswith("sm_") else b"rocm-hsaco-fb") in op.vmfb
    lowered = op.stages["linalg"]
    assert "convbw.conv_bwd_weight" not in lowered
    # the plan's explicit kernel (NVIDIA, channels-last) is a hal.executable.source; codegen's, linalg
    assert ("hal.executable.source" if op.plan.strategy == "explicit" else "linalg.generic") in lowered
    assert op.flags[0] == {"gfx942": "--iree-hal-target-device=hip", "gfx1100": "--iree-hal-target-device=hip",
                           "sm_80": "--iree-hal-target-device=cuda"}[target]  # fmt: skip


# G=1 (a unit group dimension in x and dy) split in 2, and a 1x1 GEMM whose batch and spatial loops IREE
# would merge: both made IREE rebuild the contraction and compile its own config instead of ours.
CONFIG_CASES = {
    # 512 reduction elements a split: our 64 step divides it, so the split keeps our tile
    "split_conv_gfx942": (ConvBwdWeightProblem.from_ck("2 1 4 64 64 3 3 16 16 1 1 1 1 1 1 1 1"), "gfx942", 2),
    "gemm_1x1_gfx1100": (ConvBwdWeightProblem.from_ck("2 2 8 64 64 1 1 7 7 1 1 1 1 0 0 0 0"), "gfx1100", 1),
}


@pytest.mark.parametrize("name", list(CONFIG_CASES))
def test_our_compilation_info_is_what_iree_compiles_the_contraction_with(name):
    from convbw_mlir.build.compile import lowered_text
    from convbw_mlir.build.iree import executable_intermediates
    from convbw_mlir.build.isa import dropped_configs
    from convbw_mlir.pipelines import for_target

    problem, target, k_batch = CONFIG_CASES[name]
    text = lowered_text(problem, for_target(target, k_batch=k_batch))
    assert text.count("#iree_gpu.lowering_config<") == 1 and 'strategy = "mma"' in text
    files = executable_intermediates(text, target).files
    assert any(n.startswith("configured_") for n in files)
    assert dropped_configs(text, files) == []
