"""Epilogue arrays on the host side: checking a caller's D and ``out`` before anything runs, and
drawing test data for them. The epilogue itself (:class:`convbw_mlir.problem.Epilogue`) lives in the
problem; where the kernel applies it is :func:`convbw_mlir.builders.finish_dw` (docs/epilogues.md).

Needs only numpy (and the problem's dtype table): it runs where only the IREE runtime is installed.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from convbw_mlir.problem import ConvBwdWeightProblem

__all__ = ["check_epilogue_arrays", "integer_inputs", "random_d"]


def _check_array(problem: ConvBwdWeightProblem, name: str, arr: Any, dtype: str, writeable: bool = False) -> None:
    """``arr`` is a host numpy array of dW's shape and ``dtype``.

    Raises:
        TypeError: not a numpy array (e.g. a device tensor: named with its type), or the wrong dtype.
        ValueError: the wrong shape (naming dW's layout letters), or read-only where it is written.
    """
    from convbw_mlir.problem import numpy_dtype

    if not isinstance(arr, np.ndarray):
        where = f" on device {arr.device}" if hasattr(arr, "device") else ""
        raise TypeError(f"{name}: expected a host numpy array, got {type(arr).__module__}.{type(arr).__name__}{where}")
    want = numpy_dtype(dtype)
    if arr.dtype != want:
        raise TypeError(f"{name}: expected dtype {want} ({dtype}), got {arr.dtype}")
    if tuple(arr.shape) != tuple(problem.dw_shape):
        letters = "/".join(problem.dims("dw"))
        raise ValueError(f"{name}: expected shape {tuple(problem.dw_shape)} (dW's layout {letters}), got {arr.shape}")
    if writeable and not arr.flags.writeable:
        raise ValueError(f"{name}: the array is read-only; the result is written into it")


def check_epilogue_arrays(problem: ConvBwdWeightProblem, d: Any = None, out: Any = None) -> list[np.ndarray]:
    """Check ``d`` and ``out`` against the problem's epilogue; return the extra kernel arguments.

    - no epilogue or ``scale``: no ``d``; ``out`` optional (dW's shape and type).
    - ``bilinear``: ``d`` required (dW's shape, the epilogue's D type); ``out`` optional.
    - ``accumulate``: ``out`` required, dW's shape and type, writeable: it is D and receives the result;
      no separate ``d``.

    Returns:
        [] or [D as a contiguous array] (for accumulate, ``out``'s contents).

    Raises:
        TypeError / ValueError: naming ``d`` or ``out`` and what is wrong; nothing has been written.
    """
    ep = problem.epilogue
    kind = ep.kind if ep is not None else None
    if d is not None and kind != "bilinear":
        if kind == "accumulate":
            raise ValueError("d: an accumulate epilogue reads D from out= (the result lands there); give out= only")
        compiled = f"with a {kind} epilogue" if kind else "without an epilogue"
        raise ValueError(
            f"d: this op was compiled {compiled} (problem {problem.name}) and takes no D; compile the problem "
            "with epilogue=Epilogue('bilinear', alpha, beta) to pass one"
        )
    if out is not None:
        _check_array(problem, "out", out, problem.dw_dtype, writeable=True)
    if kind == "bilinear":
        if d is None:
            raise ValueError(f"d: this op was compiled with a bilinear epilogue ({ep.tag}) and needs D (d=...)")
        _check_array(problem, "d", d, ep.d_dtype)
        return [np.ascontiguousarray(d)]
    if kind == "accumulate":
        if out is None:
            raise ValueError(f"out: this op was compiled with an accumulate epilogue ({ep.tag}) and needs out=")
        return [np.ascontiguousarray(out)]
    return []


def random_d(problem: ConvBwdWeightProblem, seed: int = 1) -> np.ndarray | None:
    """A unit-normal D for the problem's epilogue (dW's shape, D's type), or None where none is read."""
    from convbw_mlir.problem import numpy_dtype

    ep = problem.epilogue
    if ep is None or not ep.reads_d:
        return None
    rng = np.random.default_rng(seed)
    return rng.standard_normal(problem.dw_shape, dtype=np.float32).astype(numpy_dtype(ep.d_dtype))


def integer_inputs(
    problem: ConvBwdWeightProblem, seed: int = 0, low: int = -5, high: int = 5
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """x, dy (and D where read) with integer values in [low, high], as CK's bilinear bwd-weight test
    draws them (alpha = beta = 2, values in [-5, 5], as issue 16 describes it); such sums are exact in
    f32 while they stay below 2**24."""
    from convbw_mlir.problem import numpy_dtype

    rng = np.random.default_rng(seed)
    dt = numpy_dtype(problem.dtype)
    x = rng.integers(low, high + 1, problem.x_shape).astype(dt)
    dy = rng.integers(low, high + 1, problem.dy_shape).astype(dt)
    d = None
    if problem.epilogue is not None and problem.epilogue.reads_d:
        d = rng.integers(low, high + 1, problem.dw_shape).astype(numpy_dtype(problem.epilogue.d_dtype))
    return x, dy, d
