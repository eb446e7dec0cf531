"""The sm_90a weight-gradient kernel in the product (issue 24 items 1 and 3): the plan's choice on sm_90a, the
tensor-map record the build puts in the launch schedule, the direct launch's encoding of it, the refusal on
IREE's runtime, and the torch entry's choice of target by compute capability."""

from __future__ import annotations

import ctypes
import json
from pathlib import Path

import numpy as np
import pytest

from convbw_mlir import policies
from convbw_mlir.cuda_launch import Launch, TensorMap, encode_tensor_map
from convbw_mlir.dispatch.select import select
from convbw_mlir.dispatch.variants import Variant, variant_key
from convbw_mlir.plan import Plan, PlanError, check_plan, decide
from convbw_mlir.policies import sm90
from convbw_mlir.problem import ConvBwdWeightProblem, Epilogue
from convbw_mlir.targets import get_target

RESNET_3X3 = "2 1 256 256 256 3 3 14 14 1 1 1 1 1 1 1 1"  # ResNet-50 stage 3's 3x3 at N=256
TINY = "2 1 8 64 64 3 3 8 8 1 1 1 1 1 1 1 1"


def _problem(line: str, **fields) -> ConvBwdWeightProblem:
    return ConvBwdWeightProblem.from_ck(line).with_(**{"layout": 2, **fields})


# -- the plan -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "line", [RESNET_3X3, "2 1 256 1024 256 1 1 14 14 1 1 1 1 0 0 0 0", "2 2 64 64 64 3 3 56 56 1 1 1 1 1 1 1 1"]
)
def test_plan_on_sm90a_is_the_wgmma_kernel_for_problems_its_policy_takes(line):
    p = _problem(line)
    plan = decide(p, "sm_90a")
    assert sm90.is_sm90(plan), plan
    assert plan.tile.intrinsic == f"NV_WGMMA_F32_64x{plan.tile.n}x16_F16"
    bn, splits, streamk = sm90.choose(p.out_channels, p.in_channels * 9 if "3 3" in line else p.in_channels,
                                      p.batch * int(np.prod(p.output_size)), groups=p.groups)  # fmt: skip
    assert (plan.tile.n, plan.k_batch, plan.streamk) == (bn, splits, None) and streamk == 0
    assert not sm90.is_sm90(decide(p, "sm_80"))  # other targets: unchanged


@pytest.mark.parametrize(
    "line",
    ["3 1 8 256 128 3 3 3 8 28 28 2 2 2 1 1 1 1 1 1 1 1 1", "1 1 16 512 512 3 3000 2 1 1 1"],  # R3D-18, Whisper
)
def test_plan_on_sm90a_is_the_wgmma_kernel_for_1d_and_3d_layers_too(line):
    p = _problem(line)
    plan = decide(p, "sm_90a")
    assert sm90.is_sm90(plan), plan
    bn, splits, streamk = sm90.choose(p.out_channels, p.in_channels * int(np.prod(p.filter_size)),
                                      p.batch * int(np.prod(p.output_size)), groups=p.groups)  # fmt: skip
    assert (plan.tile.n, plan.k_batch, plan.streamk.workgroups if plan.streamk else 0) == (bn, splits, streamk)


@pytest.mark.parametrize(
    ("line", "layout"), [(RESNET_3X3, 4), (RESNET_3X3, 0), ("3 1 2 64 64 3 3 3 4 6 6 1 1 1 1 1 1 1 1 1 1 1 1", 4)]
)
def test_plan_on_sm90a_computes_a_layout_4_or_0_problems_transposed_copies_with_the_wgmma_kernel(line, layout):
    """The launcher encodes the maps on whatever its bindings hold at launch, the transient's copies too."""
    plan = decide(_problem(line, layout=layout), "sm_90a")
    assert plan.channels_last and sm90.is_sm90(plan), plan


def test_sm90a_plan_round_trips_through_json_and_keys_its_own_cache_entry():
    p = _problem(RESNET_3X3)
    plan = decide(p, "sm_90a")
    again = Plan.from_dict(json.loads(json.dumps(plan.to_dict())))
    assert again == plan and sm90.is_sm90(again)
    check_plan(p, again)  # a stored plan replays
    sm80_plan = decide(p, "sm_90a", strategy="explicit", tile_m=128)  # an sm_80 kernel option: the sm_80 kernel
    assert not sm90.is_sm90(sm80_plan)
    keys = {variant_key(p, "sm_90a", Variant("convbw", q), "3.13") for q in (plan, sm80_plan)}
    assert len(keys) == 2


@pytest.mark.parametrize(
    ("line", "fields"),
    [("2 3 32 24 24 3 3 56 56 1 1 1 1 1 1 1 1", {}),  # 24-channel groups: past the boxed form's rule (4-16)
     ("2 1 64 64 3 7 7 224 224 2 2 1 1 3 3 3 3", {}), ("3 1 8 64 64 3 3 3 8 8 8 1 1 1 1 1 1 20 1 1 20 1 1", {})],
)  # fmt: skip
def test_plan_on_sm90a_keeps_the_sm80_plan_for_problems_the_policy_refuses(line, fields, monkeypatch):
    p = _problem(line, **fields)
    got = decide(p, "sm_90a")
    monkeypatch.setattr(policies, "for_target", lambda t: policies.FAMILIES.get(t.family))  # the plan before sm90
    assert got == decide(p, "sm_90a")
    assert not sm90.is_sm90(got)


def test_sm90a_plan_takes_64_row_tiles_where_k_is_64_and_64_column_tiles_where_yxc_is_64():
    k64 = decide(_problem("2 1 256 64 64 3 3 56 56 1 1 1 1 1 1 1 1"), "sm_90a")  # ResNet-50 stage 1's 3x3
    assert sm90.is_sm90(k64) and (k64.tile.m, k64.tile.subgroups_m, k64.tile.n, k64.k_batch) == (64, 1, 192, 44)
    c64 = decide(_problem("2 1 256 256 64 1 1 56 56 1 1 1 1 0 0 0 0"), "sm_90a")  # its 1x1 64 -> 256
    assert (c64.tile.m, c64.tile.subgroups_m, c64.tile.n, c64.k_batch) == (128, 2, 64, 66)
    check_plan(_problem(RESNET_3X3), decide(_problem(RESNET_3X3), "sm_90a"))  # K = 256: 128-row tiles as before
    assert decide(_problem(RESNET_3X3), "sm_90a").tile.m == 128


