"""The checks of one problem's candidates, in the process that runs them: its inputs (seeded), the float64
references (a sample of dW entries, numpy's whole dW where cheap), tolerances and errors (docs/tolerances.md),
the GPU reference, loading a candidate and checking its result on fenced inputs, and the row its results make.

:mod:`convbw_mlir.measure.run`'s children and :mod:`convbw_mlir.measure.server`'s servers share them; both import
this module, never each other's internals (no import circle). Runtime only, like ``measure.run``.
"""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from convbw_mlir.measure import gpu_lock
from convbw_mlir.measure.records import ManifestEntry, ResultRow
from convbw_mlir.problem import ConvBwdWeightProblem
from convbw_mlir.reference import (
    accumulation_error,
    random_inputs,
    reference,
    rounded_sum_error,
    rounding_floor,
    sample_reference,
)
from convbw_mlir.runtime import FENCE_BYTES, Kernel, fenced_host

__all__ = [
    "INPUT_SEED",
    "NUMPY_REFERENCE_MAX_FLOPS",
    "DirectKernel",
    "Torch",
    "candidates",
    "checked_row",
    "error_stats",
    "load_checked",
    "sample_indices",
    "tolerance_rms",
]

# numpy's float64 reference runs at a few GFLOP/s: use it where it takes seconds.
NUMPY_REFERENCE_MAX_FLOPS = 4e10
# dW entries checked against float64 per problem: each costs one dot product of the reduction length on the host.
SAMPLE_ENTRIES = 256
SAMPLE_SEED = 11
# x and dy of every problem are random_inputs(problem, INPUT_SEED): every process that checks them draws the same.
INPUT_SEED = 7
# Significand bits (without the implicit one) and smallest normal exponent of each dW type.
_FORMAT = {"f16": (10, -14), "bf16": (7, -126), "f32": (23, -126)}


def _stats(samples: list[float]) -> dict[str, float]:
    s = sorted(samples)
    q = lambda f: s[min(len(s) - 1, int(f * (len(s) - 1)))]  # noqa: E731
    return {"median_s": statistics.median(s), "p10_s": q(0.1), "p90_s": q(0.9), "n": len(s)}


# ----------------------------------------------------------------------------------------------------------
# Accuracy: float64 on a sample of dW entries, errors in RMS units and ulps, tolerances (docs/tolerances.md)


def tolerance_rms(problem: ConvBwdWeightProblem, dw_dtype: str, peak: float, mma: bool = True,
                  rms: float | None = None) -> float:  # fmt: skip
    """Largest ``max|got - exact| / rms(exact)`` a correct kernel with f32 accumulation may show.

    One rounding of dW to ``dw_dtype`` (at most u * peak RMS, ``peak`` = max|dW| / rms) plus the f32
    accumulation error over L = N * prod(output) products, K_SIGMA standard deviations of it: with matrix
    instructions (``mma``) the accumulator is truncated, not rounded (Fasi et al. 2021, "Numerical behavior
    of NVIDIA tensor cores"), a bias that grows like u * n / sqrt(3) RMS over a chain of n = L / MMA_K updates;
    without (round to nearest, a serial sum: the GPU reference) it is u * sqrt(L (1 + 2 peak^2) / 18) at the
    largest entry (:func:`convbw_mlir.reference.rounded_sum_error`). Derivation: docs/tolerances.md.
    With ``rms`` (dW's RMS), plus :func:`convbw_mlir.reference.rounding_floor` in RMS units: what rounding to
    a subnormal or to zero costs whatever the value (a small epilogue scale puts f16 dW there).
    """
    if dw_dtype not in _FORMAT:
        raise ValueError(f"dw_dtype: unknown element type {dw_dtype!r}; known: {', '.join(_FORMAT)}")
    mant, _ = _FORMAT[dw_dtype]
    length = problem.gemm[3]
    acc = accumulation_error(length, True) if mma else rounded_sum_error(length, peak)
    return 2.0 ** -(mant + 1) * peak + acc + (rounding_floor(dw_dtype) / rms if rms else 0.0)


def _ulp(magnitude: np.ndarray, dtype: str) -> np.ndarray:
    """Spacing of ``dtype`` numbers at ``magnitude`` (> 0), subnormals included."""
    mant, emin = _FORMAT[dtype]
    exp = np.maximum(np.floor(np.log2(np.maximum(magnitude, np.finfo(np.float64).tiny))), emin)
    return np.exp2(exp - mant)


