"""convbw-raise and the whole-module route on the host: IREE's input-phase IR raised and lowered by our pipeline
gives the dW IREE gives alone and float64 gives; a whole training step compiles to one vmfb whose weight
gradients are torch autograd's."""

from __future__ import annotations

import runpy
from pathlib import Path

import numpy as np
import pytest

from convbw_mlir.build.iree import compile_module as iree_compile
from convbw_mlir.dispatch.module import compile_module

ROOT = Path(__file__).resolve().parent.parent
INPUTS = ROOT / "lit" / "passes" / "Inputs" / "raise"


def _run(vmfb: bytes, *args: np.ndarray) -> np.ndarray:
    import iree.runtime as rt

    context = rt.SystemContext(config=rt.Config("local-task"))
    context.add_vm_module(rt.VmModule.copy_buffer(context.instance, vmfb))
    return np.asarray(context.modules.module["main"](*args).to_host())


# file, (N, C total, H...), (K total, C per group, F...), stride, pad, dilation, groups, dtype, tolerance
CASES = {
    "grouped_strided_dilated_f32": ((2, 8, 8, 8), (12, 4, 3, 3), (2, 1), (1, 1), (1, 2), 2, np.float32, 1e-5),
    "dense_f16": ((2, 4, 8, 8), (6, 4, 3, 3), (1, 1), (1, 1), (1, 1), 1, np.float16, 1e-2),
    "conv1d_grouped_f32": ((2, 8, 9), (12, 4, 3), (2,), (0,), (1,), 2, np.float32, 1e-5),
    "conv3d_f32": ((1, 2, 4, 5, 6), (3, 2, 1, 2, 3), (1, 1, 1), (0, 1, 0), (1, 1, 1), 1, np.float32, 1e-5),
}


@pytest.mark.parametrize("name", list(CASES))
def test_raised_input_ir_gives_the_dw_of_iree_alone_and_of_float64(name):
    torch = pytest.importorskip("torch", reason="the float64 reference is torch's convolution_backward")
    x_shape, w_shape, stride, pad, dilation, groups, dtype, tol = CASES[name]
    text = (INPUTS / f"{name}.mlir").read_text()
    ours = compile_module(text, "host")
    assert [r.problem.groups for r in ours.raised] == [groups]  # the route did raise it: ours computed dW
    assert '"convbw.conv_bwd_weight"' not in ours.lowered_ir  # lowered by our pipeline before IREE
    theirs = iree_compile(text, "host", ["--compile-from=input"])
    rng = np.random.default_rng(0)
    x = rng.standard_normal(x_shape).astype(dtype)
    w = np.zeros(w_shape, dtype)
    conv = getattr(torch.nn.functional, f"conv{len(stride)}d")
    out = conv(torch.from_numpy(x).double(), torch.from_numpy(w).double(), None, stride, pad, dilation, groups)
    dy = rng.standard_normal(tuple(out.shape)).astype(dtype)
    want = torch.ops.aten.convolution_backward(
        torch.from_numpy(dy).double(), torch.from_numpy(x).double(), torch.from_numpy(w).double(), None,
        list(stride), list(pad), list(dilation), False, [0] * len(stride), groups, [False, True, False],
    )[1].numpy()  # fmt: skip
    got, iree_alone = (_run(v, x, dy, w).astype(np.float64) for v in (ours.vmfb, theirs))
    scale = np.abs(want).max()
    assert np.abs(got - want).max() / scale < tol
    assert np.abs(iree_alone - want).max() / scale < tol


def test_compile_module_refuses_a_source_that_is_neither_a_program_nor_mlir():
    with pytest.raises(TypeError, match="source: expected a torch.export.ExportedProgram or MLIR text, got int"):
        compile_module(42, "host")


def test_compile_module_names_an_unknown_target_before_compiling():
    with pytest.raises(ValueError, match="nope"):
        compile_module("module {}", "nope")


