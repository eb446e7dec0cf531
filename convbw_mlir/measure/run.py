"""Run side of the benchmark: needs only iree-base-runtime, numpy and (if importable) torch.

    python -m convbw_mlir.measure.run DIR [--filter SUBSTR] [--out results.json] [--devices 0,1,..] [--driver D]
                                        [--no-torch] [--timeout SECONDS] [--jobs N] [--server]

For each problem of ``DIR/manifest.json`` a child process (so that a kernel that faults the GPU, which
poisons the process's CUDA context, costs only its own result) makes random x and dy (seeded),
device-resident; runs the GPU reference and checks it against float64 on a random sample of dW entries
(and against the whole numpy float64 reference where that takes seconds); then runs every contender and
cuDNN through torch (``torch.backends.cudnn.benchmark = True``, channels-last, the same layout and type).
Each result is checked against float64 on the sample and against the whole reference (numpy's, or the GPU
reference where it passed its check), with tolerances derived from the reduction length and the types
(docs/tolerances.md); errors are reported in units of the RMS of dW and in ulps of dW's type. A wrong
result is reported as WRONG and not timed as a win. Each contender is timed the same way (warm-up, then
batches of calls each ended by reading the result back, at least 20 batches and 0.2 s, median and spread).
A contender whose child dies, hangs, or raises a device fault is recorded as ``crashed`` with its message;
the problem's other contenders then run in a fresh child. With several GPUs (``--devices``, default every
visible one) one worker per GPU takes the next problem (:mod:`convbw_mlir.measure.pool`); ``--jobs N`` puts N
workers on each GPU, whose CPU work overlaps. Every GPU step takes the device's machine-wide lock
(:mod:`convbw_mlir.measure.gpu_lock`): a timing (and cuDNN's algorithm search) holds the device alone; other GPU
work (context creation, copies, references, checks, a child's exit) shares it, never beside a timing; the CPU
work between holds nothing. Writes JSON, a markdown table and a PNG plot next to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from convbw_mlir.measure import gpu_lock
from convbw_mlir.problem import ConvBwdWeightProblem
from convbw_mlir.reference import (
    accumulation_error,
    random_inputs,
    reference,
    rounded_sum_error,
    rounding_floor,
    sample_reference,
)
from convbw_mlir.runtime import FENCE_BYTES, Kernel, fenced_host, time_calls

__all__ = ["DirectKernel", "error_stats", "main", "run_manifest", "sample_indices", "tolerance_rms"]

# numpy's float64 reference runs at a few GFLOP/s: use it where it takes seconds.
NUMPY_REFERENCE_MAX_FLOPS = 4e10
# dW entries checked against float64 per problem: each costs one dot product of the reduction length on the host.
SAMPLE_ENTRIES = 256
SAMPLE_SEED = 11
# x and dy of every problem are random_inputs(problem, INPUT_SEED): every process that checks them draws the same.
INPUT_SEED = 7
# A child silent this long (a kernel that never ends) is killed; the contender it was running reads crashed.
STEP_TIMEOUT_S = 600
# Exit status of a child that stopped after a failed contender, so the problem's next one gets a fresh process.
_RESTART = 3
# Device faults: after one the process's context is unusable. IREE reports CUDA errors as ABORTED; on the H100
# (2026-11-23) a faulting kernel surfaced as "ABORTED; CUDA error 'CUDA_ERROR_ILLEGAL_ADDRESS'" at the result's
# fence, or as a bare "ABORTED; ... hal.device.queue.dealloca" where the dealloca met the failed queue first.
_FAULT = re.compile(r"CUDA_ERROR_\w+|cudaError\w+|hipError\w+|illegal (memory )?(address|access)|\bABORTED\b")


def _status_of(error: BaseException | str) -> str:
    """``crashed`` for an error that names a device fault, else ``failed``."""
    return "crashed" if _FAULT.search(str(error)) else "failed"


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
        self.ok = torch.cuda.is_available()
        if self.ok:
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

    def prepare(self, p: ConvBwdWeightProblem, x: np.ndarray, dy: np.ndarray) -> tuple[Any, Any]:
        """A callable computing dW with torch, and a function turning its result into our dW layout."""
        t = self.torch
        rank = p.rank
        lay = p.layout_family
        n, g, c, k = p.batch, p.groups, p.in_channels, p.out_channels
        ins, outs = p.input_size, p.output_size
        # torch views [N, G*C, spatial...] over our memory; 1-D runs as 2-D with H=1 (channels-last exists).
        pad1 = (1,) if rank == 1 else ()
        if lay.x in ("NHWGC", "NHWC"):
            xt = self._tensor(x, p.dtype).reshape(n, *pad1, *ins, g * c)
            yt = self._tensor(dy, p.dtype).reshape(n, *pad1, *outs, g * k)
            nd = xt.dim()
            perm = (0, nd - 1, *range(1, nd - 1))
            xt, yt = xt.permute(perm), yt.permute(perm)
        else:
            xt = self._tensor(x, p.dtype).reshape(n, g * c, *pad1, *ins)
            yt = self._tensor(dy, p.dtype).reshape(n, g * k, *pad1, *outs)
        xt, yt = xt.to("cuda"), yt.to("cuda")  # preserve_format keeps the strides (channels-last or not)
        filt = (*pad1, *p.filter_size)
        w = t.empty((g * k, c, *filt), dtype=xt.dtype, device="cuda")
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


def _first_line(e: BaseException) -> str:
    """The line of an error that names a device fault, else its first line (IREE's messages run long)."""
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()] or [type(e).__name__]
    return next((ln for ln in lines if _FAULT.search(ln)), lines[0])[:300]


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