def error_stats(got: np.ndarray, exact: np.ndarray, dtype: str, rms: float | None = None) -> dict[str, Any]:
    """Worst error of ``got`` against ``exact`` (float64, same shape): in RMS units and in ulps of ``dtype``.

    ``error_rms`` = max|got - exact| / rms(exact); ``error_ulps`` = max of |got - exact| over the spacing
    of ``dtype`` at max(|exact|, rms) (entries near zero measured at the typical magnitude, where a
    cancellation leaves them); ``worst`` = the index of the entry with the largest error.
    """
    got = np.asarray(got, dtype=np.float64).ravel()
    exact = np.asarray(exact, dtype=np.float64).ravel()
    rms = float(np.sqrt(np.mean(exact**2))) if rms is None else rms
    rms = rms or 1.0
    diff = np.abs(got - exact)
    worst = int(diff.argmax()) if diff.size else 0
    return {
        "error_rms": float(diff[worst] / rms) if diff.size else 0.0,
        "error_ulps": float((diff / _ulp(np.maximum(np.abs(exact), rms), dtype)).max()) if diff.size else 0.0,
        "peak": float(np.abs(exact).max() / rms) if diff.size else 0.0,
        "worst": worst,
        "rms": rms,
    }


def sample_indices(problem: ConvBwdWeightProblem, entries: int = SAMPLE_ENTRIES, seed: int = SAMPLE_SEED) -> np.ndarray:
    """Sorted flat indices into dW (its layout) of ``entries`` distinct random entries, or all of them."""
    size = math.prod(problem.dw_shape)
    if size <= entries:
        return np.arange(size)
    return np.sort(np.random.default_rng(seed).choice(size, entries, replace=False))


class Torch:
    """cuDNN through torch, for layouts torch can express (channels-last and NCHW families)."""

    def __init__(self) -> None:
        import torch

        self.torch = torch
        self.device = "cuda"
        self.ok = torch.cuda.is_available()
        if self.ok:
            # cuDNN's algorithm search: once a shape, on its first call (the check, the device held alone); the
            # algorithm it finds is then fixed for every timed call
            torch.backends.cudnn.benchmark = True
            self.name = torch.cuda.get_device_name(0)

    def supports(self, p: ConvBwdWeightProblem) -> str | None:
        """None if supported, else why not."""
        if p.pad_low != p.pad_high:
            return "asymmetric pads"
        if p.dw_dtype != p.dtype:
            return "mixed dW type"
        if p.layout_family.x not in ("NHWGC", "NHWC", "NGCHW", "NCHW"):
            return f"layout {p.layout}"
        if p.layout_family.w not in ("GKYXC", "KYXC", "GKCYX", "KCYX"):
            return f"layout {p.layout}"
        return None

    def _tensor(self, a: np.ndarray, dtype: str) -> Any:
        t = self.torch
        if dtype == "bf16":
            return t.from_numpy(a.view(np.int16)).view(t.bfloat16)
        return t.from_numpy(a)

    def _fenced(self, a: np.ndarray, dtype: str) -> Any:
        """``a`` on the device, flat, followed by NaN as our kernels' inputs are (one protocol for every contender)."""
        return self._tensor(fenced_host(a), dtype).to(self.device)[: a.size]

    def prepare(self, p: ConvBwdWeightProblem, x: np.ndarray, dy: np.ndarray) -> tuple[Any, Any]:
        """A callable computing dW with torch, and a function turning its result into our dW layout."""
        t = self.torch
        rank = p.rank
        lay = p.layout_family
        n, g, c, k = p.batch, p.groups, p.in_channels, p.out_channels
        ins, outs = p.input_size, p.output_size
        # torch views [N, G*C, spatial...] over our memory; 1-D runs as 2-D with H=1 (channels-last exists).
        pad1 = (1,) if rank == 1 else ()
        xf, yf = self._fenced(x, p.dtype), self._fenced(dy, p.dtype)
        if lay.x in ("NHWGC", "NHWC"):
            xt = xf.reshape(n, *pad1, *ins, g * c)
            yt = yf.reshape(n, *pad1, *outs, g * k)
            nd = xt.dim()
            perm = (0, nd - 1, *range(1, nd - 1))
            xt, yt = xt.permute(perm), yt.permute(perm)  # channels-last strides over our memory
        else:
            xt = xf.reshape(n, g * c, *pad1, *ins)
            yt = yf.reshape(n, g * k, *pad1, *outs)
        filt = (*pad1, *p.filter_size)
        w = t.empty((g * k, c, *filt), dtype=xt.dtype, device=self.device)
        if lay.x in ("NHWGC", "NHWC"):
            w = w.to(memory_format=t.channels_last if w.dim() == 4 else t.channels_last_3d)
        one = (1,) if rank == 1 else ()
        stride, dil, pad = (*one, *p.stride), (*one, *p.dilation), ((0,) if rank == 1 else ()) + p.pad_low

        def call() -> Any:
            return t.ops.aten.convolution_backward(
                yt, xt, w, None, list(stride), list(pad), list(dil), False, [0] * len(stride), g, [False, True, False]
            )[1]

        def to_ours(dw: Any) -> np.ndarray:
            dw = dw.float().cpu()
            if lay.w in ("GKYXC", "KYXC"):
                dw = dw.permute(0, *range(2, dw.dim()), 1)  # [GK, filt..., C]
            arr = dw.contiguous().numpy().reshape(p.dw_shape)
            return arr

        return call, to_ours

    def sync(self) -> None:
        self.torch.cuda.synchronize()