RESNET50_1X1_64 = "2 1 64 64 64 1 1 56 56 1 1 1 1 0 0 0 0"  # ResNet-50 layer 1's 64 -> 64 1x1 at batch 64 (issue 37)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_every_tile_width_the_sm90a_rule_chooses_is_a_wgmma_shape_of_the_target_table(dtype):
    """The table lists the kernel's shapes by hand: the 64-column tiles came to the rule without their line there."""
    widths = (*sm90.TILE_COST, *sm90.NARROW_COST)
    table = get_target("sm_90a")
    missing = [bn for bn in widths if table.intrinsic(dtype, sm90.WGMMA.format(n=bn, t=dtype.upper())) is None]
    assert not missing, f"the sm_90a rule's tile widths {missing} have no {dtype} wgmma in the target table"


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_sm90a_selects_a_valid_64_column_wgmma_variant_for_resnet50s_64_to_64_1x1(dtype):
    p = ConvBwdWeightProblem.from_ck(RESNET50_1X1_64, dtype=dtype)
    chosen = select(p, "sm_90a", dbs=[], selector=False).variant  # raised "does not run on sm_90a" before
    assert chosen.plan.tile.intrinsic == f"NV_WGMMA_F32_64x64x16_{dtype.upper()}"
    assert (chosen.plan.tile.m, chosen.plan.tile.n) == (64, 64)  # K = 64: one consumer; Y X C = 64: narrow


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_narrow_sm90a_plans_kernel_built_by_the_pass_matches_float64_under_emulation(dtype):
    """The plan's 64 x 64 tile (one consumer warpgroup) and its split, as convbw-explicit-kernel builds them."""
    from sm90_emulator import max_error_of_plan

    p = ConvBwdWeightProblem(1, 4, 64, 64, (16, 16), (1, 1), dtype=dtype, dw_dtype="f32", layout=2)
    plan = decide(p, "sm_90a")
    Variant("convbw", plan)
    assert (plan.tile.m, plan.tile.n, plan.k_batch) == (64, 64, 2), plan
    assert max_error_of_plan(p, plan, seed=1) < 1e-6


def test_sm90a_plan_takes_k_batch_and_tile_n_and_refuses_a_split_past_the_k_tiles():
    p = _problem(RESNET_3X3)
    assert decide(p, "sm_90a", strategy="explicit", k_batch=3).k_batch == 3
    assert decide(p, "sm_90a", strategy="explicit", tile_n=128).tile.n == 128
    with pytest.raises(PlanError, match="tile-n: 32"):
        decide(p, "sm_90a", strategy="explicit", tile_n=32)
    small = _problem(TINY)  # 512 rows: 8 k tiles
    with pytest.raises(PlanError, match="split: r x 9"):
        decide(small, "sm_90a", strategy="explicit", k_batch=9)
    plan = decide(p, "sm_90a")
    with pytest.raises(PlanError, match="tile: "):  # a stored plan edited by hand
        check_plan(p, Plan.from_dict({**plan.to_dict(), "tile": {**plan.to_dict()["tile"], "m": 64}}))


RETINA_K2376 = "2 1 2 2376 256 3 3 100 100 1 1 1 1 1 1 1 1"  # RetinaNet's class head at 100x100: 171 wide tiles


def test_sm90a_plan_takes_streamk_where_the_rule_finds_it_faster_and_refuses_what_the_kernel_lacks():
    plan = decide(_problem(RETINA_K2376), "sm_90a")  # 171 tiles on 132 SMs: StreamK evens the waves
    assert sm90.is_sm90(plan) and plan.streamk.workgroups == 132 and plan.k_batch == 1 and plan.tile.n == 256
    assert plan.workspace_bytes >= 132 * 128 * 256 * 4  # the partials, a 128 x 256 f32 tile a workgroup
    p = _problem(RESNET_3X3)  # 18 tiles: the split, unless StreamK is asked for
    assert decide(p, "sm_90a").streamk is None
    asked = decide(p, "sm_90a", strategy="explicit", streamk="auto")
    assert sm90.is_sm90(asked) and (asked.streamk.workgroups, asked.k_batch) == (132, 1)
    with pytest.raises(PlanError, match="streamk-fixup: tree"):
        decide(p, "sm_90a", strategy="explicit", streamk=8, streamk_fixup="tree")
    with pytest.raises(PlanError, match="split: 2 with streamk"):
        decide(p, "sm_90a", strategy="explicit", streamk=8, k_batch=2)
    check_plan(p, Plan.from_dict(json.loads(json.dumps(asked.to_dict()))))  # a stored StreamK plan replays


# -- the schedule's record and the launcher's encoding ----------------------------------------------------------
def test_tensor_map_record_describes_the_kernel_bindings_as_the_kernel_reads_them():
    from convbw_mlir.kernels.conv_sm90 import ConvSm90

    p = _problem("2 2 3 64 128 3 3 9 11 2 2 2 1 2 1 1 0")  # groups, strides, dilations, uneven pads
    dy, x = sm90.tensor_maps(p, "k0")
    (h, w), (ho, wo) = p.input_size, p.output_size
    g = ConvSm90(p.batch, h, w, 128, 64, 3, 3, ho, wo, p.stride, p.dilation, p.pad_low, groups=2)
    assert (dy["binding"], dy["slot"], dy["mode"], dy["dims"], dy["strides"]) == (
        0,
        0,
        "tiled",
        [128, 3 * ho * wo],
        [256],
    )
    assert (x["binding"], x["slot"], x["mode"], x["dims"]) == (1, 1, "im2col", [256, w, h, 3])
    assert x["strides"] == [512, 512 * w, 512 * w * h] and x["element_strides"] == [1, 2, 2, 1]
    assert (tuple(x["lower"]), tuple(x["upper"])) == g.corners()
    assert {m["maps_binding"] for m in (dy, x)} == {2}


def test_launch_schedule_round_trips_its_tensor_maps_and_refuses_a_malformed_one():
    maps = [TensorMap(**m) for m in sm90.tensor_maps(_problem(TINY), "k0")]
    files = Launch(function="f", tensor_maps=maps).files()
    assert Launch.from_files(files.__getitem__).tensor_maps == maps
    meta = json.loads(files["launch.json"])
    meta["tensor_maps"][1]["lower"] = [0]  # an im2col map of rank 4 takes two corners
    files["launch.json"] = json.dumps(meta).encode()
    with pytest.raises(ValueError, match="launch.json: malformed: .*lower"):
        Launch.from_files(files.__getitem__)


