"""The numpy float64 reference for every layout, rank, stride, dilation, pad and group count.

Vectorized per filter tap: for each tap the strided window of the padded input is one batched matmul
``dy[g, k, (n, o...)] @ x[g, (n, o...), c]`` (BLAS), so a ResNet-50 layer with N=32 takes seconds.
For problems too large for float64 copies of x and dy, :func:`sample_reference` computes chosen dW
entries only, one dot product over the reduction each, reading x and dy in place.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from convbw_mlir.problem import ConvBwdWeightProblem

__all__ = [
    "ToleranceError",
    "assert_close",
    "fp8_bound",
    "random_inputs",
    "reference",
    "rounding_floor",
    "reference_bytes",
    "sample_indices",
    "sample_reference",
    "tolerance",
    "accumulation_error",
    "rounded_sum_error",
]

# Unit roundoff of each element type: the rounding of inputs is shared with the reference (it sees the
# same rounded values), so what differs is the rounding of dW itself and the f32 accumulation order.
_EPS = {"f16": 2.0**-11, "bf16": 2.0**-8, "f32": 2.0**-24}
# Smallest subnormal of each type (IEEE 754; bf16 has f32's exponents): below the normal range a rounding
# errs by up to half of it whatever the value, so a relative bound alone fails a correctly rounded result
# there (an f16 dW scaled by 1e-8 is all subnormals and zeros).
_TINY = {"f16": 2.0**-24, "bf16": 2.0**-133, "f32": 2.0**-149}

# Elements drawn or gathered at a time: bounds the float32 scratch of the large-array paths (32 MiB).
_CHUNK = 1 << 23


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


def reference_bytes(problem: ConvBwdWeightProblem) -> int:
    """Memory :func:`reference` takes at its peak: float64 copies of x, of x padded, of dy (two), of one
    tap's window of x, and dW."""
    p = problem
    padded = math.prod(i + lo + hi for i, lo, hi in zip(p.input_size, p.pad_low, p.pad_high))
    _, _, _, red = p.gemm
    x_elems = p.groups * p.batch * p.in_channels
    dy_elems = math.prod(p.dy_shape)
    return 8 * (x_elems * math.prod(p.input_size) + x_elems * padded + 2 * dy_elems + red * p.groups * p.in_channels
                + math.prod(p.dw_shape))  # fmt: skip


def _epilogue(problem: ConvBwdWeightProblem, dw: np.ndarray, d: np.ndarray | None) -> np.ndarray:
    """The problem's epilogue applied in float64: ``alpha * dw (+ beta * D)``; ``dw`` unchanged without one.

    Raises:
        ValueError: D missing where the epilogue reads one, given where it does not, or of another shape.
    """
    ep = problem.epilogue
    if ep is None or not ep.reads_d:
        if d is not None:
            raise ValueError(f"d: problem {problem.name} has no epilogue that reads D")
        return dw if ep is None else ep.alpha * dw
    if d is None:
        raise ValueError(f"d: the {ep.kind} epilogue of {problem.name} needs D (for accumulate: out's contents)")
    d = np.asarray(d)
    if d.shape != dw.shape:
        raise ValueError(f"d: expected shape {dw.shape}, got {d.shape}")
    return ep.alpha * dw + ep.beta * d.astype(np.float64)


def reference(problem: ConvBwdWeightProblem, x: np.ndarray, dy: np.ndarray, d: np.ndarray | None = None) -> np.ndarray:
    """dW in float64, in the problem's dW layout, with the problem's epilogue applied (``d``: its D,
    for accumulate the output's contents before the call).

    Raises:
        NotEnoughMemoryError: its float64 copies would not fit in memory (checked before allocating);
            :func:`sample_reference` checks chosen entries of such problems.
    """
    from convbw_mlir.runtime import check_memory

    p = problem
    check_memory([("reference (float64 copies of x and dy; sample_reference needs none)", reference_bytes(p))])
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
    return _epilogue(p, np.transpose(dw, [src.index(s) for s in letters]), d)


# Products an f16/bf16 matrix instruction adds per update of the f32 accumulator (mma.sync m16n8k16).
MMA_K = 16
# Standard deviations the max over up to 1e8 entries may reach: P(|Z| > 8) = 1.2e-15.
K_SIGMA = 8.0