def _torch() -> Torch | None:
    try:
        tw = Torch()
    except ImportError:
        return None
    return tw if tw.ok else None


# ----------------------------------------------------------------------------------------------------------
# One problem, in a child process


class _Problem:
    """What the checks of one problem need: inputs, the float64 sample, the whole reference if any."""

    def __init__(self, p: ConvBwdWeightProblem, state: Path, numpy_max_flops: float,
                 inputs: tuple[np.ndarray, np.ndarray] | None = None) -> None:  # fmt: skip
        self.p = p
        # ``inputs``: x and dy already made (measure.server's CPU workers save them), else made here
        self.x, self.dy = inputs if inputs is not None else random_inputs(p, seed=INPUT_SEED)
        saved = state / "check.npz"
        if saved.exists():  # an earlier child of this problem made them
            data = np.load(saved)
            self.indices, self.exact = data["indices"], data["exact"]
            self.want = data["want"] if data["want"].size else None
            self.want_tol = float(data["want_tol"])
        else:
            self.indices = sample_indices(p)
            self.exact = sample_reference(
                p, self.x, self.dy, np.stack(np.unravel_index(self.indices, p.dw_shape), axis=1)
            )
            # the whole reference, and the tolerance it adds (the GPU reference's own, where it stands in)
            self.want = reference(p, self.x, self.dy) if p.flops <= numpy_max_flops else None
            self.want_tol = 0.0
        self.rms = float(np.sqrt(np.mean(self.exact**2))) or 1.0
        self.peak = float(np.abs(self.exact).max()) / self.rms if self.exact.size else 0.0
        self.saved = saved
        if not saved.exists():
            self.save()

    def save(self) -> None:
        want = np.empty(0) if self.want is None else self.want
        np.savez(self.saved, indices=self.indices, exact=self.exact, want=want, want_tol=self.want_tol)

    def check(self, got: np.ndarray, dw_dtype: str, mma: bool = True) -> dict[str, Any]:
        """Errors of ``got`` (a whole dW) and the verdict: status ok or WRONG with the worst entry."""
        p = self.p
        got = np.asarray(got)
        if got.shape != tuple(p.dw_shape):
            return {"status": "WRONG", "error": f"shape: got {got.shape}, expected {tuple(p.dw_shape)}"}
        got = got.astype(np.float64)
        if not np.all(np.isfinite(got)):
            bad = tuple(int(i) for i in np.argwhere(~np.isfinite(got))[0])
            return {"status": "WRONG", "error": f"dw: non-finite value {got[bad]} at index {bad}"}
        flat = got.ravel()
        sample = error_stats(flat[self.indices], self.exact, dw_dtype, self.rms)
        res: dict[str, Any] = {"error_rms": sample["error_rms"], "error_ulps": sample["error_ulps"]}
        peak, full = self.peak, None
        if self.want is not None:
            full = error_stats(got, self.want, dw_dtype)
            res["error_rms_full"] = full["error_rms"]
            peak = max(peak, full["peak"])
        tol = res["tolerance_rms"] = tolerance_rms(p, dw_dtype, peak, mma, self.rms)
        # (error, its tolerance, flat index, exact value, what it was compared with) of each failed check
        failed = []
        if sample["error_rms"] > tol:
            at = sample["worst"]
            failed.append((sample["error_rms"], tol, int(self.indices[at]), float(self.exact[at]), "float64"))
        if full is not None and full["error_rms"] > tol + self.want_tol:
            against = "float64" if self.want_tol == 0.0 else "the GPU reference"
            at = full["worst"]
            failed.append((full["error_rms"], tol + self.want_tol, at, float(self.want.ravel()[at]), against))
        res["status"] = "WRONG" if failed else "ok"
        if failed:
            err, limit, at, want, against = failed[0]
            idx = tuple(int(i) for i in np.unravel_index(at, p.dw_shape))
            res["error"] = (
                f"dw: error {err:.3g} RMS > tolerance {limit:.3g} RMS vs {against} at index {idx}: "
                f"got {flat[at]:.6g}, want {want:.6g}"
            )
        return res