class _FakeDriver:
    """The two encode calls, recorded (no GPU here)."""

    def __init__(self) -> None:
        self.calls = []

    def cuTensorMapEncodeTiled(self, out, dtype, rank, address, dims, strides, box, elems, *enums):  # noqa: N802
        self.calls.append(("tiled", dtype, rank, address, list(dims[:rank]), list(strides[: rank - 1]),
                           list(box[:rank]), list(elems[:rank]), enums))  # fmt: skip
        ctypes.memset(out, 7, 128)
        return 0

    def cuTensorMapEncodeIm2col(self, out, dtype, rank, address, dims, strides, lo, hi, cpp, ppc, elems, *enums):  # noqa: N802
        self.calls.append(("im2col", dtype, rank, address, list(dims[:rank]), list(strides[: rank - 1]),
                           list(lo[: rank - 2]), list(hi[: rank - 2]), cpp, ppc, list(elems[:rank]),
                           enums))  # fmt: skip
        ctypes.memset(out, 9, 128)
        return 0


def test_launcher_encodes_each_map_for_the_bound_address_as_bench_hopper_conv_did():
    """The arguments of bench/hopper_conv.py's _encode_maps (13 of 13 correct on the H100), from the record."""
    p = _problem(RESNET_3X3)
    dy, x = (TensorMap(**m) for m in sm90.tensor_maps(p, "k0"))
    lib = _FakeDriver()
    assert encode_tensor_map(lib, dy, 0x1000) == bytes([7]) * 128
    assert encode_tensor_map(lib, x, 0x2000) == bytes([9]) * 128
    rows = 256 * 14 * 14
    assert lib.calls[0] == ("tiled", 6, 2, 0x1000, [256, rows], [512], [64, 64], [1, 1], (0, 3, 3, 0))
    assert lib.calls[1] == ("im2col", 6, 4, 0x2000, [256, 14, 14, 256], [512, 512 * 14, 512 * 196], [-1, -1], [-1, -1],
                            64, 64, [1, 1, 1, 1], (0, 3, 3, 0))  # fmt: skip


def test_launcher_encodes_a_3d_problems_x_as_a_5d_im2col_map_with_three_corners():
    p = _problem("3 1 2 64 64 3 3 3 4 6 6 1 2 2 1 1 1 1 1 1 1 1 1")  # stride (1, 2, 2)
    _, x = (TensorMap(**m) for m in sm90.tensor_maps(p, "k0"))
    lib = _FakeDriver()
    encode_tensor_map(lib, x, 0x2000)
    # (c, w, h, d, n); corners and strides innermost first: w and h strided by 2, d by 1
    assert lib.calls[0] == ("im2col", 6, 5, 0x2000, [64, 6, 6, 4, 2], [128, 128 * 6, 128 * 36, 128 * 144],
                            [-1, -1, -1], [-2, -2, -1], 64, 64, [1, 2, 2, 1, 1], (0, 3, 3, 0))  # fmt: skip


class _Tensor:
    def __init__(self, address: int) -> None:
        self.address = address

    def data_ptr(self) -> int:
        return self.address


def test_bench_hopper_conv_encodes_its_maps_by_the_launchers_encoder():
    """bench/hopper_conv.py's maps are the product's: the same driver calls as the launcher's for the same problem."""
    from conftest import bench_script

    from convbw_mlir.kernels.conv_sm90 import from_problem

    p = _problem(RESNET_3X3)
    lower, upper = from_problem(p).corners()
    e = {"dtype": "f16", "images": 256, "input_size": [14, 14], "output_size": [14, 14], "in_channels": 256,
         "out_channels": 256, "stride": [1, 1], "lower": list(lower), "upper": list(upper)}  # fmt: skip
    bench, product = _FakeDriver(), _FakeDriver()
    maps = bench_script("hopper_conv")._encode_maps(bench, e, _Tensor(0x1000), _Tensor(0x2000))
    assert maps == bytes([7]) * 128 + bytes([9]) * 128
    for m, address in zip((TensorMap(**m) for m in sm90.tensor_maps(p, "k0")), (0x1000, 0x2000)):
        encode_tensor_map(product, m, address)
    assert bench.calls == product.calls


def test_bench_hopper_gemm_encodes_its_maps_by_the_launchers_encoder():
    from conftest import bench_script

    e = {"dtype": "bf16", "m": 256, "n": 128, "k": 512, "tiling": {"bm": 128, "bn": 64, "cluster": 2}}
    lib = _FakeDriver()
    bench_script("hopper_gemm")._encode_maps(lib, _Tensor(0x1000), _Tensor(0x2000), e)
    # A then B: {K, rows}, one 128-byte row by bm (B: bn / cluster, multicast), 128-byte swizzle
    assert lib.calls == [("tiled", 9, 2, 0x1000, [512, 256], [1024], [64, 128], [1, 1], (0, 3, 3, 0)),
                         ("tiled", 9, 2, 0x2000, [512, 128], [1024], [64, 32], [1, 1], (0, 3, 3, 0))]  # fmt: skip


# -- compiled: the artifact and the IREE runtime's refusal ------------------------------------------------------
@pytest.fixture(scope="module")
def sm90_op():
    from convbw_mlir.build.compile import build_op
    from convbw_mlir.targets import get_target

    return build_op(_problem(TINY), get_target("sm_90a"), output_arg=True)


def test_sm90a_artifact_carries_its_tensor_maps_for_the_kernel_the_schedule_launches(sm90_op, tmp_path):
    from convbw_mlir.build.artifact import CompiledOp

    launch = sm90_op.launch
    assert launch.refused is None and sm90.is_sm90(sm90_op.plan)
    (dispatch,) = launch.dispatches
    assert [m.kernel for m in launch.tensor_maps] == [dispatch.kernel] * 2
    assert dispatch.bindings[0][0] == "arg1" and dispatch.bindings[1][0] == "arg0"  # dy, x: what the maps describe
    assert dispatch.bindings[2][0] == "transient"  # the maps binding: the launcher binds its own buffer there
    loaded = CompiledOp.load(sm90_op.save(tmp_path / "op"))
    assert loaded.launch.tensor_maps == launch.tensor_maps and loaded.plan == sm90_op.plan


