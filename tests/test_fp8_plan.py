"""fp8 weight gradients through the product (issue 24 item 4): the problem's types (e4m3 / e5m2 x and dy, dW in
f32 or bf16, per-tensor scales as the scale epilogue), the plan's route on sm_90a (K-major copies of dy and x,
then the TN fp8 GEMM, a split's partials summed by stage 2) and its refusal everywhere else, the launch
schedule's tensor maps, and the whole kernel under the sm_90a emulator against float64 on the same fp8 inputs
within the documented bound (docs/explicit-kernels.md "fp8")."""

from __future__ import annotations

import numpy as np
import pytest
from sm90_emulator import run_gemm

from convbw_mlir.plan import Plan, PlanError, check_plan, decide
from convbw_mlir.policies import sm90, sm90_fp8
from convbw_mlir.problem import K_MAJOR, ConvBwdWeightProblem, numpy_dtype
from convbw_mlir.reference import fp8_bound, random_inputs, reference

RESNET_1X1 = dict(groups=1, batch=256, in_channels=1024, out_channels=256, input_size=(14, 14), filter_size=(1, 1))


def fp8(**fields) -> ConvBwdWeightProblem:
    return ConvBwdWeightProblem(**{**RESNET_1X1, "dtype": "e4m3", "dy_dtype": "e5m2", **fields})


# -- the problem's types --------------------------------------------------------------------------------------
def test_fp8_problem_has_e4m3_x_e5m2_dy_and_f32_dw_by_default_and_round_trips():
    p = fp8()
    assert (p.dtype, p.dy_type, p.dw_dtype, p.is_fp8) == ("e4m3", "e5m2", "f32", True)
    assert p.name.endswith("_e4m3xe5m2-f32_l2")
    assert ConvBwdWeightProblem.from_dict(p.to_dict()) == p
    assert p.min_bytes == 256 * 196 * (1024 + 256) + 256 * 1024 * 4  # one byte an input element
    same = fp8(dy_dtype="e4m3")  # e4m3 / e4m3: dy follows x, as in any other problem
    assert same.dy_dtype is None and same.dy_type == "e4m3" and "dy_dtype" not in same.to_dict()


def test_other_problems_keep_their_dicts_and_dy_follows_a_changed_dtype():
    p = ConvBwdWeightProblem(**RESNET_1X1)
    assert "dy_dtype" not in p.to_dict() and p.dy_type == "f16"
    assert p.with_(dtype="bf16", dw_dtype="bf16").dy_type == "bf16"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"dy_dtype": "f16"}, "dy_dtype: 'f16' with dtype 'e4m3': x and dy are both fp8"),
        ({"dtype": "f16", "dy_dtype": "e5m2"}, "dy_dtype: 'e5m2' with dtype 'f16'"),
        ({"dtype": "f16", "dy_dtype": "bf16"}, "dy_dtype: 'bf16' differs from dtype 'f16'"),
        ({"dw_dtype": "f16"}, r"dw_dtype: 'f16' \(from e4m3 inputs dW is written in f32 or bf16\)"),
        ({"dw_dtype": "e4m3"}, "dw_dtype: 'e4m3'"),
        ({"dtype": "e4m3fn"}, "dtype: unknown element type 'e4m3fn'; known: f16, bf16, f32, e4m3, e5m2"),
    ],
)
def test_bad_fp8_types_get_one_error_naming_the_field_and_value(fields, message):
    with pytest.raises(ValueError, match=message):
        fp8(**fields)


# -- the plan -------------------------------------------------------------------------------------------------
def test_plan_routes_an_fp8_problem_on_sm90a_to_the_fp8_gemm():
    p = fp8()
    plan = decide(p, "sm_90a")
    assert sm90_fp8.is_fp8(plan) and plan.tile.intrinsic == "NV_WGMMA_F32_64x128x32_E5M2_E4M3"
    assert (plan.tile.m, plan.tile.n, plan.tile.k, plan.k_batch) == (128, 128, 128, 8)  # 16 tiles x 8: one wave
    assert sm90_fp8.padded_reduction(p, plan) == 256 * 196  # 392 k tiles, 8 splits of 49: no zero rows
    check_plan(p, Plan.from_dict(plan.to_dict()))  # a stored plan replays
    assert plan.workspace_bytes == 256 * 50176 + 1024 * 50176 + 256 + 8 * 256 * 1024 * 4