def test_the_whole_module_example_raises_every_weight_gradient_and_matches_autograd(capsys):
    pytest.importorskip("torch", reason="the example exports a torch training step")
    example = runpy.run_path(str(ROOT / "examples" / "whole_module.py"), run_name="example")
    worst = example["main"]([])
    out = capsys.readouterr().out
    assert "raised 4 weight gradients:" in out  # 3x3, grouped strided, depthwise, 1x1: all ours
    assert worst < 1e-4, out


def test_hand_written_linalg_read_through_transposes_compiles_whole_and_matches_float64():
    """A plain func.func module (no IREE input phase: every phase runs) whose x and dy are channels-last
    transposed to NCHW: raised as the NHWC problem, the transposes folded."""
    torch = pytest.importorskip("torch", reason="the float64 reference is torch's convolution_backward")
    chunks = (ROOT / "lit" / "passes" / "raise_generic.mlir").read_text().split("// -----")
    chunk = next(c for c in chunks if "func.func @through_transposes" in c)
    text = "\n".join(line for line in chunk.splitlines() if not line.lstrip().startswith("//"))
    compiled = compile_module(text, "host")
    assert [r.problem.layout for r in compiled.raised] == ["NHWC/KYXC/NHWK"]
    rng = np.random.default_rng(1)
    x, dy = rng.standard_normal((1, 6, 6, 3)).astype(np.float32), rng.standard_normal((1, 4, 4, 5)).astype(np.float32)
    import iree.runtime as rt

    context = rt.SystemContext(config=rt.Config("local-task"))
    context.add_vm_module(rt.VmModule.copy_buffer(context.instance, compiled.vmfb))
    got = np.asarray(context.modules.module["through_transposes"](x, dy).to_host())
    nchw = [torch.from_numpy(a).double().permute(0, 3, 1, 2) for a in (dy, x)]
    want = torch.ops.aten.convolution_backward(*nchw, torch.zeros(5, 3, 3, 3, dtype=torch.float64), None, [1, 1],
                                               [0, 0], [1, 1], False, [0, 0], 1, [False, True, False])[1]  # fmt: skip
    want = want.permute(0, 2, 3, 1).numpy()
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-5


@pytest.mark.parametrize(("target", "intrinsic"), [("gfx942", "v_mfma_f32_16x16x16_f16"),
                                                   ("gfx1100", "v_wmma_f32_16x16x16_f16"),
                                                   ("gfx1200", "v_wmma_f32_16x16x16_f16")])  # fmt: skip
def test_the_route_compiles_for_amd_and_the_isa_has_the_matrix_instructions(target, intrinsic):
    """IREE's input-phase IR of a 64-channel f16 weight gradient through the route for an AMD target (no device
    here): our lowered contraction in the module IREE compiles, MFMA/WMMA in the ISA."""
    from convbw_mlir.build.iree import executable_intermediates
    from convbw_mlir.build.isolate import call

    compiled = compile_module((INPUTS / "dense_c64_f16.mlir").read_text(), target, isolate=True)
    assert len(compiled.raised) == 1 and "convbw.contraction" in compiled.lowered_ir
    isa = call(executable_intermediates, compiled.lowered_ir, target, ["--compile-from=input"], what=target).isa
    assert intrinsic in isa


def test_a_weight_gradient_planned_for_the_hopper_kernel_is_refused_in_a_whole_module_on_sm90a():
    """sm_90a plans a layout-4 f16 grouped convolution with 64 channels a group for the Hopper kernel, whose TMA
    tensor maps need our direct launch; a whole module runs through IREE's runtime: one error, before IREE runs."""
    from convbw_mlir.dialects import convbw
    from convbw_mlir.passes import build_pass_manager, parse_pipeline

    from convbw_mlir.ir_imports import new_context
    from convbw_mlir.problem import ConvBwdWeightProblem

    problem = ConvBwdWeightProblem.from_ck("2 2 4 64 64 3 3 8 8 1 1 1 1 1 1 1 1", layout=4)
    with new_context() as ctx:
        module = convbw.build_module(problem)
        build_pass_manager(parse_pipeline("convbw-lower-to-linalg,canonicalize,cse"), ctx).run(module.operation)
        text = str(module)  # our own linalg of it: raised back to one op, then planned for sm_90a
    with pytest.raises(ValueError, match="target sm_90a: .* is planned for the Hopper kernel, whose TMA tensor maps"):
        compile_module(text, "sm_90a")