def _run_contender(folder: Path, prob: _Problem, rec: dict, driver: str, device: int | None,
                   timed: bool = True) -> dict[str, Any]:  # fmt: skip
    if not rec.get("ok"):
        return {"status": "no kernel", "error": rec.get("error", "")}
    if rec.get("launch") and driver != "cuda":  # TMA tensor maps: the direct launch runs it, not IREE's runtime
        return {"status": "n/a", "error": f"driver: {driver} (the kernel runs by the direct CUDA launch)"}
    lock = _lock(driver, device)
    with lock.shared():  # loading, copies and the checked call: GPU work, never beside another's timing
        if rec.get("launch"):
            kernel: Any = DirectKernel(folder / rec["launch"], prob.p, device)
        else:
            kernel = Kernel((folder / rec["vmfb"]).read_bytes(), driver, device)
        # NaN after x and dy: a kernel reading past them is WRONG here, not only where memory holds NaN later
        xd, dyd = kernel.to_device_fenced(prob.x), kernel.to_device_fenced(prob.dy)
        got = np.asarray(kernel(xd, dyd).to_host())
    res = prob.check(got, prob.p.dw_dtype)  # numpy: the CPU's work, holding nothing
    if res["status"] != "ok" and "non-finite" in res.get("error", ""):
        res["error"] += " (x and dy are followed by NaN: the kernel reads past the end of its inputs)"
    if res["status"] == "ok" and timed:
        with lock.timing():
            res |= _stats(time_calls(kernel, xd, dyd))
            res |= _gpu_time(lambda: kernel(xd, dyd), lambda r: r.to_host(), driver)
    return res


def _run_cudnn(prob: _Problem, torch_: Torch | None) -> dict[str, Any]:
    if torch_ is None:
        return {"status": "n/a", "error": "no CUDA torch"}
    why = torch_.supports(prob.p)
    if why:
        return {"status": "n/a", "error": why}
    lock = _lock("cuda", None)  # torch's device 0: the one this child is pinned to, or the driver's first
    with lock.shared():
        call, to_ours = torch_.prepare(prob.p, prob.x, prob.dy)
        with lock.timing():  # the first call searches cuDNN's algorithms by timing them: it holds the device alone
            dw = call()
            torch_.sync()
        got = to_ours(dw)
    res = prob.check(got, prob.p.dw_dtype)
    if res["status"] == "ok":
        with lock.timing():
            res |= _stats(time_calls(call, sync=torch_.sync))
            res |= _gpu_time(call, lambda _: torch_.sync(), "cuda")
    return res


_CUPTI: list[bool] = []  # whether this child can time by CUPTI, decided (and CUPTI warmed up) once