@pytest.mark.parametrize(
    ("target", "why"),
    [
        ("sm_80", "sm_80 has no fp8 MMA"),
        ("gfx942", "gfx942 has fp8 MFMA, but no kernel of ours uses it yet"),
        ("gfx950", "gfx950 has fp8 MFMA"),
        ("host", "host has no fp8 kernel here"),
        ("gfx1100", "gfx1100 has no fp8 kernel of ours"),
    ],
)
def test_every_other_target_refuses_fp8_by_name(target, why):
    with pytest.raises(PlanError, match=f"dtype: e4m3/e5m2 \\(fp8 weight gradients are computed on sm_90a only: {why}"):
        decide(fp8(), target)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"filter_size": (3, 3), "pad_low": 1, "pad_high": 1}, r"filter_size: \(3, 3\) \(the fp8 path takes 1x1"),
        ({"groups": 2}, "groups: 2"),
        ({"in_channels": 96}, "in_channels: 96"),
        ({"pad_low": 1, "pad_high": 1}, "pad_low/pad_high"),
        ({"layout": 4}, "layout: NGCHW/GKCYX/NGKHW"),
        ({"epilogue": {"kind": "bilinear", "alpha": 1.0, "beta": 1.0}}, "epilogue: bilinear"),
    ],
)
def test_fp8_path_refuses_what_it_does_not_take_naming_the_field(fields, message):
    with pytest.raises(PlanError, match=message):
        decide(fp8(**fields), "sm_90a")


def test_fp8_plan_takes_k_batch_and_tile_n_and_refuses_other_options():
    p = fp8()
    assert decide(p, "sm_90a", k_batch=4, tile_n=64).tile.n == 64
    with pytest.raises(PlanError, match="tile-n: 256"):
        decide(p, "sm_90a", tile_n=256)
    with pytest.raises(PlanError, match="stages"):
        decide(p, "sm_90a", stages=3)
    with pytest.raises(PlanError, match="strategy: codegen"):
        decide(p, "sm_90a", strategy="codegen")
    plan = decide(p, "sm_90a")
    with pytest.raises(PlanError, match="fp8: dtype: f16"):  # an fp8 plan given to an f16 problem
        check_plan(ConvBwdWeightProblem(**RESNET_1X1), plan)
    with pytest.raises(PlanError, match="fp8: plan: not the fp8 GEMM's"):  # an f16 plan given to an fp8 problem
        check_plan(p, decide(ConvBwdWeightProblem(**RESNET_1X1, layout=2), "sm_90a"))
    assert sm90.is_sm90(decide(ConvBwdWeightProblem(**RESNET_1X1), "sm_90a"))  # f16: the conv kernel, as before


def test_splits_divide_whole_k_tiles_so_the_copies_need_no_zero_rows():
    # R = 64 x 14 x 14 = 98 k tiles: 12 splits would fill the wave; 7 divide them
    consumers, bn, splits = sm90_fp8.choose(256, 256, 64 * 196)
    assert (consumers, bn, splits) == (2, 128, 7)
    assert sm90_fp8.choose(256, 256, 64 * 196 + 1)[2] == 12  # not whole k tiles: zero rows anyway


# -- the build ------------------------------------------------------------------------------------------------
def test_fp8_artifact_launches_the_copies_then_the_gemm_with_its_byte_tensor_maps():
    """compile_op for sm_90a (IREE compiles the transposes and the stage 2; the GEMM is ours): the direct
    launch's schedule takes the module (a subspan of the copies' buffer, joined fences), and its maps say
    bytes (TMA moves fp8 as UINT8) over the K-major copies, boxes one 128-byte row by the tile's rows."""
    from convbw_mlir import compile_op

    p = ConvBwdWeightProblem(1, 2, 128, 64, (16, 12), (1, 1), stride=2, dtype="e5m2", dy_dtype="e4m3",
                             dw_dtype="bf16", epilogue={"kind": "scale", "alpha": 0.5})  # fmt: skip
    op = compile_op(p, "sm_90a", output_arg=True, k_batch=1, cache=False)
    assert op.launch.refused is None, op.launch.refused
    kernels = [s.kernel for s in op.launch.steps if hasattr(s, "kernel")]
    assert kernels[-1] == "convbw_explicit_0" and sum("transpose" in k for k in kernels) == 2
    a, b = op.launch.tensor_maps
    assert (a.binding, a.dtype, a.dims, a.strides, a.box) == (0, 0, (128, 64), (128,), (128, 64))
    assert (b.binding, b.dtype, b.dims, b.box) == (1, 0, (128, 128), (128, 128))
    assert op.launch.transient == op.plan.workspace_bytes
    text = op.stages["linalg"]
    assert "<m = 64, n = 128, k = 32>, D[<f32>, <zero>], A[<e4m3>, <one>, <row>], B[<e5m2>" in text  # A: dy^T


