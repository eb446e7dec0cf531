"""The float64 reference against a direct loop over the definition, and the tolerance check."""

import itertools

import numpy as np
import pytest

from convbw_mlir.problem import LAYOUTS, ConvBwdWeightProblem
from convbw_mlir.reference import (
    ToleranceError,
    assert_close,
    random_inputs,
    reference,
    sample_indices,
    sample_reference,
)


def direct(p: ConvBwdWeightProblem, x: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """dW by the textbook sum, one element at a time, indexing the arrays by layout letters."""
    xl, yl, wl = p.dims("x"), p.dims("dy"), p.dims("dw")
    xs = [s for s in xl if s in "DHW"]
    fs = [s for s in wl if s in "ZYX"]
    dw = np.zeros(p.dw_shape)
    for g, k, c, n in itertools.product(range(p.groups), range(p.out_channels), range(p.in_channels), range(p.batch)):
        for f in itertools.product(*map(range, p.filter_size)):
            for o in itertools.product(*map(range, p.output_size)):
                i = [oo * s + ff * d - pl for oo, ff, s, d, pl in zip(o, f, p.stride, p.dilation, p.pad_low)]
                if not all(0 <= ii < n_ for ii, n_ in zip(i, p.input_size)):
                    continue
                xi = dict(N=n, G=g, C=c, **dict(zip(xs, i)))
                yi = dict(N=n, G=g, K=k, **dict(zip(xs, o)))
                wi = dict(G=g, K=k, C=c, **dict(zip(fs, f)))
                dw[tuple(wi[d] for d in wl)] += float(x[tuple(xi[d] for d in xl)]) * float(dy[tuple(yi[d] for d in yl)])
    return dw


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("rank", [1, 2, 3])
def test_reference_matches_the_direct_sum_in_every_layout_and_rank(layout, rank):
    groups = 2 if LAYOUTS[layout].grouped else 1
    sizes = {1: (9,), 2: (7, 6), 3: (5, 4, 6)}[rank]
    p = ConvBwdWeightProblem(
        groups=groups, batch=2, in_channels=3, out_channels=2, input_size=sizes, filter_size=(3,) * rank,
        stride=(2,) + (1,) * (rank - 1), dilation=(1,) * (rank - 1) + (2,), pad_low=(1,) + (0,) * (rank - 1),
        pad_high=(0,) * (rank - 1) + (2,), dtype="f32", layout=layout,
    )  # fmt: skip
    x, dy = random_inputs(p, seed=rank)
    np.testing.assert_allclose(reference(p, x, dy), direct(p, x, dy), rtol=1e-12, atol=1e-12)


def test_assert_close_rejects_a_single_wrong_entry():
    p = ConvBwdWeightProblem(2, 4, 8, 8, (8, 8), (3, 3), pad_low=1, pad_high=1, dtype="f16")
    x, dy = random_inputs(p)
    want = reference(p, x, dy)
    assert assert_close(p, want.astype(np.float16), want) < 1e-3
    bad = want.copy()
    bad[1, 2, 0, 1, 3] += 0.05 * np.sqrt(np.mean(want**2))
    with pytest.raises(ToleranceError, match=r"index \(1, 2, 0, 1, 3\)"):
        assert_close(p, bad, want)
    nan = want.copy()
    nan[0, 0, 0, 0, 0] = np.nan
    with pytest.raises(ToleranceError, match="non-finite"):
        assert_close(p, nan, want)
    with pytest.raises(ToleranceError, match="shape"):
        assert_close(p, want[0], want)


@pytest.mark.parametrize("alpha", [1e-6, 1e-8, 1e-9, 1e-12])
def test_a_correctly_rounded_result_of_a_tiny_epilogue_scale_passes_and_a_wrong_one_fails(alpha):
    from convbw_mlir.problem import Epilogue

    # f16 dW: alpha 1e-6 puts it below f16's normal range (6.1e-5), 1e-8 at its smallest subnormals, 1e-9 rounds
    # it to zeros; the f32-accumulated result times alpha, rounded once to f16, is what a correct kernel gives
    p = ConvBwdWeightProblem(2, 4, 8, 8, (8, 8), (3, 3), pad_low=1, pad_high=1, dtype="f16",
                             epilogue=Epilogue("scale", alpha))  # fmt: skip
    x, dy = random_inputs(p)
    want = reference(p, x, dy)
    rounded = (np.float32(alpha) * reference(p.plain, x, dy).astype(np.float32)).astype(np.float16)
    assert assert_close(p, rounded, want) == 0.0  # within half a subnormal: nothing left of the error
    if alpha >= 1e-8:  # where f16 can still tell (1e-9 rounds even twice the result to zeros)
        with pytest.raises(ToleranceError, match="dw: max error"):
            assert_close(p, (2 * want).astype(np.float16), want)
        with pytest.raises(ToleranceError, match="dw: max error"):
            assert_close(p, np.zeros_like(rounded), want)
    shifted = want.copy()  # one entry off by one f16 subnormal more than rounding allows
    shifted[1, 2, 0, 1, 3] += 1.5 * 2.0**-24 * np.sign(shifted[1, 2, 0, 1, 3])
    with pytest.raises(ToleranceError, match=r"index \(1, 2, 0, 1, 3\)"):
        assert_close(p, shifted, want)


def test_a_result_that_overflows_dws_type_says_the_exact_value_is_beyond_its_range():
    from convbw_mlir.problem import Epilogue

    p = ConvBwdWeightProblem(1, 2, 8, 8, (6, 6), (3, 3), dtype="f16", epilogue=Epilogue("scale", 1e4))
    x, dy = random_inputs(p)
    want = reference(p, x, dy)
    with np.errstate(over="ignore"):
        got = want.astype(np.float16)
    with pytest.raises(ToleranceError, match=r"non-finite value -?inf at index .*beyond f16's range \(largest 65504\)"):
        assert_close(p, got, want)


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("rank", [1, 2, 3])
def test_sample_reference_equals_the_full_reference_at_every_dw_index(layout, rank):
    groups = 2 if LAYOUTS[layout].grouped else 1
    sizes = {1: (9,), 2: (7, 6), 3: (5, 4, 6)}[rank]
    # stride, dilation and asymmetric pads make some taps see the padding only at one edge
    p = ConvBwdWeightProblem(
        groups=groups, batch=3, in_channels=3, out_channels=2, input_size=sizes, filter_size=(3,) * rank,
        stride=(2,) + (1,) * (rank - 1), dilation=(1,) * (rank - 1) + (2,), pad_low=(2,) + (0,) * (rank - 1),
        pad_high=(0,) * (rank - 1) + (3,), dtype="f32", layout=layout,
    )  # fmt: skip
    x, dy = random_inputs(p, seed=rank)
    want = reference(p, x, dy)
    every = np.argwhere(np.ones(p.dw_shape, dtype=bool))
    np.testing.assert_allclose(sample_reference(p, x, dy, every), want[tuple(every.T)], rtol=1e-12, atol=1e-12)


def test_sample_reference_of_a_tap_that_sees_only_padding_is_zero():
    # one output position; taps 0-2 and 5-6 of the 7-wide filter read only the pads
    p = ConvBwdWeightProblem(1, 2, 1, 1, (2,), (7,), pad_low=3, pad_high=3, stride=4, dtype="f32")
    x, dy = random_inputs(p)
    want = reference(p, x, dy)
    every = np.argwhere(np.ones(p.dw_shape, dtype=bool))
    got = sample_reference(p, x, dy, every)
    np.testing.assert_allclose(got, want[tuple(every.T)], rtol=1e-12, atol=1e-12)
    assert (got == 0).any() and (got != 0).any()


def test_sample_reference_sums_in_chunks_of_images_like_one_dot_product(monkeypatch):
    import convbw_mlir.reference as ref

    p = ConvBwdWeightProblem(2, 7, 3, 4, (6, 5), (3, 3), pad_low=1, pad_high=1, dtype="f32")
    x, dy = random_inputs(p)
    idx = sample_indices(p, 40)
    whole = sample_reference(p, x, dy, idx)
    monkeypatch.setattr(ref, "_CHUNK", 31)  # one image (30 output positions) a partial sum
    np.testing.assert_allclose(sample_reference(p, x, dy, idx), whole, rtol=1e-12)
    np.testing.assert_allclose(whole, reference(p, x, dy)[tuple(idx.T)], rtol=1e-12)


def test_sample_indices_hold_the_first_and_last_entries_and_stay_in_range():
    p = ConvBwdWeightProblem(2, 4, 8, 8, (8, 8), (3, 3), pad_low=1, pad_high=1)
    idx = sample_indices(p, 50, seed=3)
    assert idx.shape == (50, 5)
    assert tuple(idx[0]) == (0, 0, 0, 0, 0) and tuple(idx[1]) == tuple(s - 1 for s in p.dw_shape)
    assert ((idx >= 0) & (idx < np.array(p.dw_shape))).all()


@pytest.mark.parametrize(
    "indices, exc, message",
    [
        ([(0, 0, 0, 0)], ValueError, r"indices: expected an \(m, 5\) array of dW indices \(G/K/Y/X/C\)"),
        ([(0, 0, 0, 3, 0)], ValueError, r"indices: \(0, 0, 0, 3, 0\) is outside dW's shape \(2, 8, 3, 3, 8\)"),
        ([(0, -1, 0, 0, 0)], ValueError, "outside dW's shape"),
        ([(0.0, 0, 0, 0, 0)], TypeError, "indices: expected integers, got dtype float64"),
    ],
)
def test_sample_reference_refuses_bad_indices(indices, exc, message):
    p = ConvBwdWeightProblem(2, 4, 8, 8, (8, 8), (3, 3), pad_low=1, pad_high=1)
    x, dy = random_inputs(p)
    with pytest.raises(exc, match=message):
        sample_reference(p, x, dy, indices)


def test_random_inputs_drawn_in_chunks_equal_one_draw_of_each(monkeypatch):
    import convbw_mlir.reference as ref

    p = ConvBwdWeightProblem(2, 3, 5, 4, (7, 6), (3, 3), dtype="bf16")
    monkeypatch.setattr(ref, "_CHUNK", 100)
    x, dy = random_inputs(p, seed=5)
    rng = np.random.default_rng(5)
    assert x.dtype == dy.dtype and str(x.dtype) == "bfloat16"
    np.testing.assert_array_equal(x, rng.standard_normal(p.x_shape, dtype=np.float32).astype(x.dtype))
    np.testing.assert_array_equal(dy, rng.standard_normal(p.dy_shape, dtype=np.float32).astype(x.dtype))


def test_kernels_with_matrix_instructions_get_the_truncated_accumulation_bound_on_long_reductions():
    from convbw_mlir.reference import accumulation_error, tolerance

    p = ConvBwdWeightProblem.from_ck("2 1 16 64 64 1 1 1450 1450 1 1 1 1 0 0 0 0")  # L = 33.6 million
    rounded, truncated = tolerance(p)[0], tolerance(p, matrix_cores=True)[0]
    assert rounded < 0.004 < 0.011 < truncated  # the H100's 1.1% error on it is accumulation, not a defect
    short = ConvBwdWeightProblem.from_ck("2 1 2 8 8 3 3 8 8 1 1 1 1 1 1 1 1")  # L = 128: rounding dominates
    assert tolerance(short, matrix_cores=True)[0] < 2 * tolerance(short)[0]
    assert accumulation_error(1600, True) > accumulation_error(1600, False)