def test_3d_sm90a_artifact_binds_x_as_it_is_and_records_a_5d_im2col_map():
    from convbw_mlir.build.compile import build_op
    from convbw_mlir.targets import get_target

    p = _problem("3 1 2 64 64 3 3 3 4 6 6 1 1 1 1 1 1 1 1 1 1 1 1")
    op = build_op(p, get_target("sm_90a"), output_arg=True)
    assert sm90.is_sm90(op.plan) and op.launch.refused is None, op.launch.refused
    dy, x = op.launch.tensor_maps
    assert x.mode == "im2col" and x.dims == (64, 6, 6, 4, 2) and len(x.lower) == 3
    assert "tensor<2x4x6x6x64xf16>" in op.stages["linalg"]  # x dispatched as it is: N D H W (G C)


def test_layout_4_sm90a_artifact_records_the_maps_on_the_transposed_copies_in_the_transient():
    from convbw_mlir.build.compile import build_op
    from convbw_mlir.targets import get_target

    op = build_op(_problem(TINY, layout=4), get_target("sm_90a"), output_arg=True)
    assert sm90.is_sm90(op.plan) and op.plan.channels_last and op.launch.refused is None, op.launch.refused
    (kernel,) = [d for d in op.launch.dispatches if d.kernel == op.launch.tensor_maps[0].kernel]
    # dy and x: the transposes' outputs (regions of the transient), which the launcher's maps then describe
    assert kernel.bindings[0][0] == kernel.bindings[1][0] == "transient"
    assert [m.binding for m in op.launch.tensor_maps] == [0, 1]


def test_split_sm90a_artifact_launches_its_partials_and_stage_2_from_one_transient():
    """A split makes IREE allocate the maps and the partials apart (two queue.allocas); the schedule reader
    refused a second one before: now each is a region of the one transient the direct launch binds."""
    from convbw_mlir.build.compile import build_op
    from convbw_mlir.targets import get_target

    p = _problem("2 1 8 64 64 3 3 16 16 1 1 1 1 1 1 1 1")
    plan = decide(p, "sm_90a", strategy="explicit", k_batch=2)
    launch = build_op(p, get_target("sm_90a"), plan, output_arg=True).launch
    assert launch.refused is None, launch.refused
    kernel, stage2 = launch.dispatches
    partials = kernel.bindings[3]
    assert partials[0] == "transient" and partials[1] >= 256 and stage2.bindings[0] == partials
    assert launch.transient >= partials[1] + 2 * 64 * 576 * 4 and len(launch.tensor_maps) == 2


def test_streamk_sm90a_artifact_zeroes_its_flags_then_binds_maps_partials_and_flags_from_the_transient():
    from convbw_mlir.build.compile import build_op
    from convbw_mlir.targets import get_target

    p = _problem("2 1 8 128 64 3 3 16 16 1 1 1 1 1 1 1 1")
    plan = decide(p, "sm_90a", strategy="explicit", streamk=3)
    launch = build_op(p, get_target("sm_90a"), plan, output_arg=True).launch
    assert launch.refused is None, launch.refused
    fill, kernel = launch.steps[:2]  # the flags' fill (a transfer), then the kernel
    (dispatch,) = launch.dispatches
    assert dispatch == kernel and kernel.grid == (3, 1, 1) and len(kernel.bindings) == 6
    assert [b[0] for b in kernel.bindings[2:5]] == ["transient"] * 3  # maps, partials, flags
    assert (fill.kind, fill.target, fill.pattern) == ("fill", kernel.bindings[4], 0)  # zeroes the flags it reads
    assert fill.length == 3 * 2 * 4  # a flag a consumer warpgroup of each workgroup
    assert [m.kernel for m in launch.tensor_maps] == [kernel.kernel] * 2


def test_iree_runtime_refuses_an_sm90a_artifact_naming_the_target_and_the_direct_launch(sm90_op):
    from convbw_mlir.reference import random_inputs
    from convbw_mlir.runtime import PreparedCall

    x, dy = random_inputs(sm90_op.problem)
    with pytest.raises(ValueError, match="target sm_90a: .* TMA tensor maps.*direct CUDA launch"):
        sm90_op.run(x, dy)
    with pytest.raises(ValueError, match="target sm_90a"):
        PreparedCall(sm90_op.vmfb, "cuda", 0)