def test_a_named_forward_convolution_of_transposed_operands_is_raised_and_gives_float64s_dw():
    """linalg.conv_2d_nchw_fchw on x^T and dy^T (the stride 2 as its dilation), its CKYX result transposed to KCYX:
    raised through its generalization as the NCHW problem with stride 2, compiled whole, against float64."""
    torch = pytest.importorskip("torch", reason="the float64 reference is torch's convolution_backward")
    chunks = (ROOT / "lit" / "passes" / "raise_generic.mlir").read_text().split("// -----")
    chunk = next(c for c in chunks if "func.func @named_conv_between_transposes" in c)
    text = "\n".join(line for line in chunk.splitlines() if not line.lstrip().startswith("//"))
    compiled = compile_module(text, "host")
    assert [(r.problem.layout, r.problem.stride) for r in compiled.raised] == [("NCHW/KCYX/NKHW", (2, 2))]
    rng = np.random.default_rng(2)
    x, dy = rng.standard_normal((2, 4, 9, 9)).astype(np.float32), rng.standard_normal((2, 6, 4, 4)).astype(np.float32)
    import iree.runtime as rt

    context = rt.SystemContext(config=rt.Config("local-task"))
    context.add_vm_module(rt.VmModule.copy_buffer(context.instance, compiled.vmfb))
    got = np.asarray(context.modules.module["named_conv_between_transposes"](x, dy).to_host())
    want = torch.ops.aten.convolution_backward(
        torch.from_numpy(dy).double(), torch.from_numpy(x).double(), torch.zeros(6, 4, 3, 3, dtype=torch.float64),
        None, [2, 2], [0, 0], [1, 1], False, [0, 0], 1, [False, True, False],
    )[1].numpy()  # fmt: skip
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-5


def test_two_of_our_kernels_of_different_shapes_in_one_module_compile_for_sm80():
    """Our kernels share one entry name; IREE links a target's executables into one LLVM module, where two of
    different shapes clashed ("multiple public symbols with the name: gemm", ResNet-18's step for sm_80): each is
    now named after its executable."""
    lines = (INPUTS / "dense_c64_f16.mlir").read_text().splitlines()
    start = lines.index("module {")
    end = len(lines) - 1 - lines[::-1].index("}")
    body = lines[start + 1 : end]  # the functions: again as @other at 12x12 (another kernel)
    other = [line.replace("@main", "@other").replace("14x14", "12x12").replace("16x16", "14x14") for line in body]
    compiled = compile_module("\n".join(lines[: start + 1] + body + other + lines[end:]), "sm_80", isolate=True)
    assert len(compiled.raised) == 2 and compiled.lowered_ir.count("hal.executable.source") == 2
    assert "::@convbw_explicit_0" in compiled.lowered_ir and compiled.vmfb


# the pools' backwards IREE 3.13 has no lowering for, decomposed before the import (dispatch/module.py):
# op, spatial dims, its forward's arguments after x (kernel, stride, pad, ceil_mode, count_include_pad, divisor)
POOLS = {
    "avg2d_ceil_padded": ("avg_pool2d", 2, ([3, 3], [2, 2], [1, 1], True, True, None)),
    "avg2d_pad_uncounted": ("avg_pool2d", 2, ([3, 2], [2, 1], [1, 0], True, False, None)),
    "avg2d_divisor": ("avg_pool2d", 2, ([2, 2], [2, 2], [0, 0], False, True, 3)),
    "avg3d_ceil_uncounted": ("avg_pool3d", 3, ([2, 3, 3], [1, 2, 2], [0, 1, 1], True, False, None)),
    "adaptive2d": ("adaptive_avg_pool2d", 2, ([3, 5],)),
    "adaptive3d": ("adaptive_avg_pool3d", 3, ([2, 3, 4],)),
    "max3d_ceil": ("max_pool3d", 3, ([2, 3, 3], [2, 2, 2], [0, 1, 1], [1, 1, 1], True)),
}


