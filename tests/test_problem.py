"""ConvBwdWeightProblem: derived sizes, layouts, and one clear error per impossible problem."""

import pytest

from convbw_mlir.problem import LAYOUTS, ConvBwdWeightProblem, resolve_layout


def p2d(**kw):
    base = dict(groups=2, batch=4, in_channels=8, out_channels=16, input_size=(14, 14), filter_size=(3, 3),
                pad_low=1, pad_high=1)  # fmt: skip
    base.update(kw)
    return ConvBwdWeightProblem(**base)


def test_output_size_follows_stride_dilation_and_asymmetric_pads():
    p = p2d(input_size=(7, 9), stride=(2, 1), dilation=(1, 2), pad_low=(1, 0), pad_high=(0, 2))
    assert p.output_size == (3, 7)  # (7+1-3)//2+1, (9+2-5)//1+1


def test_default_layout_shapes_are_nhwgc_gkyxc_nhwgk():
    p = p2d()
    assert p.layout == "NHWGC/GKYXC/NHWGK"
    assert p.x_shape == (4, 14, 14, 2, 8)
    assert p.dy_shape == (4, 14, 14, 2, 16)
    assert p.dw_shape == (2, 16, 3, 3, 8)


@pytest.mark.parametrize(
    "layout, x, w, y",
    [
        (0, (2, 4, 8, 14, 14), (2, 16, 8, 3, 3), (2, 4, 16, 14, 14)),
        (1, (2, 4, 14, 14, 8), (2, 16, 3, 3, 8), (2, 4, 14, 14, 16)),
        (3, (4, 2, 8, 14, 14), (2, 16, 3, 3, 8), (4, 2, 16, 14, 14)),
        (4, (4, 2, 8, 14, 14), (2, 16, 8, 3, 3), (4, 2, 16, 14, 14)),
    ],
)
def test_ck_layout_codes_give_ck_shapes(layout, x, w, y):
    p = p2d(layout=layout)
    assert (p.x_shape, p.dw_shape, p.dy_shape) == (x, w, y)


def test_layout_families_spell_1d_and_3d():
    fam = LAYOUTS["NHWGC/GKYXC/NHWGK"]
    assert fam.spelled(1) == "NWGC/GKXC/NWGK"
    assert fam.spelled(3) == "NDHWGC/GKZYXC/NDHWGK"
    assert resolve_layout("NDHWGC/GKZYXC/NDHWGK") is fam
    assert resolve_layout("channels_last").name == "NHWC/KYXC/NHWK"
    assert resolve_layout("NWGC").name == "NHWGC/GKYXC/NHWGK"  # the input layout alone, where unambiguous
    with pytest.raises(ValueError, match="layout: 'NGCHW' is ambiguous"):
        resolve_layout("NGCHW")
    p3 = ConvBwdWeightProblem(1, 2, 3, 4, (4, 5, 6), (1, 2, 3), layout="NCHW/KCYX/NKHW")
    assert p3.x_shape == (2, 3, 4, 5, 6) and p3.dw_shape == (4, 3, 1, 2, 3)


def test_gemm_view_flops_and_bytes():
    p = p2d(dtype="bf16", dw_dtype="f32")
    assert p.gemm == (2, 16, 8 * 9, 4 * 14 * 14)
    assert p.flops == 2 * 2 * 16 * 72 * 784
    assert p.min_bytes == 2 * (4 * 14 * 14 * 2 * 8) + 2 * (4 * 14 * 14 * 2 * 16) + 4 * (2 * 16 * 9 * 8)


def test_scalars_broadcast_and_with_revalidates():
    p = p2d(stride=2)
    assert p.stride == (2, 2)
    with pytest.raises(ValueError, match="stride"):
        p.with_(stride=0)


def test_dict_round_trip():
    p = p2d(dtype="bf16", dw_dtype="f32", layout=0)
    assert ConvBwdWeightProblem.from_dict(p.to_dict()) == p


@pytest.mark.parametrize(
    "changes, field, exc",
    [
        (dict(groups=0), "groups", ValueError),
        (dict(batch=-1), "batch", ValueError),
        (dict(in_channels=1.5), "in_channels", TypeError),
        (dict(out_channels=0), "out_channels", ValueError),
        (dict(input_size=(14, 0)), "input_size", ValueError),
        (dict(input_size=(1, 2, 3, 4)), "input_size", ValueError),
        (dict(filter_size=(3,)), "filter_size", ValueError),
        (dict(filter_size=(5, 20)), "filter_size", ValueError),  # larger than the padded input
        (dict(dilation=(1, 8)), "filter_size", ValueError),  # dilated span 17 > 16: empty output
        (dict(stride=(1, 0)), "stride", ValueError),
        (dict(pad_low=(-1, 0)), "pad_low", ValueError),
        (dict(pad_high="x"), "pad_high", TypeError),
        (dict(dtype="f64"), "dtype", ValueError),
        (dict(dw_dtype="i8"), "dw_dtype", ValueError),
        (dict(layout="NCWH"), "layout", ValueError),
        (dict(layout=7), "layout", ValueError),
        (dict(layout="NCHW/KCYX/NKHW"), "layout", ValueError),  # needs G=1, problem has G=2
    ],
)
def test_each_impossible_problem_raises_naming_the_field(changes, field, exc):
    with pytest.raises(exc, match=rf"^{field}"):
        p2d(**changes)