def accumulation_error(length: int, matrix_cores: bool) -> float:
    """The f32 accumulation error over ``length`` products, K_SIGMA deviations of it, in units of dW's RMS.

    Rounded sums (the CPU, SIMT kernels) grow like u * sqrt(L); matrix instructions truncate their
    accumulator (Fasi et al. 2021, "Numerical behavior of NVIDIA tensor cores"): a bias growing like
    u * n / sqrt(3) over a chain of n = L / MMA_K updates. Derivation and checks: docs/tolerances.md.
    """
    if matrix_cores:
        return K_SIGMA * _EPS["f32"] * math.ceil(length / MMA_K) / math.sqrt(3)
    return K_SIGMA * _EPS["f32"] * math.sqrt(length)


def rounded_sum_error(length: int, peak: float) -> float:
    """K_SIGMA deviations of a serial round-to-nearest f32 sum of ``length`` products (the GPU reference, CUDA
    cores) at an entry of ``peak`` RMS, in units of dW's RMS: ``u sqrt(L (1 + 2 peak^2) / 18 + 1/3)``.

    The partial sums of an entry w run from 0 to w (a Brownian bridge, not a free random walk): the large
    entries, whose errors are the largest, carry a drift the free-walk model u sqrt(L / 6) left out.
    The 1/3 is the products' own rounding (f32 inputs, no FMA). Derivation and checks: docs/tolerances.md.
    """
    return K_SIGMA * _EPS["f32"] * math.sqrt(length * (1 + 2 * peak**2) / 18 + 1 / 3)


def rounding_floor(dw_dtype: str) -> float:
    """The absolute error a correctly rounded dW entry may have at any magnitude: half the smallest subnormal
    of ``dw_dtype``, plus f32's for the epilogue's f32 product (``alpha * acc``) rounded before it. Above
    the normal range's bottom it is below the relative bound's own slack; below it, it is all there is."""
    return (_TINY[dw_dtype] + _TINY["f32"]) / 2


def tolerance(problem: ConvBwdWeightProblem, matrix_cores: bool = False) -> tuple[float, float]:
    """(rtol, atol) for comparing a kernel's dW with :func:`reference`.

    The result is rounded once to dW's type (relative error eps) and accumulated in f32 over the
    reduction length L = N * prod(output) (:func:`accumulation_error`; ``matrix_cores`` for kernels that
    may use matrix instructions). atol is taken relative to the typical magnitude of a dW entry (sqrt(L)
    for unit-normal data, see :func:`assert_close`).
    """
    _, _, _, red = problem.gemm
    rtol = 2 * _EPS[problem.dw_dtype] + accumulation_error(red, matrix_cores)
    return rtol, rtol


class ToleranceError(AssertionError):
    """A result differs from the reference by more than the tolerance."""


def assert_close(problem: ConvBwdWeightProblem, got: np.ndarray, want: np.ndarray, matrix_cores: bool = False) -> float:
    """Check ``got`` against the float64 reference ``want``; return the max error relative to scale.

    The error of each entry is ``(|got - want| - floor) / (|want| + scale)`` (0 where negative): ``scale``
    is the RMS of ``want``, so entries near zero (cancellation) are judged against the typical magnitude, not
    against 0; ``floor`` (:func:`rounding_floor`) is what rounding to dW's type may cost at any magnitude, so
    a result whose entries are subnormal or zero (a small epilogue scale: the bound is relative, and the
    epilogue's alpha and beta scale ``want`` and its RMS alike) passes where correctly rounded, and no more.
    ``matrix_cores``: the kernel may accumulate with matrix instructions (:func:`tolerance`).

    Raises:
        ToleranceError: shape mismatch, a non-finite entry (saying where the exact value is beyond dW's
            range: an epilogue's alpha or beta overflowing its type) or an error above :func:`tolerance`,
            naming the worst entry.
    """
    from convbw_mlir.problem import DTYPE_MAX

    got = np.asarray(got).astype(np.float64)
    if got.shape != want.shape:
        raise ToleranceError(f"shape: got {got.shape}, expected {want.shape}")
    if not np.all(np.isfinite(got)):
        bad = tuple(int(i) for i in np.argwhere(~np.isfinite(got))[0])
        top = DTYPE_MAX[problem.dw_dtype]
        beyond = f"; the exact value {want[bad]:.6g} is beyond {problem.dw_dtype}'s range (largest {top:g})"
        raise ToleranceError(
            f"dw: non-finite value {got[bad]} at index {bad}" + (beyond if abs(want[bad]) > top else "")
        )
    scale = float(np.sqrt(np.mean(want**2))) or 1.0
    err = np.maximum(np.abs(got - want) - rounding_floor(problem.dw_dtype), 0.0) / (np.abs(want) + scale)
    worst = float(err.max()) if err.size else 0.0
    rtol, _ = tolerance(problem, matrix_cores)
    if worst > rtol:
        idx = tuple(int(i) for i in np.unravel_index(int(err.argmax()), err.shape))
        raise ToleranceError(
            f"dw: max error {worst:.3g} > tolerance {rtol:.3g} at index {idx}: got {got[idx]:.6g}, want {want[idx]:.6g}"
        )
    return worst