def _gpu_time(call: Any, sync: Any, driver: str) -> dict[str, Any]:
    """``kernel_s``: the call's GPU time by CUPTI (:mod:`convbw_mlir.measure.cupti`), on CUDA where torch
    is importable; the tuner ranks by it (docs/decisions.md#kernel-time). Its failure is recorded, not fatal."""
    from convbw_mlir.measure import cupti

    if driver != "cuda":
        return {}
    try:
        if not _CUPTI:
            _CUPTI.append(cupti.available())
            if _CUPTI[0]:
                cupti.warm_up()
        return cupti.kernel_seconds(call, sync) if _CUPTI[0] else {}
    except Exception as e:  # noqa: BLE001 - the call's own timing stands; only the kernel time is missing
        return {"kernel_time_error": _first_line(e)}


def _child(spec: dict) -> int:
    """Run the contenders ``spec["names"]`` of one problem, writing one JSON event a line to ``spec["events"]``.

    Returns 0 when all ran, :data:`_RESTART` after one that raised (its error recorded): whatever it did
    to the device, the problem's next contender gets a fresh process.
    """
    folder, state = Path(spec["folder"]), Path(spec["state"])
    entry, driver, device = spec["entry"], spec["driver"], spec["device"]
    events = open(spec["events"], "a", buffering=1)  # noqa: SIM115 - line-buffered, each event lands at once

    def emit(**event: Any) -> None:
        events.write(json.dumps(event) + "\n")
        events.flush()
        os.fsync(events.fileno())

    with _lock(driver, device).shared():  # torch's CUDA context: allocation on the device
        torch_ = _torch() if spec["use_torch"] and driver == "cuda" else None
    emit(event="device", name=torch_.name if torch_ else driver)
    prob = _Problem(ConvBwdWeightProblem.from_dict(entry["problem"]), state, spec["numpy_max_flops"])
    contenders = entry["contenders"]
    for name in spec["names"]:
        emit(event="start", name=name)
        try:  # each takes the device's lock for its GPU steps (shared) and its timing (alone)
            if name == "reference":
                res = _run_reference(folder, prob, contenders.get("reference", {}), driver, device)
            elif name == "cudnn":
                res = _run_cudnn(prob, torch_)
            else:
                res = _run_contender(folder, prob, contenders[name], driver, device, not spec.get("check_only"))
            if name == "reference":
                prob.save()
        except Exception as e:  # noqa: BLE001 - recorded; the next contender runs in a fresh process
            emit(event="result", name=name, result={"status": _status_of(e), "error": _first_line(e)})
            return _RESTART
        emit(event="result", name=name, result=res)
    emit(event="done")
    return 0


# ----------------------------------------------------------------------------------------------------------
# The parent: one child per problem, a fresh one after a contender that failed or killed its process


def _death(rc: int | None, stderr: str, timeout_s: float) -> str:
    """Why a child ended without a result: its signal or exit status, and the last line it wrote."""
    if rc is None:
        how = f"no progress for {timeout_s:g} s (killed)"
    elif rc < 0:
        try:
            how = f"process killed by {signal.Signals(-rc).name}"
        except ValueError:
            how = f"process killed by signal {-rc}"
    else:
        how = f"process exited with status {rc}"
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    fault = next((ln for ln in reversed(lines) if _FAULT.search(ln)), lines[-1] if lines else "")
    return f"{how}: {fault[:240]}" if fault else how


def _append_event(path: str, event: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(event) + "\n")


def _wait(child: subprocess.Popen, events: Path, timeout_s: float, lock: gpu_lock.DeviceLock) -> int | None:
    """The child's exit status, or None where it wrote no event for ``timeout_s`` (then it is killed). A child
    that announces its exit (``exit`` event) is let go and reaped under ``lock``'s shared turn."""
    last_size, deadline = -1, time.monotonic() + timeout_s
    while (rc := child.poll()) is None:
        size = events.stat().st_size if events.exists() else 0
        if size != last_size:  # each contender's start and result is an event: progress
            last_size, deadline = size, time.monotonic() + timeout_s
            if size and events.read_text().endswith('{"event": "exit"}\n'):
                return gpu_lock.reap(child, lock)
        elif time.monotonic() > deadline:
            child.kill()
            child.wait()
            return None
        time.sleep(0.05)
    return rc


