"""The float64 reference against a direct loop over the definition, and the tolerance check."""

import itertools

import numpy as np
import pytest

from convbw_mlir.problem import LAYOUTS, ConvBwdWeightProblem
from convbw_mlir.reference import ToleranceError, assert_close, random_inputs, reference


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
