"""The plan never chooses a form the fenced GPU fuzz found wrong (IREE 3.13's CUDA codegen), by rule:

* a 1x1 with stride or padding is the GEMM of the x and dy window that reads inside the image
  (docs/decisions.md#padded-1x1);
* layout 1 (GNHWC), and layout 3's convolutions, are computed in layout 2 on transposed x and dy
  (docs/decisions.md#relayout);
* IREE's own tiling of a 16-bit problem with one in channel is split at most 16 ways
  (docs/decisions.md#split-iree-step).

The reproducers are the fuzz's (bench/results/h100_2026-11-25_fenced_fuzz*/README.md); the rewrites'
numerics are checked on the host.
"""

import random

import pytest
from conftest import bench_script
from test_epilogue import EPILOGUES, run
from test_numerics_cpu import P, check

from convbw_mlir.build.compile import lowered_text
from convbw_mlir.pipelines import for_target
from convbw_mlir.plan import (
    LAYOUT_2,
    MAX_IREE_SPLITS,
    RELAYOUT,
    Strategy,
    as_gemm,
    decide,
    one_tap_window,
    relayout,
)
from convbw_mlir.problem import ConvBwdWeightProblem
from convbw_mlir.reference import assert_close

# key: (ck problem line, layout, dtype[, dW dtype]) of the fuzz's failing problems
REPRODUCERS = {
    "layers0024": ("3 1 5 36 32 1 1 1 3 5 5 1 3 1 1 1 1 1 0 0 1 1 0", 1, "f16"),
    "layers0073": ("2 2 4 32 8 1 1 16 16 1 3 2 1 0 1 0 0", 3, "f16"),
    "layers0098": ("1 16 2 2 1 7 23 3 2 0 0", 1, "bf16"),
    "explicit0073": ("2 2 16 64 8 1 1 5 14 2 2 2 2 1 1 1 1", 4, "f16"),
    "explicit0091": ("2 2 4 128 8 1 1 22 18 2 2 1 1 0 0 1 1", 4, "f16"),
    "fuzz0030": ("3 4 16 8 32 1 1 1 3 4 3 2 1 1 1 1 1 0 0 1 0 0 1", 2, "f16"),
    "fuzz0038": ("2 2 4 16 8 7 7 13 13 2 3 2 1 2 4 3 4", 1, "f16", "f32"),
    "fuzz0040": ("1 1 32 16 1 3 29 2 1 2 2", 2, "f16"),
    "fuzz0081": ("3 1 16 8 4 1 1 1 5 7 4 2 1 3 1 1 1 0 0 1 0 1 1", "NHWC/KYXC/NHWK", "f16"),
    "fuzz0138": ("2 4 8 16 8 4 4 12 12 1 1 1 1 0 0 0 0", 1, "bf16"),
    "fuzz0152": ("3 2 2 32 16 1 1 1 4 8 8 3 1 2 1 1 3 0 0 1 1 0 1", 2, "f16"),
    "fuzz0200": ("1 2 3 8 32 3 41 1 2 1 3", 1, "f16", "f32"),
    "fuzz0233": ("2 1 1 16 64 4 4 19 19 2 2 3 1 0 0 0 0", 3, "f16"),
    "fuzz0289": ("2 4 5 4 2 3 3 12 8 1 2 1 1 0 0 0 1", 1, "f16"),
    "fuzz0294": ("3 4 8 3 4 1 1 1 5 3 4 1 2 1 1 2 3 1 0 0 1 0 0", 4, "f16"),
    "fuzz0319": ("2 3 3 16 16 1 1 9 9 1 1 1 1 0 0 0 0", 1, "f16"),
    "fuzz0322": ("3 4 1 8 32 1 1 1 6 6 6 1 1 2 1 1 1 0 0 1 0 0 1", 2, "f16"),
    "fuzz0340": ("2 32 32 2 1 4 4 9 15 2 2 3 1 4 2 4 1", 3, "bf16"),
    "fuzz0381": ("3 4 32 8 8 1 1 1 5 5 8 2 1 1 1 1 1 0 0 1 0 0 1", 2, "bf16"),
    "fuzz0383": ("3 3 3 8 16 1 1 1 7 3 7 2 1 1 1 1 3 0 1 0 0 1 0", 4, "f16", "f32"),
    "fuzz0417": ("2 64 1 2 1 2 2 7 7 1 2 1 1 0 0 0 0", 1, "bf16"),
    "fuzz0438": ("2 1 16 64 24 1 1 5 5 2 1 1 3 0 0 0 1", "NHWC/KYXC/NHWK", "f16"),
    "fuzz0444": ("3 8 3 8 16 1 1 1 8 8 8 1 3 1 2 1 1 0 0 0 1 0 0", 2, "f16", "f32"),
    "fuzz0471": ("3 2 16 16 16 1 1 1 8 3 6 2 1 1 1 2 1 0 1 1 0 1 1", 2, "f16"),
}


def reproducer(key: str) -> ConvBwdWeightProblem:
    line, layout, dtype, *dw = REPRODUCERS[key]
    p = ConvBwdWeightProblem.from_ck(line, dtype=dtype, layout=layout)
    return p.with_(dw_dtype=dw[0]) if dw else p


