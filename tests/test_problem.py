"""ConvBwdWeightProblem: derived sizes, layouts, and one clear error per impossible problem."""

import numpy as np
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


# -- numpy integers and integer arrays ---------------------------------------------------------------


def test_numpy_integers_and_integer_arrays_normalise_to_python_ints():
    p = p2d(
        groups=np.int64(2),
        batch=np.uint8(4),
        input_size=np.array([14, 14]),
        filter_size=np.array([3, 3]),
        stride=np.int32(1),
        pad_low=np.array([1, 1]),
        pad_high=np.array(1),
    )
    assert p == p2d()
    for value in (p.groups, p.batch, *p.input_size, *p.filter_size, *p.stride, *p.pad_low, *p.pad_high):
        assert type(value) is int
    assert ConvBwdWeightProblem(1, 2, 3, 4, np.array([9]), np.array([3])).input_size == (9,)
    assert p2d(layout=np.int64(1)).layout == "GNHWC/GKYXC/GNHWK"  # a ckProfiler code


@pytest.mark.parametrize(
    "changes, field, exc",
    [
        (dict(groups=np.float64(2.0)), "groups", TypeError),
        (dict(batch=np.bool_(True)), "batch", TypeError),
        (dict(batch=True), "batch", TypeError),
        (dict(in_channels=np.int64(-8)), "in_channels", ValueError),
        (dict(input_size=np.array([14.0, 14.0])), "input_size", TypeError),
        (dict(input_size=np.array([14.5, 14.0])), "input_size", TypeError),
        (dict(input_size=np.array([True, True])), "input_size", TypeError),
        (dict(input_size=np.array([[14, 14]])), "input_size", TypeError),
        (dict(input_size=np.array([14, -14])), "input_size", ValueError),
        (dict(filter_size=np.array([3.0, 3.0])), "filter_size", TypeError),
        (dict(stride=np.array([1, 2, 3])), "stride", ValueError),
        (dict(pad_low=np.array([-1, 0])), "pad_low", ValueError),
    ],
)
def test_numpy_floats_bools_negatives_and_bad_arrays_are_refused(changes, field, exc):
    with pytest.raises(exc, match=rf"^{field}"):
        p2d(**changes)


# -- sizes that overflow int64 -------------------------------------------------------------------------


def test_a_size_over_int64_is_refused_naming_the_field():
    with pytest.raises(ValueError, match=r"^batch: 100000000000000000000 does not fit in int64"):
        p2d(batch=10**20)
    with pytest.raises(ValueError, match=r"^stride: .*does not fit in int64"):
        p2d(stride=(1, 2**63))


@pytest.mark.parametrize(
    "changes, tensor",
    [
        # the CLI's "-n 3037000500 --input 3037000500": x has 3.7e19 elements, its reduction fits
        (
            dict(
                groups=1,
                batch=3037000500,
                in_channels=4,
                out_channels=4,
                input_size=(3037000500,),
                filter_size=(3,),
                pad_low=0,
                pad_high=0,
            ),
            "x",
        ),
        (dict(groups=1, batch=2**32, input_size=(2**16, 2**16), pad_low=0, pad_high=0), "reduction"),
        (
            dict(groups=1, batch=1, in_channels=2**61, out_channels=1, filter_size=(1, 1), pad_low=0, pad_high=0),
            "x",
        ),  # 2**61 * 196 elements
        (
            dict(groups=1, batch=1, in_channels=1, out_channels=2**58, filter_size=(1, 1), pad_low=0, pad_high=0),
            "dy",
        ),  # 2**58 * 196 elements, 2 bytes each
        (
            dict(
                groups=2**20,
                batch=1,
                in_channels=2**20,
                out_channels=2**20,
                input_size=(16, 16),
                filter_size=(16, 16),
                pad_low=0,
                pad_high=0,
            ),
            "dw",
        ),
        (
            dict(
                groups=1,
                batch=1,
                in_channels=1,
                out_channels=1,
                input_size=(1, 1),
                filter_size=(1, 1),
                stride=2**62,
                pad_low=(2**62, 0),
                pad_high=(2**62, 0),
            ),
            "x padded",
        ),
    ],
)
def test_tensors_whose_size_overflows_int64_are_refused(changes, tensor):
    with pytest.raises(ValueError, match=rf"^{tensor}: .*more than int64 holds"):
        p2d(**changes)


def test_the_largest_sizes_that_fit_int64_are_accepted():
    # x: 2**61 elements of 2 bytes = 2**62 bytes, just inside; in f32 the same x needs 2**63 bytes
    p = ConvBwdWeightProblem(1, 2**31, 2**30, 1, (1,), (1,))
    assert p.shape("x") == (2**31, 1, 1, 2**30)
    with pytest.raises(ValueError, match=r"^x: .*9223372036854775808 bytes"):
        p.with_(dtype="f32")