# -- the tuner: its variants of the sm_90a kernel run by the direct launch ------------------------------------
def test_tuner_candidates_on_sm90a_are_the_rules_splits_streamk_width_and_the_sm80_kernel():
    from convbw_mlir.dispatch.variants import candidates

    p = _problem(RESNET_3X3)
    base, *rivals = candidates(p, "sm_90a", max_plans=6, iree=False)
    kb, n = base.plan.k_batch, base.plan.tile.n
    assert sm90.is_sm90(base.plan) and base.plan.streamk is None and len(rivals) == 6
    got = [(v.plan.k_batch, v.plan.tile.n, v.plan.streamk is not None, sm90.is_sm90(v.plan)) for v in rivals]
    assert got[:2] == [(2 * kb, n, False, True), (kb // 2, n, False, True)]  # splits +-
    assert got[2][2] and got[2][3]  # StreamK on
    assert got[3][1] in {128, 192} and got[3][0] == kb  # the next tile width
    assert not got[4][3] and rivals[4].plan.tile.intrinsic.startswith("NV_MMA_SYNC")  # the sm_80 kernel
    assert len(set(got)) == 6 and (kb, n, False, True) not in got


def test_tuner_candidates_turn_the_rules_streamk_off():
    """The rule's worst loss on held-out layers was StreamK on a short reduction (issue 39): off is a neighbour."""
    from convbw_mlir.dispatch.variants import candidates

    p = _problem("2 1 32 1024 1024 3 3 14 14 1 1 1 1 1 1 1 1")
    base, *rivals = candidates(p, "sm_90a", max_plans=3, iree=False)
    assert base.plan.streamk is not None
    assert any(v.plan.streamk is None and v.plan.k_batch == base.plan.k_batch and sm90.is_sm90(v.plan) for v in rivals)


def test_tuner_builds_sm90a_variants_with_an_output_argument_and_ships_their_launch_to_the_runner(
    tmp_path, monkeypatch
):
    """IREE's runtime refuses the sm_90a kernel, so the runner launches it directly: the tuner's manifest
    carries the schedule beside the vmfb, compiled with the ABI the launcher binds (x, dy, dW)."""
    from convbw_mlir.dispatch import build, tune
    from convbw_mlir.dispatch.tune import compile_candidates
    from convbw_mlir.dispatch.variants import heuristic
    from convbw_mlir.measure import run
    from convbw_mlir.measure.records import ManifestEntry
    from convbw_mlir.measure.run import _Problem, _run_contender

    def _read(folder):
        return json.loads((Path(folder) / "manifest.json").read_text())

    monkeypatch.setattr(build, "candidates", lambda p, t, **_: [heuristic(p, t)])  # the sm_90a plan alone
    p = _problem(TINY)
    compile_candidates([("tiny", p, False)], "sm_90a", tmp_path / "built", max_plans=0, progress=False,
                       cache=tmp_path / "cache", log=lambda _: None)  # fmt: skip
    manifest = json.loads((tmp_path / "built" / "manifest.json").read_text())
    (entry,) = manifest["problems"]
    rec = entry["contenders"]["convbw[heuristic]"]
    assert build.direct_only(heuristic(p, "sm_90a")) and rec["ok"], rec
    launch = Launch.from_files(lambda name: (tmp_path / "built" / rec["launch"] / name).read_bytes())
    assert launch.refused is None and len(launch.tensor_maps) == 2
    assert len(launch.arg_bytes) == 3 and launch.arg_bytes[2] == 2 * int(np.prod(p.dw_shape))  # dW: an argument
    assert "launch" not in entry["contenders"]["reference"]  # IREE's own kernels: its runtime runs them
    prob = _Problem(p, tmp_path, 0)
    got = _run_contender(tmp_path / "built", prob, rec, "local-task", None)
    assert got["status"] == "n/a" and "direct CUDA launch" in got["error"]
    staged = []  # the timing half runs each problem from a folder of its own: the launch must be found there
    monkeypatch.setattr(run, "run_manifest", lambda folder, *_, **__: staged.append(_read(folder)) or {})
    tune._run_one(tmp_path / "built", ManifestEntry.from_dict(entry), log=lambda _: None)
    where = staged[0]["problems"][0]["contenders"]["convbw[heuristic]"]["launch"]
    assert (Path(where) / "launch.json").is_file()


# -- the torch entry ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("capability", "line", "target"),
    [((9, 0), RESNET_3X3, "sm_90a"), ((9, 0), "2 32 32 4 4 3 3 56 56 1 1 1 1 1 1 1 1", "sm_90a"),  # boxed
     ((9, 0), "2 3 32 24 24 3 3 56 56 1 1 1 1 1 1 1 1", "sm_80"),  # 24-channel groups: the sm_80 kernel
     ((9, 0), "3 1 8 256 128 3 3 3 8 28 28 2 2 2 1 1 1 1 1 1 1 1 1", "sm_90a"),  # a 3-D layer: the same kernel
     ((8, 0), RESNET_3X3, "sm_80"), ((8, 9), RESNET_3X3, "sm_89"), ((10, 0), RESNET_3X3, "sm_80")],
)  # fmt: skip
def test_torch_entry_picks_sm90a_on_compute_capability_9_0_where_the_kernel_takes_the_problem(
    capability, line, target, monkeypatch
):
    torch = pytest.importorskip("torch")
    from convbw_mlir.torch import entry

    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: capability)
    assert entry.target_for(torch.device("cuda", 0), _problem(line)) == (target, "cuda", 0)
    assert entry.target_for(torch.device("cuda", 0))[0] != "sm_90a"  # no problem: never the arch-specific target


def test_driver_table_declares_the_tensor_map_encoders_where_the_driver_has_them(monkeypatch):
    """The GPU run's first try failed in ``_libcuda`` itself (the optional signatures were joined as a set of
    unhashable lists); a stand-in driver library shows the table built and both encoders declared."""
    from convbw_mlir import cuda_launch

    class _Fn:
        def __call__(self, *args):
            return 0

    class _Lib:
        def __getattr__(self, name):
            fn = _Fn()
            setattr(self, name, fn)
            return fn

    monkeypatch.setattr(cuda_launch, "_LIB", None)
    monkeypatch.setattr(cuda_launch.ctypes, "CDLL", lambda name: _Lib())
    lib = cuda_launch._libcuda()
    assert len(lib.cuTensorMapEncodeTiled.argtypes) == 12 and len(lib.cuTensorMapEncodeIm2col.argtypes) == 15
    assert lib.cuMemcpyHtoDAsync_v2.restype is ctypes.c_int


class _FakeContext(_FakeDriver):
    """Enough of the driver for a CudaLauncher on a cc-9.0 device: launches, allocations and copies recorded."""

    def __init__(self) -> None:
        super().__init__()
        self.launches, self.copies, self._host = [], [], []

    def _set(self, ref, value):  # a ctypes.byref() argument
        ref._obj.value = value
        return 0

    def cuDeviceGet(self, ref, index):  # noqa: N802
        return self._set(ref, index)

    def cuDeviceGetAttribute(self, ref, attribute, dev):  # noqa: N802
        return self._set(ref, {75: 9, 76: 0}[attribute])

    def cuDevicePrimaryCtxRetain(self, ref, dev):  # noqa: N802
        return self._set(ref, 1234)

    def cuCtxGetCurrent(self, ref):  # noqa: N802
        return self._set(ref, 1234)

    def cuModuleLoadData(self, ref, image):  # noqa: N802
        return self._set(ref, 1)

    def cuModuleGetFunction(self, ref, module, name):  # noqa: N802
        return self._set(ref, 77)

    def cuFuncSetAttribute(self, *args):  # noqa: N802
        return 0

    def cuMemAlloc_v2(self, ref, size):  # noqa: N802
        return self._set(ref, 0xD0000000 + 0x100000 * len(self._host))

    def cuMemAllocHost_v2(self, ref, size):  # noqa: N802
        self._host.append((ctypes.c_uint8 * size)())
        return self._set(ref, ctypes.addressof(self._host[-1]))

    def cuMemcpyHtoDAsync_v2(self, dst, src, length, stream):  # noqa: N802
        self.copies.append((dst, ctypes.string_at(src, length), stream))
        return 0

    def cuLaunchKernel(self, func, gx, gy, gz, bx, by, bz, shared, stream, params, extra):  # noqa: N802
        slots = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))
        self.launches.append([ctypes.c_uint64.from_address(slots[i]).value for i in range(4)])
        return 0

    # the GPU's progress, told by the test: with `hold` an event recorded stays not ready until `release()` or a
    # cuEventSynchronize on it; `capturing`: the streams being captured into a graph
    hold, capturing = False, frozenset()

    def cuStreamIsCapturing(self, stream, ref):  # noqa: N802
        return self._set(ref, int(stream in self.capturing))

    def cuEventCreate(self, ref, flags):  # noqa: N802
        self.pending = getattr(self, "pending", {})
        self.pending[len(self.pending) + 1] = False
        return self._set(ref, len(self.pending))

    def cuEventRecord(self, event, stream):  # noqa: N802
        self.pending[event] = self.hold
        return 0

    def cuEventQuery(self, event):  # noqa: N802
        return 600 if self.pending[event] else 0  # CUDA_ERROR_NOT_READY

    def cuEventSynchronize(self, event):  # noqa: N802
        self.waited = [*getattr(self, "waited", []), event]
        self.pending[event] = False
        return 0

    def release(self):
        self.pending = dict.fromkeys(self.pending, False)

    def cuThreadExchangeStreamCaptureMode(self, ref):  # noqa: N802
        self.modes = [*getattr(self, "modes", []), ref._obj.value]
        self.mode, ref._obj.value = ref._obj.value, getattr(self, "mode", 0)  # 0: CU_STREAM_CAPTURE_MODE_GLOBAL
        return 0