class _Clock:
    """Seconds between laps, added to ``phases[name]`` (no-op without ``phases``): where a problem's time goes."""

    def __init__(self, phases: dict[str, float] | None) -> None:
        self.phases, self.t = phases, time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        if self.phases is not None:
            self.phases[name] = self.phases.get(name, 0.0) + (now - self.t)
        self.t = now


def _lock(driver: str, device: int | None) -> gpu_lock.DeviceLock:
    """The machine-wide lock of the device this process runs on (:mod:`convbw_mlir.measure.gpu_lock`)."""
    return gpu_lock.for_device(driver, device or 0)


def _run_reference(folder: Path, prob: _Problem, rec: dict, driver: str, device: int | None) -> dict[str, Any]:
    """Run the GPU reference and check it; where it holds and numpy's is out of reach, it is ``prob.want``."""
    if not rec.get("ok"):
        checked = "numpy" if prob.want is not None else f"float64 sample ({len(prob.indices)} entries) only"
        return {"reference_error": rec.get("error", "no kernel"), "reference_checked": checked}
    with _lock(driver, device).shared():
        gpu = Kernel((folder / rec["vmfb"]).read_bytes(), driver, device).run(prob.x, prob.dy)
    # its ISA is checked at compile time: without matrix instructions it rounds to nearest
    check = prob.check(gpu, "f32", mma=bool(rec.get("mma_count", 1)))
    check["entries"] = len(prob.indices)
    fields: dict[str, Any] = {"reference_check": check}
    if check["status"] != "ok":
        fields["reference_checked"] = f"GPU reference WRONG vs float64: {check['error']}"
    elif prob.want is not None:
        fields["reference_checked"] = "numpy"
    else:
        prob.want, prob.want_tol = gpu.astype(np.float64), check["tolerance_rms"]
        fields["reference_checked"] = f"float64 sample ({len(prob.indices)} entries)"
    return fields


class DirectKernel:
    """A kernel only the direct CUDA launch runs (sm_90a: TMA tensor maps, which IREE's runtime cannot pass),
    on torch's memory, with :class:`convbw_mlir.runtime.Kernel`'s calls: ``to_device_fenced``, ``kernel(x, dy)``
    returning a result whose ``to_host`` reads dW back.

    Args:
        launch_dir: the schedule's folder (``launch.json`` and its PTX: :meth:`convbw_mlir.cuda_launch.Launch.files`),
            compiled with an output argument (x, dy, dW, workspace).
        problem: the problem it computes (dW's shape and type).
        device: the CUDA device ordinal (None: 0).

    Raises:
        ValueError: no CUDA torch, or a schedule the launcher refuses (naming why).
    """

    def __init__(self, launch_dir: Path, problem: ConvBwdWeightProblem, device: int | None) -> None:
        try:
            import torch
        except ImportError:
            raise ValueError("launch: the direct CUDA launch needs torch (pip install .[torch])") from None
        from convbw_mlir.cuda_launch import CudaLauncher, Launch
        from convbw_mlir.problem import numpy_dtype

        self.torch, self.index = torch, device or 0
        launch = Launch.from_files(lambda name: (launch_dir / name).read_bytes())
        self.launcher = CudaLauncher(launch, self.index)
        self.shape, self.dtype = tuple(problem.dw_shape), numpy_dtype(problem.dw_dtype)
        self.out = self._bytes(math.prod(self.shape) * self.dtype.itemsize)
        self.workspace = self._bytes(max(launch.transient, 256))

    def _bytes(self, n: int) -> Any:
        return self.torch.empty(n, dtype=self.torch.uint8, device=f"cuda:{self.index}")

    def to_device_fenced(self, array: np.ndarray, slack_bytes: int = FENCE_BYTES) -> Any:
        """``array``'s bytes on the device followed by NaN, as ``Kernel.to_device_fenced``."""
        return self.torch.from_numpy(fenced_host(array, slack_bytes).view(np.uint8)).to(f"cuda:{self.index}")

    def __call__(self, x: Any, dy: Any) -> DirectKernel:
        stream = self.torch.cuda.current_stream(self.index).cuda_stream
        self.launcher((x.data_ptr(), dy.data_ptr(), self.out.data_ptr(), self.workspace.data_ptr()), stream)
        return self

    def to_host(self) -> np.ndarray:
        return self.out.cpu().numpy().view(self.dtype).reshape(self.shape)


