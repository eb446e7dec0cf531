"""The numpy float64 reference for every layout, rank, stride, dilation, pad and group count.

Vectorized per filter tap: for each tap the strided window of the padded input is one batched matmul
``dy[g, k, (n, o...)] @ x[g, (n, o...), c]`` (BLAS), so a ResNet-50 layer with N=32 takes seconds.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from convbw_mlir.problem import ConvBwdWeightProblem

__all__ = ["ToleranceError", "assert_close", "random_inputs", "reference", "tolerance"]

# Unit roundoff of each element type: the rounding of inputs is shared with the reference (it sees the
# same rounded values), so what differs is the rounding of dW itself and the f32 accumulation order.
_EPS = {"f16": 2.0**-11, "bf16": 2.0**-8, "f32": 2.0**-24}


def _canonical(problem: ConvBwdWeightProblem, arr: np.ndarray, tensor: str, order: str) -> np.ndarray:
    """Transpose ``arr`` (in the problem's layout) to the dimension order ``order``; missing G becomes 1."""
    letters = list(problem.dims(tensor))
    a = np.asarray(arr)
    if "G" not in letters:
        a = a[..., None]
        letters.append("G")
    spatial = [s for s in letters if s in "DHWZYX"]
    want = [s if s != "S" else None for s in order]
    perm = []
    for s in want:
        perm.extend([letters.index(x) for x in spatial] if s is None else [letters.index(s)])
    return np.transpose(a, perm)


def reference(problem: ConvBwdWeightProblem, x: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """dW in float64, in the problem's dW layout."""
    p = problem
    xc = _canonical(p, x, "x", "GNCS").astype(np.float64)  # [G, N, C, in...]
    dyc = _canonical(p, dy, "dy", "GNKS").astype(np.float64)  # [G, N, K, out...]
    pads = [(0, 0)] * 3 + list(zip(p.pad_low, p.pad_high))
    xc = np.pad(xc, pads)
    g, n, k = p.groups, p.batch, p.out_channels
    out = p.output_size
    # dy as [G, K, N*prod(out)]
    dy_mat = np.ascontiguousarray(np.moveaxis(dyc, 2, 1).reshape(g, k, n * math.prod(out)))
    dw = np.empty((g, k, p.in_channels, *p.filter_size))  # [G, K, C, filter...]
    for tap in itertools.product(*(range(f) for f in p.filter_size)):
        window = tuple(slice(t * d, t * d + (o - 1) * s + 1, s) for t, d, o, s in zip(tap, p.dilation, out, p.stride))
        xw = xc[(slice(None), slice(None), slice(None), *window)]  # [G, N, C, out...]
        x_mat = np.moveaxis(xw, 2, -1).reshape(g, n * math.prod(out), p.in_channels)
        dw[(slice(None), slice(None), slice(None), *tap)] = dy_mat @ x_mat
    # [G, K, C, filter...] -> the problem's dW layout
    src = ["G", "K", "C", *[s for s in p.dims("dw") if s in "ZYX"]]
    letters = p.dims("dw")
    if "G" not in letters:
        dw = dw[0]
        src.remove("G")
    return np.transpose(dw, [src.index(s) for s in letters])


def tolerance(problem: ConvBwdWeightProblem) -> tuple[float, float]:
    """(rtol, atol) for comparing a kernel's dW with :func:`reference`.

    The result is rounded once to dW's type (relative error eps) and accumulated in f32 over the
    reduction length L = N * prod(output); f32 summation error grows like sqrt(L) * eps_f32 for random
    data. atol is taken relative to the typical magnitude of a dW entry (sqrt(L) for unit-normal data,
    see :func:`assert_close`).
    """
    _, _, _, red = problem.gemm
    eps_out = _EPS[problem.dw_dtype]
    rtol = 2 * eps_out + 8 * math.sqrt(red) * _EPS["f32"]
    return rtol, rtol


class ToleranceError(AssertionError):
    """A result differs from the reference by more than the tolerance."""


def assert_close(problem: ConvBwdWeightProblem, got: np.ndarray, want: np.ndarray) -> float:
    """Check ``got`` against the float64 reference ``want``; return the max error relative to scale.

    The error of each entry is ``|got - want| / (|want| + scale)`` where ``scale`` is the RMS of
    ``want``: entries near zero (cancellation) are judged against the typical magnitude, not against 0.

    Raises:
        ToleranceError: shape mismatch or an error above :func:`tolerance`, naming the worst entry.
    """
    got = np.asarray(got).astype(np.float64)
    if got.shape != want.shape:
        raise ToleranceError(f"shape: got {got.shape}, expected {want.shape}")
    if not np.all(np.isfinite(got)):
        bad = np.argwhere(~np.isfinite(got))[0]
        raise ToleranceError(f"dw: non-finite value {got[tuple(bad)]} at index {tuple(int(i) for i in bad)}")
    scale = float(np.sqrt(np.mean(want**2))) or 1.0
    err = np.abs(got - want) / (np.abs(want) + scale)
    worst = float(err.max()) if err.size else 0.0
    rtol, _ = tolerance(problem)
    if worst > rtol:
        idx = tuple(int(i) for i in np.unravel_index(int(err.argmax()), err.shape))
        raise ToleranceError(
            f"dw: max error {worst:.3g} > tolerance {rtol:.3g} at index {idx}: got {got[idx]:.6g}, want {want[idx]:.6g}"
        )
    return worst


def random_inputs(problem: ConvBwdWeightProblem, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Unit-normal x and dy in the problem's layout and element type."""
    from convbw_mlir.runtime import numpy_dtype

    rng = np.random.default_rng(seed)
    dt = numpy_dtype(problem.dtype)
    x = rng.standard_normal(problem.x_shape, dtype=np.float32).astype(dt)
    dy = rng.standard_normal(problem.dy_shape, dtype=np.float32).astype(dt)
    return x, dy