def test_direct_launch_binds_maps_encoded_for_the_bound_addresses_once_per_address_pair_and_stream(monkeypatch):
    from convbw_mlir import cuda_launch
    from convbw_mlir.cuda_launch import CudaLauncher, Dispatch, ExportDef

    maps = [TensorMap(**m) for m in sm90.tensor_maps(_problem(TINY), "k0")]
    launch = Launch("f", [Dispatch("k0", (1, 1, 1), (("arg1", 0), ("arg0", 0), ("transient", 0), ("arg2", 0)))],
                    256, (0, 0, 0), {"k0": ExportDef("k0", 0, (384, 1, 1), 1024, 0, 4)},
                    [b".version 8.0\n.target sm_90a\n"], tensor_maps=maps)  # fmt: skip
    lib = _FakeContext()
    monkeypatch.setattr(cuda_launch, "_libcuda", lambda: lib)
    launcher = CudaLauncher(launch, 0)
    x, dy, dw, ws = 0x1000, 0x2000, 0x3000, 0x4000
    launcher((x, dy, dw, ws), 5)
    launcher((x, dy, dw, ws), 5)  # the same memory: the same maps, nothing encoded or copied again
    launcher((x + 0x100, dy, dw, ws), 5)  # x moved: a new slot
    assert [c[3] for c in lib.calls] == [dy, x, dy, x + 0x100]  # each map encoded for its binding's address
    assert [(c[0], c[2]) for c in lib.copies] == [(0xD0000000, 5), (0xD0000100, 5)]  # on the call's stream
    assert lib.copies[0][1] == bytes([7]) * 128 + bytes([9]) * 128  # dy's map in slot 0, x's in slot 1
    slot = [launch_[2] for launch_ in lib.launches]
    assert slot == [0xD0000000, 0xD0000000, 0xD0000100]  # the maps binding is the launcher's slot, not ws
    assert lib.launches[0][:2] == [dy, x] and lib.launches[0][3] == dw
    launcher((x, dy, dw, ws), 6)  # the same memory on another stream: its own slot, copied in that stream's order
    assert lib.copies[-1][2] == 6 and lib.launches[-1][2] == 0xD0000200
    copies = len(lib.copies)  # a graph captured on stream 7 and replayed on 5 reads stream 5's slot: no copy in it
    launcher((x, dy, dw, ws), 7, maps_stream=5)
    assert len(lib.copies) == copies and lib.launches[-1][2] == 0xD0000000


def test_the_launcher_builds_a_maps_constant_arguments_once_and_encodes_each_new_address_pair_alike(monkeypatch):
    # moving memory encodes both maps every call: their dims, strides, box and corners are built once per launcher
    # (bench/host_path.py: building them was most of the encoding's host time); the bytes are encode_tensor_map's
    from convbw_mlir import cuda_launch
    from convbw_mlir.cuda_launch import CudaLauncher, Dispatch, ExportDef

    maps = [TensorMap(**m) for m in sm90.tensor_maps(_problem(TINY), "k0")]
    launch = Launch("f", [Dispatch("k0", (1, 1, 1), (("arg1", 0), ("arg0", 0), ("transient", 0), ("arg2", 0)))],
                    256, (0, 0, 0), {"k0": ExportDef("k0", 0, (384, 1, 1), 1024, 0, 4)},
                    [b".version 8.0\n.target sm_90a\n"], tensor_maps=maps)  # fmt: skip
    lib = _FakeContext()
    arrays = []
    tiled, im2col = lib.cuTensorMapEncodeTiled, lib.cuTensorMapEncodeIm2col
    lib.cuTensorMapEncodeTiled = lambda out, dtype, rank, address, dims, *rest: (
        arrays.append(("tiled", dims, rest[:3])) or tiled(out, dtype, rank, address, dims, *rest)
    )
    lib.cuTensorMapEncodeIm2col = lambda out, dtype, rank, address, dims, *rest: (
        arrays.append(("im2col", dims, rest[:3])) or im2col(out, dtype, rank, address, dims, *rest))  # fmt: skip
    monkeypatch.setattr(cuda_launch, "_libcuda", lambda: lib)
    launcher = CudaLauncher(launch, 0)
    x, dy, dw, ws = 0x1000, 0x2000, 0x3000, 0x4000
    for i in range(3):
        launcher((x + 0x100 * i, dy + 0x100 * i, dw, ws), 5)
    assert [c[3] for c in lib.calls] == [dy, x, dy + 0x100, x + 0x100, dy + 0x200, x + 0x200]
    for kind in ("tiled", "im2col"):
        mine = [a for a in arrays if a[0] == kind]
        assert len(mine) == 3 and all(m[1] is mine[0][1] and all(p is q for p, q in zip(m[2], mine[0][2]))
                                      for m in mine)  # fmt: skip
    reference = _FakeDriver()
    for i, (_, data, _) in enumerate(lib.copies):
        pair = (dy + 0x100 * i, x + 0x100 * i)
        assert data == b"".join(encode_tensor_map(reference, m, a) for m, a in zip(maps, pair))
    assert reference.calls == lib.calls  # the same arguments, map by map


