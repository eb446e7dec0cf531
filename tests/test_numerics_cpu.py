"""Compiled kernels on the CPU (IREE llvm-cpu, local-task) match the float64 reference.

Covers ranks 1-3, G = 1, 2, 32 and depthwise, strides 1-3, dilation 1-2, asymmetric pads, odd sizes,
every element type pairing, every layout family, and every problem of CK's own test list.
"""

import pytest
from conftest import suite

from convbw_mlir.problem import LAYOUTS, ConvBwdWeightProblem
from convbw_mlir.reference import assert_close, random_inputs, reference


def P(g, n, c, k, inp, filt, **kw):  # noqa: N802 - reads like the problem tuple
    return ConvBwdWeightProblem(
        groups=g, batch=n, in_channels=c, out_channels=k, input_size=inp, filter_size=filt, **kw
    )


MATRIX = {
    "1d_g1_pad1": P(1, 2, 8, 16, (20,), (3,), pad_low=1, pad_high=1),
    "1d_g2_stride3_dil2": P(2, 3, 4, 6, (31,), (3,), stride=3, dilation=2, pad_low=2, pad_high=0),
    "2d_g1_3x3": P(1, 2, 16, 32, (9, 9), (3, 3), pad_low=1, pad_high=1),
    "2d_g2_stride2_asym": P(2, 2, 8, 8, (10, 11), (3, 3), stride=2, pad_low=(1, 0), pad_high=(0, 1)),
    "2d_g32_resnext": P(32, 2, 4, 4, (8, 8), (3, 3), pad_low=1, pad_high=1),
    "2d_depthwise_g24": P(24, 3, 1, 1, (12, 12), (3, 3), pad_low=1, pad_high=1),
    "2d_depthwise_5x5_s2": P(16, 2, 1, 1, (13, 13), (5, 5), stride=2, pad_low=2, pad_high=2),
    "2d_stride3_dil2": P(1, 2, 6, 10, (17, 15), (3, 2), stride=3, dilation=2, pad_low=(0, 1), pad_high=(2, 0)),
    "2d_odd_c3_k5_h7": P(1, 3, 3, 5, (7, 7), (3, 3), pad_low=1, pad_high=1),
    "2d_1x1": P(2, 4, 16, 8, (6, 6), (1, 1)),
    "2d_1x1_stride2": P(1, 4, 16, 8, (7, 7), (1, 1), stride=2),
    "2d_filter_equals_input": P(1, 4, 3, 4, (5, 5), (5, 5)),
    # one output row of a strided 3x3 over 4 input rows: x holds a row the filter never reads
    "2d_single_output_row_stride2": P(1, 2, 4, 4, (4, 8), (3, 3), stride=(2, 1)),
    "3d_g1": P(1, 2, 4, 8, (4, 6, 6), (3, 3, 3), pad_low=1, pad_high=1),
    "3d_g2_stride2_asym": P(2, 1, 3, 5, (5, 7, 6), (2, 3, 3), stride=(1, 2, 2), pad_low=(0, 1, 1), pad_high=(1, 0, 1)),
}
TYPES = {"f16": ("f16", "f16"), "bf16": ("bf16", "bf16"), "f32": ("f32", "f32"), "bf16_f32dw": ("bf16", "f32")}


def check(compiled, p: ConvBwdWeightProblem, **options) -> None:
    op = compiled(p, "host", **options)
    x, dy = random_inputs(p, seed=1)
    dw = op.run(x, dy)
    assert (
        dw.shape == p.dw_shape and str(dw.dtype) == {"f16": "float16", "bf16": "bfloat16", "f32": "float32"}[p.dw_dtype]
    )
    assert_close(p, dw, reference(p, x, dy))


@pytest.mark.parametrize("name", list(MATRIX))
def test_matrix_matches_reference_f16(compiled, name):
    check(compiled, MATRIX[name])


@pytest.mark.parametrize("types", list(TYPES))
@pytest.mark.parametrize("name", ["2d_g2_stride2_asym", "1d_g2_stride3_dil2", "3d_g1"])
def test_element_types_match_reference(compiled, name, types):
    dtype, dw_dtype = TYPES[types]
    check(compiled, MATRIX[name].with_(dtype=dtype, dw_dtype=dw_dtype))


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("rank", [1, 2, 3])
def test_every_layout_family_matches_reference(compiled, layout, rank):
    grouped = LAYOUTS[layout].grouped
    base = {1: MATRIX["1d_g2_stride3_dil2"], 2: MATRIX["2d_g2_stride2_asym"], 3: MATRIX["3d_g2_stride2_asym"]}[rank]
    check(compiled, base.with_(groups=base.groups if grouped else 1, layout=layout))


CK_TESTS = suite("ck_test_grouped_convnd_bwd_weight")


@pytest.mark.parametrize("args", [a for _, a in CK_TESTS], ids=[n for n, _ in CK_TESTS])
def test_ck_test_problems_match_reference(compiled, args):
    check(compiled, ConvBwdWeightProblem.from_ck(args))