def _run_problem(folder: Path, entry: dict, options: dict, timeout_s: float, log,
                 env: dict[str, str] | None = None) -> tuple[dict[str, Any], str | None]:  # fmt: skip
    """One problem's row (reference fields and every contender's result) and the device name.

    ``options``: driver, device, use_torch, numpy_max_flops, as the children take them; ``env``: what
    the children's environment adds (the device they are pinned to, :mod:`convbw_mlir.measure.pool`).
    """
    child_env = {**os.environ, **(env or {}), gpu_lock.EXIT_TURN_ENV: "1"}
    lock = gpu_lock.for_device(options["driver"], options["device"] or 0, child_env)
    names = ["reference", *(n for n in entry["contenders"] if n != "reference")]
    if options["use_torch"] and options["driver"] == "cuda":
        names.append("cudnn")
    results: dict[str, dict] = {}
    device_name = None
    with tempfile.TemporaryDirectory(prefix="convbw-run-") as tmp:
        for attempt in range(len(names) + 1):
            todo = [n for n in names if n not in results]
            if not todo:
                break
            ev_path, err_path = Path(tmp) / f"events{attempt}.jsonl", Path(tmp) / f"stderr{attempt}.txt"
            spec = {"folder": str(folder), "entry": entry, "names": todo, "state": tmp, "events": str(ev_path)}
            spec |= options
            (Path(tmp) / "spec.json").write_text(json.dumps(spec))
            cmd = [sys.executable, "-m", "convbw_mlir.measure.run", "--child", str(Path(tmp) / "spec.json")]
            with open(err_path, "w") as err:
                child = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=err, stderr=err, env=child_env)
                rc = _wait(child, ev_path, timeout_s, lock)
            pending, done = None, False
            for line in ev_path.read_text().splitlines() if ev_path.exists() else []:
                ev = json.loads(line)
                if ev["event"] == "device":
                    device_name = ev["name"]
                elif ev["event"] == "start":
                    pending = ev["name"]
                elif ev["event"] == "result":
                    results[ev["name"]], pending = ev["result"], None
                    if ev["result"].get("status") in ("crashed", "failed"):
                        log(f"  {entry['key']}: {ev['name']}: {ev['result']['status']}: {ev['result'].get('error')}")
                elif ev["event"] == "done":
                    done = True
            if done:
                break
            if rc == _RESTART:
                continue
            why = _death(rc, err_path.read_text(errors="replace"), timeout_s)
            log(f"  {entry['key']}: {pending or 'the child'}: {why}")
            if pending is None:  # died outside any contender (inputs, sample): nothing else will fare better
                for n in todo:
                    results[n] = {"status": "crashed", "error": why}
                break
            results[pending] = {"status": "crashed", "error": why}
    row: dict[str, Any] = {}
    ref = results.pop("reference", {})
    if "status" in ref:  # the reference itself failed or crashed
        row["reference_error"] = ref.get("error", ref["status"])
    else:
        row |= ref
    row["contenders"] = {n: results.get(n, {"status": "crashed", "error": "never ran"}) for n in names[1:]}
    for name, rec in entry["contenders"].items():
        if "config" in rec and name in row["contenders"]:
            row["contenders"][name]["config"] = rec["config"]
    return row, device_name


def read_manifest(folder: str | Path) -> dict[str, Any]:
    """``folder/manifest.json``, its header checked (``target``, ``iree_version``, ``problems``).

    Raises:
        ValueError: no such file, not JSON, or a missing or mistyped field, naming the file.
    """
    from convbw_mlir.jsonio import read_json, require_fields

    path = Path(folder) / "manifest.json"
    manifest = read_json(path, "manifest")
    return require_fields(manifest, {"target": str, "iree_version": str, "problems": list}, f"manifest {path}")