def _slots_launcher(monkeypatch, cap: int | None):
    """A CudaLauncher of TINY's kernel with its two maps on _FakeContext, ``cap`` slots ($CONVBW_TENSOR_MAP_SLOTS)."""
    from convbw_mlir import cuda_launch
    from convbw_mlir.cuda_launch import CudaLauncher, Dispatch, ExportDef

    if cap is None:
        monkeypatch.delenv(cuda_launch.MAP_SLOTS_ENV, raising=False)
    else:
        monkeypatch.setenv(cuda_launch.MAP_SLOTS_ENV, str(cap))
    maps = [TensorMap(**m) for m in sm90.tensor_maps(_problem(TINY), "k0")]
    launch = Launch("f", [Dispatch("k0", (1, 1, 1), (("arg1", 0), ("arg0", 0), ("transient", 0), ("arg2", 0)))],
                    256, (0, 0, 0), {"k0": ExportDef("k0", 0, (384, 1, 1), 1024, 0, 4)},
                    [b".version 8.0\n.target sm_90a\n"], tensor_maps=maps)  # fmt: skip
    lib = _FakeContext()
    lib.hold, lib.capturing = False, frozenset()
    monkeypatch.setattr(cuda_launch, "_libcuda", lambda: lib)
    return CudaLauncher(launch, 0), lib, maps


def test_tensor_map_slots_stay_bounded_over_10000_moving_address_pairs(monkeypatch):
    # issue 37: a slot per new (x, dy) pair, never freed, grew device and pinned memory without bound
    launcher, lib, _ = _slots_launcher(monkeypatch, None)
    allocs = []
    alloc = lib.cuMemAlloc_v2
    lib.cuMemAlloc_v2 = lambda ref, size: allocs.append(size) or alloc(ref, size)
    for i in range(10_000):
        launcher((0x100000 + 16 * i, 0x900000 + 16 * i, 0x3000, 0x4000), 5)
    assert launcher.encodings == 10_000 and len(launcher.slots.device) == 64 and allocs == [64 * 256]
    assert len({c[0] for c in lib.copies}) == 64  # every upload into one of the 64 slots
    assert launcher.slots.waits == 0  # the GPU (the fake) was done with each before its reuse: nobody waited


def test_a_tensor_map_slot_still_read_by_unfinished_work_is_never_overwritten(monkeypatch):
    launcher, lib, _ = _slots_launcher(monkeypatch, 2)
    slots = launcher.slots
    lib.hold = True  # the GPU reads nothing until told: every event recorded stays not ready
    written = []

    def check(where):  # a slot's pinned twin or device memory is written only once its last reader is done
        slot = slots.host.index(where) if where in slots.host else slots.device.index(where)
        assert not lib.pending[slots.events[slot]], f"slot {slot} overwritten while the GPU may still read it"
        written.append(slot)

    encode, upload = lib.cuTensorMapEncodeTiled, lib.cuMemcpyHtoDAsync_v2
    lib.cuTensorMapEncodeTiled = lambda out, *a: check(out) or encode(out, *a)
    lib.cuMemcpyHtoDAsync_v2 = lambda dst, *a: check(dst) or upload(dst, *a)
    pairs = [(0x10000 * i, 0x800000 + 0x10000 * i, 0x3000, 0x4000) for i in range(1, 6)]
    launcher(pairs[0], 5)
    launcher(pairs[1], 5)
    assert not getattr(lib, "waited", [])
    launcher(pairs[0], 5)  # a pair still held: its slot as it is, nothing written
    assert written == [0, 0, 1, 1]
    launcher(pairs[2], 5)  # both slots read by queued work: the least recently used one (pair 1's) waited for
    assert lib.waited == [slots.events[1]] and written[-2:] == [1, 1] and slots.waits == 1
    lib.release()  # the GPU caught up: the next reuse takes pair 0's slot without a wait
    launcher(pairs[3], 5)
    assert lib.waited == [slots.events[1]] and written[-2:] == [0, 0] and len(slots.device) == 2


def test_a_tensor_map_slot_a_cuda_graph_captured_outlives_every_reuse(monkeypatch):
    # a graph holds the slot's address (and the upload from its pinned twin): pinned for good, outside the cap
    launcher, lib, _ = _slots_launcher(monkeypatch, 2)
    x, dy, dw, ws = 0x1000, 0x2000, 0x3000, 0x4000
    launcher((x, dy, dw, ws), 5)  # a plain launch on stream 5, then DirectCall's graph of it captured on 7
    lib.capturing = frozenset({7})
    launcher((x, dy, dw, ws), 7, maps_stream=5)  # binds stream 5's slot: the graph keeps it
    assert getattr(lib, "modes", []) == []  # the graph's slot was found: nothing allocated or waited for
    launcher((x + 0x100, dy, dw, ws), 7)  # torch capturing a call on new memory: its own slot, also kept
    # taking it may allocate or wait, which a capture refuses as unsafe: relaxed (2) around it, then put back
    assert lib.modes == [2, 0] and lib.mode == 0
    lib.capturing = frozenset()
    graph_slots = {lib.launches[-2][2], lib.launches[-1][2]}
    assert len(graph_slots) == 2
    for i in range(50):
        launcher((0x100000 + 16 * i, 0x900000 + 16 * i, dw, ws), 5)
    rewritten = {c[0] for c in lib.copies[2:]}
    assert not rewritten & graph_slots and len(rewritten) == 2  # the cap's two slots took the 50 pairs
    assert len(launcher.slots.device) == 4
    launcher((x, dy, dw, ws), 5)  # the graph's memory again: its slot, as the graph has it, no new encoding
    assert lib.launches[-1][2] in graph_slots and len(lib.copies) == 52


def test_a_pair_that_comes_back_after_its_slot_was_reused_gets_the_same_map_bytes(monkeypatch):
    launcher, lib, maps = _slots_launcher(monkeypatch, 1)
    pairs = [(0x1000, 0x2000, 0x3000, 0x4000), (0x5000, 0x6000, 0x3000, 0x4000)]
    for ptrs in (*pairs, pairs[0]):
        launcher(ptrs, 5)
    first, _, again = (c[1] for c in lib.copies)
    assert first == again == b"".join(encode_tensor_map(_FakeDriver(), m, a) for m, a in zip(maps, (0x2000, 0x1000)))
    assert len({c[0] for c in lib.copies}) == 1  # one slot, rewritten each time