@pytest.mark.parametrize("name", list(POOLS))
def test_the_pool_backward_decompositions_give_torchs_gradient_in_float64(name):
    """Each decomposition against torch's own backward of the same forward (no IREE): sound, not near."""
    torch = pytest.importorskip("torch", reason="the decompositions are torch's")
    from convbw_mlir.dispatch.module import _pool_decompositions

    op, rank, args = POOLS[name]
    aten = torch.ops.aten
    x = torch.randn((2, 3, *[7, 8, 9][-rank:]), dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    if op.startswith("max"):
        y, indices = aten.max_pool3d_with_indices(x, *args)
        dy = torch.randn_like(y)
        want = aten.max_pool3d_with_indices_backward(dy, x, *args, indices)
        got = _pool_decompositions()[aten.max_pool3d_with_indices_backward.default](dy, x, *args, indices)
    else:
        forward = getattr(aten, op if op.startswith("avg") else f"_{op}").default
        backward = getattr(aten, f"{forward.__name__.split('.')[0]}_backward").default
        dy = torch.randn_like(forward(x, *args))
        extra = args if op.startswith("avg") else ()  # the adaptive backward reads the sizes off dy and x
        want = backward(dy, x, *extra)
        got = _pool_decompositions()[backward](dy, x, *extra)
    assert got.shape == want.shape and torch.allclose(got, want, rtol=0, atol=1e-13)


def test_a_net_of_the_pools_iree_refused_compiles_whole_raises_every_conv_and_matches_autograd():
    """DenseNet's and VGG's pools (ceil_mode max pool, avg pools counting or not their pad, an adaptive pool that
    is no identity) around four convolutions: IREE 3.13's input phase refused their backwards (the zoo's densenet121,
    nf_resnet26, resnest14d, sew, vgg16); decomposed, every weight gradient is raised and equals float64 autograd."""
    torch = pytest.importorskip("torch", reason="the net is a torch training step")
    from torch import nn
    from torch.export.experimental import _export_forward_backward

    class Pools(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.convs = nn.ModuleList([
                nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.Conv2d(8, 8, 3, padding=1, groups=2, bias=False),
                nn.Conv2d(8, 8, 1, bias=False), nn.Conv2d(8, 4, 3, padding=1, bias=False),
            ])  # fmt: skip

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            f = nn.functional
            x = f.max_pool2d(torch.relu(self.convs[0](x)), 3, 2, 1, ceil_mode=True)  # 16 -> 9
            x = f.avg_pool2d(torch.relu(self.convs[1](x)), 2, 2, ceil_mode=True)  # 9 -> 5, the last window overhangs
            x = f.avg_pool2d(self.convs[2](x), 3, 1, 1, count_include_pad=False)
            x = f.adaptive_avg_pool2d(self.convs[3](x), 3)  # 5 -> 3: overlapping windows
            return (x * x).mean()

    torch.manual_seed(4)
    net, x = Pools(), torch.randn(2, 3, 16, 16)
    program = _export_forward_backward(torch.export.export(net, (x,)).run_decompositions(), joint_loss_index=0)
    compiled = compile_module(program, "host", isolate=True)
    assert len(compiled.raised) == len(net.convs)  # each weight gradient ours; not_raised: the forward, dx
    import iree.runtime as rt

    context = rt.SystemContext(config=rt.Config("local-task"))
    context.add_vm_module(rt.VmModule.copy_buffer(context.instance, compiled.vmfb))
    _, *grads = (np.asarray(o.to_host()) for o in context.modules.module["main"](x.numpy()))
    net64 = net.double()
    want = torch.autograd.grad(net64(x.double()), [c.weight for c in net64.convs])
    order = [s.target for s in program.graph_signature.output_specs if s.target]
    by_name = dict(zip([f"convs.{i}.weight" for i in range(len(net.convs))], want))
    for name, got in zip(order, grads):
        assert np.abs(got - by_name[name].numpy()).max() / by_name[name].abs().max().item() < 1e-4, name


@pytest.mark.parametrize(
    ("size", "stride", "decomposed"),
    [([2, 6], [6, 1], True), ([2, 6, 1, 1], [6, 1, 6, 6], True), ([2, 3], [6, 1], False), ([2, 6], [1, 2], False)],
)
def test_as_strided_scatter_is_decomposed_only_where_it_writes_all_of_x_in_order(size, stride, decomposed):
    """ConvNeXt's head writes its gradient into an ``aten.full`` through a dense ``as_strided`` view (its size-1
    dims at any stride): that is ``src`` reshaped, equal to torch's op; a partial or transposed view is left as is."""
    torch = pytest.importorskip("torch", reason="the decomposition is torch's")
    from convbw_mlir.dispatch.module import _as_strided_scatter

    x = torch.zeros(12, dtype=torch.float64)
    src = torch.randn(size, dtype=torch.float64)
    got = _as_strided_scatter(x, src, size, stride, 0)
    if not decomposed:
        assert got is NotImplemented
        return
    assert torch.equal(got, torch.ops.aten.as_strided_scatter(x, src, size, stride, 0))


def test_a_step_with_as_strided_scatter_passes_irees_input_phase_and_gives_torchs_result():
    """IREE 3.13 has no lowering for the op ("failed to legalize" an operand of it: ConvNeXt's whole step failed);
    decomposed, the module compiles and gives torch's values."""
    torch = pytest.importorskip("torch", reason="the program is a torch export")

    class Scatter(torch.nn.Module):
        def forward(self, src: torch.Tensor) -> torch.Tensor:
            full = torch.zeros(12)
            return torch.ops.aten.as_strided_scatter(full, src * 2, [2, 6, 1], [6, 1, 12], 0).reshape(3, 4) + 1

    src = torch.randn(2, 6, 1)
    compiled = compile_module(torch.export.export(Scatter(), (src,)), "host", isolate=True)
    assert np.array_equal(_run(compiled.vmfb, src.numpy()), Scatter()(src).numpy())


def test_integer_fmod_is_decomposed_to_cs_remainder_and_a_float_one_is_left():
    torch = pytest.importorskip("torch", reason="the decomposition is torch's")
    from convbw_mlir.dispatch.module import _integer_fmod

    x = torch.arange(-9, 10)
    assert torch.equal(_integer_fmod(x, 4), torch.fmod(x, 4)) and torch.equal(_integer_fmod(x, -3), torch.fmod(x, -3))
    assert _integer_fmod(x.double(), 4) is NotImplemented and _integer_fmod(x, 2.5) is NotImplemented


def test_swins_indexed_buffer_and_roll_import_compile_and_give_torchs_result():
    """Swin's relative-position bias (a buffer of indices read inside ``index.Tensor``'s list: the importer refused
    a frozen tensor there) and its shifted windows (``roll``, whose decomposition's integer ``fmod`` IREE 3.13 has
    no lowering for): swin_t's step did not import, then failed IREE's input phase."""
    torch = pytest.importorskip("torch", reason="the program is a torch export")

    class Shifted(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("index", torch.tensor([3, 0, 2, 2, 1]))

        def forward(self, table: torch.Tensor) -> torch.Tensor:
            return torch.roll(table[:, self.index], shifts=(1, -2), dims=(0, 1)) * 2

    table = torch.randn(3, 4)
    program = torch.export.export(Shifted(), (table,)).run_decompositions()
    compiled = compile_module(program, "host", isolate=True)
    assert np.array_equal(_run(compiled.vmfb, table.numpy()), Shifted()(table).numpy())