def load_checked(folder: Path, prob: _Problem, rec: dict, driver: str, device: int | None,
                 phases: dict[str, float] | None = None) -> tuple[dict, Any]:  # fmt: skip
    """Load one candidate (``rec``: its manifest record) and check it once on fenced inputs.

    Returns its result and, where it is correct, ``(kernel, x, dy)`` on the device, ready to time; else None.
    ``phases``: seconds of each step are added to it (``load_s``: the module's load, the driver's JIT of PTX
    included; ``copies_s``: the fenced inputs; ``checked_call_s``: the call and dW's read-back; ``check_s``).
    """
    if not rec.get("ok"):
        return {"status": "no kernel", "error": rec.get("error", "")}, None
    if rec.get("launch") and driver != "cuda":  # TMA tensor maps: the direct launch runs it, not IREE's runtime
        return {"status": "n/a", "error": f"driver: {driver} (the kernel runs by the direct CUDA launch)"}, None
    clock = _Clock(phases)
    with _lock(driver, device).shared():  # loading, copies and the checked call: GPU work, never beside a timing
        if rec.get("launch"):
            kernel: Any = DirectKernel(folder / rec["launch"], prob.p, device)
        else:
            kernel = Kernel((folder / rec["vmfb"]).read_bytes(), driver, device)
        clock.lap("load_s")
        # NaN after x and dy: a kernel reading past them is WRONG here, not only where memory holds NaN later
        xd, dyd = kernel.to_device_fenced(prob.x), kernel.to_device_fenced(prob.dy)
        clock.lap("copies_s")
        got = np.asarray(kernel(xd, dyd).to_host())
        clock.lap("checked_call_s")
    res = prob.check(got, prob.p.dw_dtype)  # numpy: the CPU's work, holding nothing
    clock.lap("check_s")
    if res["status"] != "ok" and "non-finite" in res.get("error", ""):
        res["error"] += " (x and dy are followed by NaN: the kernel reads past the end of its inputs)"
    return res, ((kernel, xd, dyd) if res["status"] == "ok" else None)


def candidates(entry: ManifestEntry, options: dict) -> list[str]:
    """What one problem runs: the reference first, then its contenders, then cuDNN where torch and CUDA are."""
    names = ["reference", *(n for n in entry.contenders if n != "reference")]
    if options["use_torch"] and options["driver"] == "cuda":
        names.append("cudnn")
    return names


def checked_row(entry: ManifestEntry, names: list[str], results: dict[str, dict]) -> ResultRow:
    """The row of ``entry`` from each of ``names``' results (:func:`candidates`; the reference's among them),
    as the children or the server (:mod:`convbw_mlir.measure.server`) reported them; a missing one never ran."""
    ref = results.get("reference", {})
    # the reference itself failed or crashed: its error; else its fields (reference_check, reference_checked)
    reference = {"reference_error": ref.get("error", ref["status"])} if "status" in ref else ref
    contenders = {n: results.get(n, {"status": "crashed", "error": "never ran"}) for n in names[1:]}
    for name, rec in entry.contenders.items():
        if "config" in rec and name in contenders:
            contenders[name]["config"] = rec["config"]
    return ResultRow.head(entry, contenders, reference)