def fp8_bound(problem: ConvBwdWeightProblem, x: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """The documented bound of an fp8 problem's dW, per element, against :func:`reference` on the same fp8
    inputs (docs/explicit-kernels.md "fp8"): ``rho |ref| + R 2^-24 |alpha| (|x| * |dy|)``, dW's own rounding
    (``rho``: 2^-8 bf16, 2^-24 f32) plus an f32 accumulation of R products (the products of two fp8 values are
    exact in f32); ``|x| * |dy|`` is the weight gradient of the magnitudes, ``alpha`` the scale epilogue's."""
    ref = reference(problem, x, dy)
    plain = problem.plain
    mag = reference(plain, np.abs(np.asarray(x).astype(np.float64)), np.abs(np.asarray(dy).astype(np.float64)))
    alpha = abs(problem.epilogue.alpha) if problem.epilogue is not None else 1.0
    _, _, _, red = problem.gemm
    return _EPS[problem.dw_dtype] * np.abs(ref) + red * _EPS["f32"] * alpha * mag


def random_inputs(problem: ConvBwdWeightProblem, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Unit-normal x and dy in the problem's layout and element type.

    Drawn in float32 a chunk at a time straight into the arrays (the same values as one draw of each),
    so the arrays themselves are all the memory it takes.

    Raises:
        NotEnoughMemoryError: x and dy would not fit in memory (checked before allocating).
    """
    from convbw_mlir.problem import numpy_dtype
    from convbw_mlir.runtime import check_memory

    dts = numpy_dtype(problem.dtype), numpy_dtype(problem.dy_type)
    sizes = [math.prod(problem.x_shape), math.prod(problem.dy_shape)]
    scratch = 4 * min(_CHUNK, max(sizes))
    check_memory([("x", sizes[0] * dts[0].itemsize), ("dy", sizes[1] * dts[1].itemsize), ("float32 scratch", scratch)])
    rng = np.random.default_rng(seed)
    arrays = []
    for shape, dt in zip((problem.x_shape, problem.dy_shape), dts):
        arr = np.empty(shape, dt)
        flat = arr.reshape(-1)
        for start in range(0, flat.size, _CHUNK):
            flat[start : start + _CHUNK] = rng.standard_normal(min(_CHUNK, flat.size - start), dtype=np.float32)
        arrays.append(arr)
    return arrays[0], arrays[1]


def _dw_indices(problem: ConvBwdWeightProblem, indices: object) -> np.ndarray:
    """``indices`` as an (m, rank of dW) int64 array of in-range dW indices."""
    shape = problem.dw_shape
    letters = "/".join(problem.dims("dw"))
    idx = np.asarray(indices)
    if idx.size == 0:
        idx = idx.reshape(0, len(shape))
    if idx.ndim != 2 or idx.shape[1] != len(shape):
        raise ValueError(
            f"indices: expected an (m, {len(shape)}) array of dW indices ({letters}), got shape {idx.shape}"
        )
    if idx.size and (idx.dtype == np.bool_ or not np.issubdtype(idx.dtype, np.integer)):
        raise TypeError(f"indices: expected integers, got dtype {idx.dtype}")
    bad = np.flatnonzero(((idx < 0) | (idx >= np.array(shape))).any(axis=1))
    if bad.size:
        raise ValueError(f"indices: {tuple(int(i) for i in idx[bad[0]])} is outside dW's shape {shape} ({letters})")
    return idx.astype(np.int64)


def sample_indices(problem: ConvBwdWeightProblem, count: int = 64, seed: int = 0) -> np.ndarray:
    """``count`` dW indices (an (m, rank of dW) array) to check a large result by: dW's first and last
    entries, then uniformly random ones."""
    rng = np.random.default_rng(seed)
    shape = np.array(problem.dw_shape)
    corners = np.stack([np.zeros_like(shape), shape - 1])
    drawn = rng.integers(0, shape, size=(max(count - 2, 0), len(shape)))
    return np.concatenate([corners, drawn])[:count]


def sample_reference(
    problem: ConvBwdWeightProblem, x: np.ndarray, dy: np.ndarray, indices: object, d: np.ndarray | None = None
) -> np.ndarray:
    """dW in float64 at the given dW indices only: one dot product over the reduction (N and the output
    positions a tap sees inside the input) per entry, reading x and dy in place.

    Entries of one group and filter tap share one pass over that tap's window of x and dy, the
    channels innermost, so a channels-last x is read in memory order once per (group, tap).

    Args:
        problem: the problem.
        x, dy: the inputs, in the problem's layout.
        indices: (m, rank of dW) integer indices into dW in the problem's layout (see :func:`sample_indices`).
        d: the epilogue's D (whole, dW's shape), where the problem's epilogue reads one.

    Returns:
        An (m,) float64 array, entry i the reference value of ``dw[tuple(indices[i])]``.

    Raises:
        ValueError / TypeError: indices of the wrong shape or type, or outside dW.
    """
    p = problem
    d_epilogue = d  # `d` is the dilation in the loops below
    idx = _dw_indices(p, indices)
    xc = _canonical(p, x, "x", "GNSC")  # views: [G, N, in..., C]
    dyc = _canonical(p, dy, "dy", "GNSK")  # [G, N, out..., K]
    letters = p.dims("dw")
    pos = {d: letters.index(d) for d in letters}
    taps = [pos[d] for d in "ZYX"[-p.rank :]]
    groups = idx[:, pos["G"]] if "G" in pos else np.zeros(len(idx), np.int64)
    by_tap: dict[tuple[int, ...], list[int]] = {}
    for i, key in enumerate(zip(groups.tolist(), *(idx[:, t].tolist() for t in taps))):
        by_tap.setdefault(key, []).append(i)
    out = np.zeros(len(idx))
    for (g, *tap), members in by_tap.items():
        xs, ds = [], []
        for f, s, d, lo, size, osize in zip(tap, p.stride, p.dilation, p.pad_low, p.input_size, p.output_size):
            # output positions o whose input position o * s + f * d - lo lies inside the input
            first = max(0, -((f * d - lo) // s))
            last = min(osize - 1, (size - 1 + lo - f * d) // s)
            if first > last:
                break
            xs.append(slice(first * s + f * d - lo, last * s + f * d - lo + 1, s))
            ds.append(slice(first, last + 1))
        else:  # the tap sees some input: sum over images a chunk at a time
            xv, dv = xc[(g, slice(None), *xs)], dyc[(g, slice(None), *ds)]  # [N, o..., C], [N, o..., K]
            cs, ks = idx[members, pos["C"]], idx[members, pos["K"]]
            rows = max(1, _CHUNK // max(1, len(members) * math.prod(dv.shape[1:-1])))
            acc = np.zeros(len(members))
            for n in range(0, p.batch, rows):
                # f16/bf16 -> f32 is exact and SIMD in numpy (-> f64 is not); einsum multiplies in f64
                xm = np.take(xv[n : n + rows], cs, axis=-1).astype(np.float32).reshape(-1, len(members))
                dm = np.take(dv[n : n + rows], ks, axis=-1).astype(np.float32).reshape(-1, len(members))
                acc += np.einsum("ij,ij->j", xm, dm, dtype=np.float64)
            out[members] = acc
    ep = p.epilogue
    if ep is None:
        return out
    if ep.reads_d != (d_epilogue is not None):
        raise ValueError(f"d: the {ep.kind} epilogue of {p.name} {'needs' if ep.reads_d else 'takes no'} D")
    if not ep.reads_d:
        return ep.alpha * out
    return ep.alpha * out + ep.beta * np.asarray(d_epilogue)[tuple(idx.T)].astype(np.float64)