# -- the numbers, under the emulator --------------------------------------------------------------------------
def _emulated(p: ConvBwdWeightProblem, **options) -> tuple[np.ndarray, np.ndarray, np.ndarray, str]:
    """dW by the plan's kernel under the emulator on the K-major copies the module's transposes make (the stage
    2 as its generic computes it: f32 sum in split order, alpha, one rounding), the float64 reference on the
    same fp8 inputs, the documented bound, and the module's IR."""
    from convbw_mlir.dialects import convbw

    from convbw_mlir.build.compile import run_pipeline
    from convbw_mlir.ir_imports import new_context
    from convbw_mlir.pipelines import for_target

    plan = decide(p, "sm_90a", **options)
    x, dy = random_inputs(p, seed=3)
    rows = sm90_fp8.padded_reduction(p, plan)
    s = p.stride[0]
    if p.layout == K_MAJOR.name:  # [ch, N, H, W]: the copies themselves
        xs, dys = x.reshape(p.in_channels, -1).T, dy.reshape(p.out_channels, -1).T
    else:
        xs = x[:, ::s, ::s].reshape(-1, p.in_channels)  # the strided positions a 1x1 reads
        dys = dy.reshape(-1, p.out_channels)

    def k_major(a: np.ndarray) -> np.ndarray:
        out = np.zeros((a.shape[1], rows), a.dtype)
        out[:, : a.shape[0]] = a.T
        return out

    with new_context() as ctx:
        module = convbw.build_module(p, plan)
        run_pipeline(module, for_target("sm_90a"), ctx)
        text = str(module)
        out = np.float32 if plan.k_batch > 1 else numpy_dtype(p.dw_dtype)
        partials = plan.k_batch if plan.k_batch > 1 else 0
        c = run_gemm(module, k_major(dys), k_major(xs), (plan.tile.m, plan.tile.n), out, partials=partials)
    if plan.k_batch > 1:
        assert not np.isnan(c).any()  # every split wrote its whole slice
        total = np.zeros(c.shape[1:], np.float32)
        for part in c:
            total += part
        c = (total * np.float32(p.epilogue.alpha if p.epilogue else 1.0)).astype(numpy_dtype(p.dw_dtype))
    dw = c.astype(np.float64).reshape(p.dw_shape)
    return dw, reference(p, x, dy), fp8_bound(p, x, dy), text


@pytest.mark.parametrize(
    ("fields", "options"),
    [
        # e4m3 x, e5m2 dy, 3 k tiles, scale epilogue in the kernel, bf16 out
        ({"dw_dtype": "bf16", "epilogue": {"kind": "scale", "alpha": 2.0**-6}}, {}),
        # 3 splits of one k tile: partials in their slices, summed with alpha by stage 2, f32 out
        ({"epilogue": {"kind": "scale", "alpha": 3.0}}, {"k_batch": 3}),
        # e4m3 / e4m3, a strided 1x1 whose R (2 x 8 x 6 = 96) is padded to one k tile with zero rows
        ({"dy_dtype": "e4m3", "input_size": (16, 12), "stride": 2}, {}),
        # K-major x and dy (the quantize step's copies): read as they are, 3 splits
        ({"layout": "k_major", "dw_dtype": "bf16"}, {"k_batch": 3}),
    ],
)
def test_fp8_product_kernel_matches_float64_on_the_same_fp8_inputs_within_the_bound(fields, options):
    base = {"groups": 1, "batch": 2, "in_channels": 64, "out_channels": 64, "input_size": (16, 12),
            "filter_size": (1, 1), "dtype": "e4m3", "dy_dtype": "e5m2"}  # fmt: skip
    if fields.get("stride"):
        base["in_channels"] = 128  # bn 128
    p = ConvBwdWeightProblem(**{**base, **fields})
    dw, ref, bound, text = _emulated(p, **options)
    assert not np.isnan(dw).any()
    assert (np.abs(dw - ref) <= bound).all(), float((np.abs(dw - ref) / bound).max())
    assert text.count("linalg.transpose") == 2 and "tensor.pad" in text if fields.get("stride") else True