def known_wrong(p: ConvBwdWeightProblem, target: str = "sm_80") -> str | None:
    """Which known-wrong class the plan's own choice for ``p`` falls in, or None."""
    plan = decide(p, target)
    computed = relayout(p)
    if computed.layout_family.name == RELAYOUT[0]:
        return "layout 1"
    if plan.strategy == Strategy.EXPLICIT:  # our kernels: no known-wrong class
        return None
    one = all(f == 1 for f in p.filter_size)
    if one and (any(s > 1 for s in p.stride) or any(p.pad_low) or any(p.pad_high)) and not plan.gemm:
        if one_tap_window(p) is not None:
            return "1x1 with stride or padding as a convolution"
    if computed.layout_family.name == RELAYOUT[1] and not one:
        return "layout-3 convolution"
    split = plan.split
    iree_tiles = plan.strategy == Strategy.IREE or (plan.strategy == Strategy.SIMT and plan.simt is None)
    one_in = p.dtype != "f32" and p.in_channels == 1 and p.out_channels > 1
    if iree_tiles and split is not None and split.k_batch > MAX_IREE_SPLITS and one_in:
        return f"IREE's own tiling of {split.k_batch} splits"
    return None


@pytest.mark.parametrize("key", list(REPRODUCERS))
def test_the_plan_for_each_fuzz_reproducer_is_in_no_known_wrong_class(key):
    assert known_wrong(reproducer(key)) is None


def test_the_plan_for_random_fuzz_problems_is_in_no_known_wrong_class():
    fuzz = bench_script("fenced_fuzz")
    wrong = []
    for i in range(400):
        _, p = fuzz.random_problem(random.Random(11 * 1_000_003 + i))  # the fuzz's own draws, seed 11
        why = known_wrong(p)
        if why:
            wrong.append(f"{p.name}: {why}")
    assert not wrong


def test_a_padded_strided_1x1_is_the_gemm_of_its_window():
    p = reproducer("explicit0091")  # 22x18, stride 2, pad high 1: output 12x10, rows 0..10 and 0..8 read x
    assert one_tap_window(p) == ((0, 11), (0, 9))
    assert as_gemm(p).input_size == (11 * 9,) and as_gemm(p).pad_high == (0,)
    assert decide(p, "sm_80", strategy="codegen").gemm  # layout 4's own codegen form (the plan: GEMV in layout 2)
    low = P(1, 2, 4, 8, (7, 7), (1, 1), stride=2, pad_low=1, pad_high=1)  # output 5x5, only 1..3 read x
    assert one_tap_window(low) == ((1, 3), (1, 3))
    assert one_tap_window(P(1, 1, 4, 8, (1,), (1,), stride=2, pad_low=1)) is None  # reads padding only


def test_layout_1_and_layout_3_convolutions_are_planned_and_lowered_in_layout_2():
    for key in ("fuzz0138", "fuzz0233", "layers0098"):
        p = reproducer(key)
        assert relayout(p).layout == LAYOUT_2 and relayout(p).dw_shape == p.dw_shape
        assert decide(p, "sm_80") == decide(relayout(p), "sm_80")
    text = lowered_text(reproducer("layers0098"), for_target("sm_80", strategy="codegen"))  # the op stays in IR
    assert "linalg.transpose" in text and 'layout = "NHWGC/GKYXC/NHWGK"' in text
    one = reproducer("layers0073")  # a layout-3 1x1 stays a layout-3 GEMM
    assert relayout(one) == one


def test_iree_tiled_splits_of_one_in_channel_stay_at_16_or_fewer():
    for key in ("fuzz0040", "fuzz0340"):  # 32 splits of one image each gave wrong dW
        plan = decide(reproducer(key), "sm_80", strategy="codegen")  # by default the depthwise kernel's now
        assert plan.split is not None and plan.split.k_batch <= MAX_IREE_SPLITS


# -- the rewrites' numerics on the host ---------------------------------------------------------------
@pytest.mark.parametrize(
    "p",
    [
        P(2, 2, 8, 4, (7, 6), (1, 1), stride=2, pad_low=(0, 1), pad_high=1, layout=4),
        P(1, 2, 4, 8, (7, 7), (1, 1), stride=2, dilation=(3, 1), pad_low=1, pad_high=1),
        P(1, 2, 4, 6, (5, 4, 3), (1, 1, 1), stride=(2, 1, 3), pad_low=(1, 0, 1), pad_high=(1, 1, 1), layout=1),
        P(1, 3, 5, 4, (9,), (1,), pad_low=2, pad_high=1, layout="NHWC/KYXC/NHWK", dtype="f32"),
    ],
    ids=["2d_l4_s2_pad_high", "2d_s2_pad1_crops_low", "3d_l1_s2x1x3", "1d_nhwc_s1_pad"],
)
def test_padded_strided_1x1_window_gemm_matches_reference(compiled, p):
    check(compiled, p)
    assert "util.optimization_barrier" in compiled(p).stages["linalg"]


@pytest.mark.parametrize(
    "p, options",
    [
        (P(2, 3, 4, 6, (9, 8), (3, 3), stride=(2, 1), pad_low=1, pad_high=(0, 1), layout=1), {}),
        (P(2, 3, 4, 6, (9, 8), (3, 3), stride=(2, 1), pad_low=1, pad_high=(0, 1), layout=1), {"k_batch": 2}),
        (P(4, 2, 1, 2, (17,), (7,), stride=3, dilation=2, layout=1, dtype="bf16"), {}),
        (P(1, 2, 8, 4, (10, 9), (4, 4), stride=2, dilation=(3, 1), layout=3), {}),
    ],
    ids=["l1_3x3", "l1_3x3_split2", "l1_1d_depthwise", "l3_4x4_s2"],
)
def test_relayout_matches_reference(compiled, p, options):
    check(compiled, p, **options)
    assert "linalg.transpose" in compiled(p, "host", **options).stages["linalg"]


def test_relayout_keeps_the_epilogue_and_its_d(compiled):
    p = P(2, 2, 4, 6, (6, 6), (3, 3), pad_low=1, pad_high=1, layout=1).with_(epilogue=EPILOGUES["bilinear"])
    got, want = run(compiled, p)
    assert_close(p, got, want)