@pytest.mark.parametrize("value", ["0", "-3", "many", "2.5"])
def test_a_bad_tensor_map_slots_setting_is_one_error_naming_it(monkeypatch, value):
    from convbw_mlir import cuda_launch

    monkeypatch.setenv(cuda_launch.MAP_SLOTS_ENV, value)
    with pytest.raises(ValueError, match=rf"CONVBW_TENSOR_MAP_SLOTS='{value}': .* >= 1"):
        cuda_launch.map_slots_cap()
    assert cuda_launch.map_slots_cap(" 3 ") == 3


def test_the_isa_report_counts_sm90a_wgmma_written_as_inline_ptx():
    from convbw_mlir.build.isa import parse_nvptx_ll

    op = "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16"
    asm = f'  %r = call {{ float, float }} asm sideeffect "{op} {{$0}}", "=f"()'
    ll = f"define void @k(ptr %a) {{\n{asm}\n{asm}\n  ret void\n}}\n"
    (kernel,) = parse_nvptx_ll(ll)
    assert kernel.mma == {"wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16": 2}


# -- epilogues: carried by the second pass (the split's sum, or one rounding pass of the kernel's f32 result) -----
@pytest.mark.parametrize(
    ("epilogue", "k_batch"),
    [(Epilogue("scale", 0.5), 1), (Epilogue("scale", 0.5), 2), (Epilogue("bilinear", 2.0, 0.5, d_dtype="f32"), 1),
     (Epilogue("accumulate"), 2)],
)  # fmt: skip
def test_sm90a_kernel_takes_an_epilogue_into_its_second_pass(epilogue, k_batch):
    from convbw_mlir.build.compile import build_op
    from convbw_mlir.targets import get_target

    p = _problem("2 1 8 64 64 3 3 16 16 1 1 1 1 1 1 1 1").with_(epilogue=epilogue)
    plan = decide(p, "sm_90a", strategy="explicit", k_batch=k_batch)
    assert sm90.is_sm90(plan) and plan.k_batch == k_batch
    op = build_op(p, get_target("sm_90a"), plan, output_arg=True)
    kernel, finish = op.launch.dispatches  # the kernel, then the sum or the rounding pass with the epilogue
    assert op.launch.refused is None and len(op.launch.tensor_maps) == 2
    assert len(finish.bindings) == (3 if epilogue.reads_d else 2)  # f32 sums (and D) in, dW out
    assert "mulf" in op.stages["linalg"] or epilogue.alpha == 1.0


def test_sm90a_plan_with_an_epilogue_never_takes_streamk():
    big = _problem("2 1 64 2376 256 3 3 100 100 1 1 1 1 1 1 1 1")  # RetinaNet's head: StreamK by the rule
    assert decide(big, "sm_90a").streamk is not None
    with_scale = big.with_(epilogue=Epilogue("scale", 0.5))
    plan = decide(with_scale, "sm_90a")
    assert sm90.is_sm90(plan) and plan.streamk is None
    with pytest.raises(PlanError, match="streamk: 'auto' with the scale epilogue"):
        decide(with_scale, "sm_90a", strategy="explicit", streamk="auto")


def test_bench_manifest_carries_the_sm90a_kernels_launch_for_the_runner(tmp_path):
    """``convbw bench --target sm_90a``: our contender is the direct launch's (IREE's runtime refuses it)."""
    from convbw_mlir.build.contenders import compile_contenders

    records = compile_contenders(
        _problem(TINY), "tiny", "sm_90a", tmp_path, ("convbw", "convbw:strategy=explicit,k_batch=2")
    )
    for rec in records.values():
        assert rec["ok"] and rec["launch"], rec
        launch = Launch.from_files(lambda name, rec=rec: (tmp_path / rec["launch"] / name).read_bytes())
        assert len(launch.tensor_maps) == 2 and len(launch.arg_bytes) == 3
    assert records["convbw:strategy=explicit,k_batch=2"]["config"]["k_batch"] == 2


@pytest.mark.parametrize("line", ["1 1 4 64 128 3 89 2 1 0 2", "3 1 2 64 64 3 3 3 4 6 6 1 1 1 1 1 1 1 1 1 1 1 1"])
def test_streamk_builds_at_rank_1_and_3(line):
    """Its x binding is x at its own rank (found by the fenced fuzz: a 1-D StreamK plan did not compile)."""
    from convbw_mlir.build.compile import build_op
    from convbw_mlir.targets import get_target

    p = _problem(line)
    plan = decide(p, "sm_90a", strategy="explicit", streamk=4)
    assert sm90.is_sm90(plan) and plan.streamk is not None
    op = build_op(p, get_target("sm_90a"), plan, output_arg=True)
    assert op.launch.refused is None and len(op.launch.tensor_maps) == 2


def test_sm90a_plan_takes_a_64_wide_tile_asked_on_a_wide_problem_and_the_kernel_computes_it():
    # was a KeyError from the rule's StreamK estimate (it has no 64-wide cost); bench/tail7.py's grid asks for it
    from sm90_emulator import max_error_of_plan

    p = _problem("2 1 32 2048 512 1 1 7 7 1 1 1 1 0 0 0 0")  # ResNet-50 layer4's 1x1 at N=32: 1,568 rows
    for asked in ({}, {"k_batch": 2}, {"streamk": "auto"}):
        plan = decide(p, "sm_90a", strategy="explicit", tile_n=64, **asked)
        assert sm90.is_sm90(plan) and plan.tile.n == 64, plan
    assert decide(p, "sm_90a").tile.n != 64  # the rule weighs the narrow width only where n <= 64
    small = ConvBwdWeightProblem(1, 4, 128, 128, (8, 8), (1, 1), dtype="f16", dw_dtype="f32", layout=2)
    plan = decide(small, "sm_90a", strategy="explicit", tile_n=64, k_batch=2)
    assert (plan.tile.n, plan.k_batch) == (64, 2), plan  # two 64-wide column tiles
    assert max_error_of_plan(small, plan, seed=1) < 1e-6