def test_fp8_product_kernel_without_its_scale_is_outside_the_bound(monkeypatch):
    """The scale epilogue is the recipe's dequantization: dropped (alpha 1), dW is 64x off."""
    from convbw_mlir.kernels import gemm_sm90

    real = gemm_sm90.build_gemm_body
    monkeypatch.setattr(gemm_sm90, "build_gemm_body", lambda e, b, k, t, scale=None: real(e, b, k, t, None))
    p = ConvBwdWeightProblem(1, 2, 64, 64, (16, 12), (1, 1), dtype="e4m3", dy_dtype="e5m2",
                             epilogue={"kind": "scale", "alpha": 2.0**-6})  # fmt: skip
    dw, ref, bound, _ = _emulated(p)
    assert not (np.abs(dw - ref) <= bound).all()


# -- the CLI ----------------------------------------------------------------------------------------------------
LINE = "2 1 2 64 64 1 1 16 12 1 1 1 1 0 0 0 0"  # ckProfiler's problem part: a 2-D 1x1, N 2, C = K = 64


def test_cli_compiles_an_fp8_problem_for_sm90a(capsys):
    from convbw_mlir.cli import main

    assert main(["compile", "--ck", LINE, "--type", "e4m3", "--dy-type", "e5m2", "--target", "sm_90a",
                 "--emit", "linalg"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "tensor<2x16x12x1x64xf8E4M3FN>" in out and "xf8E5M2>" in out and "A[<e5m2>" in out


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--dy-type", "e5m2", "--target", "sm_80"], "dtype: e4m3/e5m2 (fp8 weight gradients are computed on sm_90a"),
        (["--dy-type", "f16"], "dy_dtype: 'f16' with dtype 'e4m3'"),
        (["--dw-type", "f16"], "dw_dtype: 'f16' (from e4m3 inputs"),
    ],
)
def test_cli_refuses_bad_fp8_requests_in_one_line(flags, message, capsys):
    from convbw_mlir.cli import main

    assert main(["compile", "--ck", LINE, "--type", "e4m3", *flags, "--emit", "linalg"]) == 1
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


# -- K-major inputs (the quantize step's copies) ------------------------------------------------------------------
def test_k_major_layout_is_fp8_only_and_round_trips():
    p = fp8(layout="k_major")
    assert p.layout == "CNHW/KYXC/KNHW" and p.x_shape == (1024, 256, 14, 14) and p.dy_shape == (256, 256, 14, 14)
    assert p.dw_shape == (256, 1, 1, 1024) and p.name.endswith("_cnhw")
    assert ConvBwdWeightProblem.from_dict(p.to_dict()) == p
    with pytest.raises(ValueError, match="layout: CNHW/KYXC/KNHW is the K-major layout of fp8 inputs"):
        ConvBwdWeightProblem(**RESNET_1X1, layout="k_major")
    with pytest.raises(PlanError, match=r"stride: \(2, 2\) \(K-major x holds every position"):
        decide(fp8(layout="k_major", stride=2), "sm_90a")


def test_k_major_artifact_launches_the_gemm_on_the_arguments_themselves():
    """No copies: the GEMM binds dy^T and x^T as the caller passes them, then the split's stage 2."""
    from convbw_mlir import compile_op

    p = ConvBwdWeightProblem(1, 4, 64, 128, (16, 12), (1, 1), dtype="e4m3", dy_dtype="e5m2", layout="k_major")
    op = compile_op(p, "sm_90a", output_arg=True, k_batch=3, cache=False)
    assert op.launch.refused is None, op.launch.refused
    steps = [(s.kernel, s.bindings[:2]) for s in op.launch.steps if hasattr(s, "kernel")]
    assert steps[0] == ("convbw_explicit_0", (("arg1", 0), ("arg0", 0))) and len(steps) == 2, steps
    assert op.launch.transient == op.plan.workspace_bytes == 256 + 3 * 128 * 64 * 4