def run_manifest(folder: str | Path, filt: str = "", device: int | None = None, driver: str | None = None,
                 use_torch: bool = True, log=print, timeout_s: float = STEP_TIMEOUT_S,
                 numpy_max_flops: float = NUMPY_REFERENCE_MAX_FLOPS, check_only: bool = False,
                 devices: Sequence[int] | str | None = None, env: dict[str, str] | None = None,
                 jobs: int = 1, server: bool = False) -> dict:  # fmt: skip
    """Run every problem of a manifest, each in child processes; returns the results (see the module docstring).

    ``check_only`` checks every contender (NaN fences, float64) and times none (the fenced fuzz).

    ``timeout_s`` bounds each step of a child (the reference, a contender: a hung kernel reads crashed);
    ``numpy_max_flops`` bounds the problems checked against the whole numpy float64 reference (every one
    is checked on a float64 sample).

    ``devices``: indexes among the visible GPUs (``"all"``: every one), one measuring worker pinned to
    each, problems dealt to whichever is free (:mod:`convbw_mlir.measure.pool`); rows come back in the
    manifest's order, each naming its ``device_index`` where there are several. None: every problem on
    ``device`` (the driver's index, default its first), here; ``env``, where given, pins the children
    instead (what :class:`convbw_mlir.measure.pool.Device` holds: they see only their device).

    ``jobs``: measuring workers a device, problems dealt to whichever is free: their process start, inputs and
    float64 references (seconds of CPU a problem) overlap; every GPU step takes the device's machine-wide lock
    (:mod:`convbw_mlir.measure.gpu_lock`), a timing alone, so timings are as with one.

    ``server``: one persistent measuring process a device instead of a child a problem, each candidate checked
    once and the correct ones timed in one batch, inputs and float64 references made ahead by CPU workers
    (:mod:`convbw_mlir.measure.server`); the results then name its protocol (``server``).

    Raises:
        ValueError: a device that is not visible, or none visible for a GPU driver, or ``jobs`` below 1, or
            ``jobs`` above 1 with ``server`` (before any child starts).
    """
    from convbw_mlir.measure.pool import Device, deal, resolve_devices

    if not (isinstance(jobs, int) and jobs >= 1):
        raise ValueError(f"jobs: expected a count >= 1, got {jobs!r}")
    if server and jobs != 1:
        raise ValueError(f"jobs: the server is one process a device, got jobs={jobs} (its CPU work has workers)")

    folder = Path(folder).resolve()
    manifest = read_manifest(folder)
    driver = driver or _target(manifest["target"]).driver
    if devices is None:
        slots = [Device(driver, device or 0, env or {})]
    else:
        slots = resolve_devices(driver, None if devices == "all" else devices)
    results: dict[str, Any] = {
        "device": driver,
        "driver": driver,
        "target": manifest["target"],
        "iree_version": manifest["iree_version"],
        "date": time.strftime("%Y-%m-%d"),
        "problems": [],
    }
    slots = [d for d in slots for _ in range(jobs)]  # several workers a device: its lock orders their GPU steps
    pinned = devices is not None or bool(env)  # the children see only their device: the driver's first
    options = {"driver": driver, "device": None if pinned else device, "use_torch": use_torch,
               "numpy_max_flops": numpy_max_flops, "check_only": check_only}  # fmt: skip
    todo = [(str(folder), e, options, timeout_s) for e in manifest["problems"] if not filt or filt in e["key"]]
    rows: dict[int, dict[str, Any]] = {}
    if server:
        from convbw_mlir.measure.server import Served

        measured: Any = Served(folder, [t[1] for t in todo], options, slots, timeout_s, log)
        source = ((i, (_head(todo[i][1]) | checked, name)) for i, (checked, name) in measured)
    else:
        source = deal(_measure_entry, todo, slots, log, lost=_lost_entry)
    for i, (row, device_name) in source:
        if device_name and results["device"] == driver:
            results["device"] = device_name
        if len({d.index for d in slots}) == 1:
            del row["device_index"]  # one device: the rows as before the pool
        rows[i] = row
        log(_line(row))
    results["problems"] = [rows[i] for i in sorted(rows)]
    if server:
        results["server"] = measured.summary()
    from convbw_mlir.targets import RUNS_SM80

    roof = next((t for key, t in RUNS_SM80.items() if key in results["device"]), None)
    for row in results["problems"]:
        p = ConvBwdWeightProblem.from_dict(row.pop("_problem"))
        if roof:
            row["roofline_s"] = roof.roofline_seconds(p.flops, p.min_bytes, p.dtype)
    return results


def _target(name: str) -> Any:
    from convbw_mlir.targets import get_target

    return get_target(name)


def _measure_entry(payload: tuple, device: Any, log: Any) -> tuple[dict[str, Any], str | None]:
    """One manifest entry's row, measured in children pinned to ``device`` (a pool worker's task)."""
    folder, entry, options, timeout_s = payload
    checked, device_name = _run_problem(Path(folder), entry, options, timeout_s, log, device.env)
    return _head(entry) | checked | {"device_index": device.index}, device_name


def _head(entry: dict) -> dict[str, Any]:
    """The fields of a row that come from the problem alone."""
    p = ConvBwdWeightProblem.from_dict(entry["problem"])
    head = {"name": entry["name"], "key": entry["key"], "flops": p.flops, "bytes": p.min_bytes}
    return head | {"depthwise_or_grouped": p.groups > 1, "reduction_length": p.gemm[3], "_problem": entry["problem"]}


def _lost_entry(payload: tuple, why: str) -> tuple[dict[str, Any], None]:
    """The row of an entry whose measuring worker died: every contender crashed, with why."""
    entry = payload[1]
    crashed = {n: {"status": "crashed", "error": why} for n in entry["contenders"] if n != "reference"}
    return _head(entry) | {"reference_error": why, "contenders": crashed, "device_index": None}, None


def _line(row: dict) -> str:
    parts = [f"{row['key']:<42}"]
    for name, r in row["contenders"].items():
        if r.get("status") == "ok" and "median_s" in r:
            parts.append(f"{name} {r['median_s'] * 1e6:9.1f}us")
        else:
            parts.append(f"{name} {r.get('status')}")
    return "  ".join(parts)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:  # a child of _run_problem
        spec = json.loads(Path(argv[1]).read_text())
        code = _child(spec)
        sys.stdout.flush()
        sys.stderr.flush()
        # the exit frees our device memory: the parent reaps us under the device's shared turn (_wait)
        gpu_lock.exit_turn(lambda: _append_event(spec["events"], {"event": "exit"}))
        os._exit(code)  # no teardown: after a device fault, releasing the device can hang or abort
    ap = argparse.ArgumentParser(prog="python -m convbw_mlir.measure.run", description=__doc__.split("\n\n")[0])
    ap.add_argument("folder")
    ap.add_argument("--filter", default="")
    ap.add_argument("--out", default=None, help="results JSON (default FOLDER/results.json)")
    ap.add_argument(
        "--devices",
        default=None,
        help="GPUs to measure on, one worker each: indexes like 0,1 (default: every visible GPU)",
    )
    ap.add_argument("--device", type=int, default=None, help="one device by the driver's index, not pinned")
    ap.add_argument("--driver", default=None, help="override the manifest target's driver")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--timeout", type=float, default=STEP_TIMEOUT_S, help="seconds one contender may run")
    ap.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="measuring workers a device: set-up and float64 references overlap, GPU steps never do",
    )
    ap.add_argument(
        "--server",
        action="store_true",
        help="one persistent measuring process a device, candidates checked once and timed in batches (tuning)",
    )
    args = ap.parse_args(argv)
    if args.jobs < 1 or (args.server and args.jobs != 1):
        why = "with --server: one process a device" if args.jobs >= 1 else "expected a count >= 1"
        print(f"error: --jobs: {why}, got {args.jobs}", file=sys.stderr)
        return 1
    if not args.timeout > 0:
        print(f"error: --timeout: expected seconds > 0, got {args.timeout}", file=sys.stderr)
        return 1
    from convbw_mlir.measure.pool import parse_devices, resolve_devices
    from convbw_mlir.measure.report import write_report

    t0 = time.time()
    try:
        manifest = read_manifest(args.folder)  # a missing or malformed manifest: one line, before any child starts
        if args.device is not None and args.devices is not None:
            raise ValueError("--device and --devices: give one")
        devices = None if args.device is not None else parse_devices(args.devices) if args.devices else "all"
        if devices is not None:  # no GPU, or one that is not there: one line, before any child starts
            resolve_devices(args.driver or _target(manifest["target"]).driver, None if devices == "all" else devices)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    results = run_manifest(
        args.folder,
        args.filter,
        args.device,
        args.driver,
        not args.no_torch,
        timeout_s=args.timeout,
        devices=devices,
        jobs=args.jobs,
        server=args.server,
    )
    out = Path(args.out or Path(args.folder) / "results.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")
    write_report(results, out)
    print(f"wrote {out} and its .md/.png ({len(results['problems'])} problems, {time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
