"""The PyTorch entry point's functions: our weight gradient on torch tensors, on torch's device, without copies.

- :func:`conv_weight` (and :func:`conv1d_weight`, :func:`conv2d_weight`, :func:`conv3d_weight`): the
  signature and result of ``torch.nn.grad.conv{1,2,3}d_weight``.
- :class:`ConvWeightGrad`: an autograd function whose backward takes dW from our kernel (input and bias
  gradients stay torch's), and :func:`convert_model`, which switches a model's ``Conv{1,2,3}d`` layers to it.

- for the switch (``switch.py``) and bench/ (not re-exported by ``convbw_mlir.torch``): :func:`problem_memo`
  (its :class:`ProblemMemo`), :func:`kernel_for` / :func:`kernel_of` / :func:`plan_of` / :func:`kernel_identity`,
  :class:`DirectCall` (:func:`direct_calls`, :func:`workspace`, :func:`current_stream_handle`), the format helpers
  (:func:`memory_formats`, :func:`dense_order`, :func:`torch_memory_format`, :func:`torch_pads`, :data:`DTYPES`),
  :func:`warn_once` and :func:`forget_kernels`.

Tensors are passed to IREE through DLPack (no copy) and dW is written straight into a tensor torch
allocated (the kernel's ``{iree.abi.output = 0}`` argument). On CUDA the kernels are launched straight
on torch's current stream (:mod:`convbw_mlir.cuda_launch`; ``CONVBW_CUDA_LAUNCH=iree`` forces IREE's
runtime, which cannot run on torch's stream: a call then waits for torch's stream and returns when dW
is written). docs/torch.md. Importable only where torch is installed.
"""

from __future__ import annotations

import atexit
import ctypes
import hashlib
import math
import os
import threading
import types
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

try:
    import torch
except ImportError as e:  # torch is an optional extra
    raise ImportError(
        "convbw_mlir.torch needs PyTorch, which is not installed: pip install 'convbw-mlir[torch]'"
    ) from e

from convbw_mlir.problem import ConvBwdWeightProblem, Epilogue
from convbw_mlir.runtime import PreparedCall

__all__ = [
    "DTYPES",
    "NATIVE_DRIVER_FUNCTIONS",
    "NATIVE_LAUNCH_ENV",
    "ConvWeightGrad",
    "DirectCall",
    "ProblemMemo",
    "artifact_dir",
    "call_for",
    "conv1d_weight",
    "conv2d_weight",
    "conv3d_weight",
    "conv_forward",
    "conv_weight",
    "convert_model",
    "cuda_target",
    "current_stream_handle",
    "dense_order",
    "direct_calls",
    "forget_kernels",
    "kernel_family",
    "kernel_identity",
    "kernel_for",
    "kernel_of",
    "loaded_kernels",
    "memory_formats",
    "native_launch_wanted",
    "plan_of",
    "problem_for",
    "problem_memo",
    "target_for",
    "torch_memory_format",
    "torch_pads",
    "warn_once",
    "workspace",
]

DTYPES = {torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32"}
# Dense orders a tensor may be in: torch's contiguous (N, C, *spatial) and channels-last (N, *spatial, C).
# Contiguous maps to ckProfiler layout 4 (NGCHW/GKCYX/NGKHW), channels-last to layout 2 (NHWGC/GKYXC/NHWGK).
_FORMATS = {"contiguous": 4, "channels_last": 2}
ARTIFACTS_ENV = "CONVBW_ARTIFACTS"
# which path runs a CUDA kernel: "auto" (direct where the kernel has a launch schedule, else IREE's
# runtime with one warning), "direct" (an error where it cannot), "iree" (always IREE's runtime)
LAUNCH_ENV = "CONVBW_CUDA_LAUNCH"
# "0": the direct launch issues every dispatch on each call; otherwise a call on memory already seen once
# replays a CUDA graph of the schedule (one driver launch instead of 2-3)
GRAPHS_ENV = "CONVBW_CUDA_GRAPHS"
_MAX_GRAPHS = 64  # per kernel; graphs are never destroyed while the process runs (a replay may be in flight)


def dense_order(fmt: str, ndim: int) -> tuple[int, ...]:
    """The permutation of a tensor's dimensions that is C-contiguous in memory format ``fmt``."""
    return tuple(range(ndim)) if fmt == "contiguous" else (0, *range(2, ndim), 1)


def memory_formats(t: torch.Tensor) -> list[str]:
    """The memory formats ``t`` is dense in (both where size-1 dimensions make them coincide)."""
    return [f for f in _FORMATS if t.permute(dense_order(f, t.dim())).is_contiguous()]


def _tuple(name: str, value: Any, rank: int, minimum: int | None = None) -> tuple[int, ...]:
    """``value`` (an int or ``rank`` ints, each >= ``minimum``) as a tuple, or an error naming ``name``."""
    if isinstance(value, int) and not isinstance(value, bool):
        out = (value,) * rank
    else:
        try:
            out = tuple(int(v) for v in value)
        except (TypeError, ValueError):
            raise TypeError(f"{name}: expected an int or {rank} ints, got {value!r}") from None
    if len(out) != rank:
        raise ValueError(f"{name}: expected {rank} values for a {rank}-d convolution, got {value!r}")
    if minimum is not None and any(v < minimum for v in out):
        raise ValueError(f"{name}: expected values >= {minimum}, got {value!r}")
    return out


def torch_pads(padding: Any, rank: int, filter_size: tuple[int, ...], dilation: tuple[int, ...]) -> tuple:
    """(pad_low, pad_high) from torch's ``padding`` (ints, or ``"valid"``/``"same"`` as Conv layers hold)."""
    if padding == "valid":
        return (0,) * rank, (0,) * rank
    if padding == "same":  # torch puts the odd element of the total on the high side (F.conv2d)
        total = [d * (f - 1) for f, d in zip(filter_size, dilation)]
        return tuple(t // 2 for t in total), tuple(t - t // 2 for t in total)
    pad = _tuple("padding", padding, rank)
    if any(p < 0 for p in pad):
        raise ValueError(f"padding: expected values >= 0, got {padding!r}")
    return pad, pad


def target_for(device: torch.device, problem: ConvBwdWeightProblem | None = None) -> tuple[str, str, int | None]:
    """(compile target, IREE driver, device index) for a torch device (and the problem to run there).

    On a compute-capability 9.0 GPU a ``problem`` whose sm_90a plan is the sm_90a weight-gradient kernel's
    (:func:`convbw_mlir.policies.sm90.is_sm90`; layout 4/0 through its layout-2 copies) gets ``sm_90a``; anything
    else there gets ``sm_80`` (sm_80 PTX through the driver's JIT), as does every problem on newer GPUs, whose PTX
    ``sm_90a`` is not (arch-specific PTX runs on its own compute capability only).

    Raises:
        ValueError: a device type IREE cannot run (naming it), or a GPU torch build of neither CUDA nor ROCm.
    """
    if device.type == "cpu":
        return "host", "local-task", None
    if device.type != "cuda":
        raise ValueError(f"input: tensors on {device.type} are not supported (cuda, ROCm's cuda, or cpu)")
    index = device.index if device.index is not None else torch.cuda.current_device()
    if torch.version.hip:
        arch = torch.cuda.get_device_properties(index).gcnArchName.split(":")[0]
        return arch, "hip", index
    if not torch.version.cuda:
        raise ValueError("input: a cuda tensor, but this torch build has neither CUDA nor ROCm")
    return cuda_target(torch.cuda.get_device_capability(index), problem), "cuda", index


def cuda_target(capability: tuple[int, int], problem: ConvBwdWeightProblem | None = None) -> str:
    """The compile target :func:`target_for` gives ``problem`` on an NVIDIA GPU of ``capability`` (major, minor):
    what a machine without that GPU compiles ahead for it (``examples/torch_enable.py --precompile sm_90a``).

    Raises:
        ValueError: a compute capability older than IREE's sm_80 target.
    """
    from convbw_mlir.targets import TARGETS

    major, minor = capability
    cap = 10 * major + minor
    if cap == 90 and problem is not None:
        from convbw_mlir.plan import PlanError, decide
        from convbw_mlir.policies import sm90

        try:  # the kernel's own problems, and layout 4/0 ones whose layout-2 copies it computes
            if sm90.is_sm90(decide(problem, "sm_90a")):
                return "sm_90a"
        except (PlanError, ValueError):
            pass
    # IREE 3.13's newest CUDA flag target is sm_80..89; newer GPUs run sm_80 PTX through the driver's JIT.
    known = sorted((int(n[3:]), n) for n in TARGETS
                   if n.startswith("sm_") and n[3:].isdigit() and int(n[3:]) <= cap)  # fmt: skip
    if not known:
        raise ValueError(f"input: compute capability {major}.{minor} is older than IREE's sm_80 target")
    return "sm_80" if cap >= 90 else known[-1][1]


def problem_for(
    input: torch.Tensor,
    weight_size: Any,
    grad_output: torch.Tensor,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
) -> tuple[ConvBwdWeightProblem, str]:
    """The problem these torch arguments pose, and the memory format ("contiguous" / "channels_last").

    Raises:
        TypeError / ValueError: naming the argument: not a tensor, dtype, device, shape, memory format.
    """
    for name, t in (("input", input), ("grad_output", grad_output)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    rank = input.dim() - 2
    if rank not in (1, 2, 3):
        raise ValueError(f"input: expected 3 to 5 dimensions (N, C, *spatial), got shape {tuple(input.shape)}")
    if input.dtype not in DTYPES:
        raise TypeError(f"input: expected dtype float16, bfloat16 or float32, got {input.dtype}")
    if grad_output.dtype != input.dtype:
        raise TypeError(f"grad_output: expected dtype {input.dtype} (the input's), got {grad_output.dtype}")
    if grad_output.device != input.device:
        raise ValueError(f"grad_output: on {grad_output.device}, but input is on {input.device}")
    if grad_output.dim() != input.dim():
        raise ValueError(f"grad_output: expected {input.dim()} dimensions, got shape {tuple(grad_output.shape)}")
    try:
        wsize = tuple(int(s) for s in weight_size)
    except (TypeError, ValueError):
        raise TypeError(f"weight_size: expected a sequence of ints, got {weight_size!r}") from None
    if len(wsize) != input.dim():
        raise ValueError(f"weight_size: expected {input.dim()} values (K, C/groups, *filter), got {wsize}")
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise ValueError(f"groups: expected an int >= 1, got {groups!r}")
    n, c_total = input.shape[:2]
    k_total = wsize[0]
    if c_total % groups or k_total % groups:
        raise ValueError(f"groups: {groups} does not divide input channels {c_total} and output channels {k_total}")
    if wsize[1] != c_total // groups:
        raise ValueError(f"weight_size: expected C/groups = {c_total // groups} at index 1, got {wsize}")
    stride_t, dilation_t = _tuple("stride", stride, rank, 1), _tuple("dilation", dilation, rank, 1)
    low, high = torch_pads(padding, rank, wsize[2:], dilation_t)
    out_size = [
        (i + lo + hi - d * (f - 1) - 1) // st + 1
        for i, lo, hi, d, f, st in zip(input.shape[2:], low, high, dilation_t, wsize[2:], stride_t)
    ]
    if tuple(grad_output.shape) != (n, k_total, *out_size):
        want = (int(n), k_total, *out_size)
        raise ValueError(f"grad_output: expected shape {want} for these sizes, got {tuple(grad_output.shape)}")
    x_formats, dy_formats = memory_formats(input), memory_formats(grad_output)
    if not x_formats:
        raise ValueError(f"input: expected a contiguous or channels-last tensor, got strides {input.stride()}")
    common = [f for f in x_formats if f in dy_formats]
    if not common:
        raise ValueError(
            f"grad_output: expected the input's memory format ({x_formats[0]}), got strides {grad_output.stride()}"
        )
    fmt = common[0]
    problem = ConvBwdWeightProblem(
        groups=groups,
        batch=int(n),
        in_channels=c_total // groups,
        out_channels=k_total // groups,
        input_size=tuple(int(s) for s in input.shape[2:]),
        filter_size=wsize[2:],
        stride=stride_t,
        dilation=dilation_t,
        pad_low=low,
        pad_high=high,
        dtype=DTYPES[input.dtype],
        layout=_FORMATS[fmt],
    )
    return problem, fmt


@dataclass(frozen=True, slots=True)
class ProblemMemo:
    """What :func:`problem_memo` remembers of one argument signature: all a call needs besides the tensors."""

    problem: ConvBwdWeightProblem
    fmt: str  # the memory format x and dy are dense in: "contiguous" or "channels_last"
    x_shape: list[int]  # x, dy and dW as the kernel sees them (the problem's layout)
    dy_shape: list[int]
    dw_shape: list[int]
    order: tuple[int, ...]  # the permutation of torch's dimensions that is dense in ``fmt``
    kernel: PreparedCall | DirectCall
    out_layout: tuple[tuple[int, ...], tuple[int, ...]]  # dW's torch size and strides, dense in ``fmt``


_PROBLEMS: dict[tuple, ProblemMemo] = {}


def problem_memo(input, weight_size, grad_output, stride, padding, dilation, groups, accumulate=False) -> ProblemMemo:  # noqa: ANN001, E501
    """The :class:`ProblemMemo` of these arguments (as :func:`conv_weight` takes them), remembered per argument
    signature: building a problem and its shapes costs ~110 µs (its checks); a training step asks for the same
    few again and again (docs/torch.md).

    Raises:
        TypeError / ValueError: as :func:`problem_for`; RuntimeError: as :func:`kernel_for`.
    """
    try:
        key = (
            input.shape, input.stride(), input.dtype, input.device, grad_output.shape, grad_output.stride(),
            grad_output.dtype, grad_output.device, tuple(weight_size), str(stride), str(padding), str(dilation),
            str(groups), accumulate, torch.are_deterministic_algorithms_enabled(),  # the kernel may differ
        )  # fmt: skip
    except (AttributeError, TypeError):  # not tensors, weight_size not a sequence: the error naming it
        problem_for(input, weight_size, grad_output, stride, padding, dilation, groups)
        raise
    found = _PROBLEMS.get(key)
    if found is None:
        problem, fmt = problem_for(input, weight_size, grad_output, stride, padding, dilation, groups)
        if accumulate:  # dW += x * dy, fused in the kernel's write (docs/epilogues.md)
            problem = problem.with_(epilogue=Epilogue("accumulate"))
        kernel = kernel_for(problem, input.device)
        order = dense_order(fmt, input.dim())
        # dW's size and strides in the input's format: one empty_strided per call, no permutes
        dense = [int(weight_size[i]) for i in order]
        dense_strides = [math.prod(dense[j + 1 :]) for j in range(len(dense))]
        out_layout = (
            tuple(int(s) for s in weight_size),
            tuple(dense_strides[order.index(i)] for i in range(len(order))),
        )
        shapes = list(problem.x_shape), list(problem.dy_shape), list(problem.dw_shape)
        found = ProblemMemo(problem, fmt, *shapes, order, kernel, out_layout)
        if len(_PROBLEMS) > 4096:  # a bound for programs that see endless shapes
            _PROBLEMS.clear()
        _PROBLEMS[key] = found
    return found


# -- kernels ---------------------------------------------------------------------------------------
_KERNELS: dict[tuple, PreparedCall | DirectCall] = {}
_PLANS: dict[tuple, tuple] = {}  # the same key -> (plan, IREE flags) of the kernel: torch_ops' deterministic check
_IDENTITIES: dict[tuple, str] = {}  # the same key -> kernel_identity()
_LOCK = threading.Lock()
atexit.register(_KERNELS.clear)  # release IREE's objects before the interpreter tears its bindings down


def artifact_dir(problem: ConvBwdWeightProblem, target: str) -> Path | None:
    """Where a precompiled kernel for ``problem`` on ``target`` is looked for: ``$CONVBW_ARTIFACTS/
    <target>/<problem.name>`` (a ``CompiledOp.save`` folder); None where the variable is unset."""
    root = os.environ.get(ARTIFACTS_ENV)
    return Path(root) / target / problem.name if root else None


def kernel_for(problem: ConvBwdWeightProblem, device: torch.device) -> PreparedCall | DirectCall:
    """The prepared kernel of ``problem`` on ``device``: loaded once per process.

    Looks in :func:`artifact_dir` first (a machine without the IREE compiler), else takes the
    dispatcher's choice (:func:`convbw_mlir.dispatch.select`, a tuned variant where the tuning database
    has one) from the kernel cache, compiling it on a miss in a child process (an IREE crash is an error
    here), and saves it in the artifacts folder when the variable is set.

    Raises:
        RuntimeError: no precompiled kernel and no IREE compiler to build one.
    """
    target, driver, index = target_for(device, problem)
    deterministic = torch.are_deterministic_algorithms_enabled()
    key = (problem, target, index, deterministic)  # deterministic mode may choose another plan
    with _LOCK:
        if key in _KERNELS:
            return _KERNELS[key]
        from convbw_mlir.build.artifact import CompiledOp
        from convbw_mlir.dispatch.api import compile_op

        folder = artifact_dir(problem, target)
        op = None
        if folder is not None and (folder / "op.json").is_file():
            op = CompiledOp.load(folder)
            if op.problem != problem or op.target != target:
                raise ValueError(f"{ARTIFACTS_ENV}: {folder} holds {op.problem.name} for {op.target}")
            if deterministic and not (op.plan is not None and op.plan.deterministic):
                raise RuntimeError(f"torch.use_deterministic_algorithms(True): the kernel in {folder} is not known "
                                   "to be deterministic (its plan is unknown or sums in no fixed order)")  # fmt: skip
        if op is None:
            try:
                import iree.compiler  # noqa: F401
            except ImportError:
                raise RuntimeError(
                    f"no kernel for {problem.name} on {target}: none in {ARTIFACTS_ENV}"
                    f"={os.environ.get(ARTIFACTS_ENV, '(unset)')} and no IREE compiler here to build one"
                ) from None
            # an accumulate epilogue's D is its output already; otherwise the kernel gets an output buffer
            output_arg = problem.epilogue is None
            op = compile_op(problem, target, isolate=True, output_arg=output_arg, deterministic=deterministic)
            if folder is not None:
                op.save(folder)
        _KERNELS[key] = call_for(op, driver, index)
        _PLANS[key] = (op.plan, tuple(op.flags))
        # the code that runs and how it is launched: what the switch's remembered verdicts are keyed by
        path = "direct" if type(_KERNELS[key]) is DirectCall else "iree"
        _IDENTITIES[key] = f"{path}:{hashlib.sha256(bytes(op.vmfb)).hexdigest()[:32]}"
        return _KERNELS[key]


def kernel_of(problem: ConvBwdWeightProblem, device: torch.device) -> PreparedCall | DirectCall | None:
    """The kernel :func:`kernel_for` loaded for ``problem`` on ``device`` (under the current deterministic
    mode), or None where none is loaded yet; never compiles."""
    target, _, index = target_for(device, problem)
    return _KERNELS.get((problem, target, index, torch.are_deterministic_algorithms_enabled()))


def plan_of(problem: ConvBwdWeightProblem, device: torch.device) -> tuple[Any, tuple[str, ...]]:
    """(plan, IREE flags) of the kernel loaded as :func:`kernel_of`'s; (None, ()) where none is loaded or its
    artifact has no plan (the switch's deterministic check)."""
    target, _, index = target_for(device, problem)
    return _PLANS.get((problem, target, index, torch.are_deterministic_algorithms_enabled()), (None, ()))


def kernel_identity(problem: ConvBwdWeightProblem, device: torch.device) -> str | None:
    """The identity of the kernel :func:`kernel_of` gives (how it is launched, ``direct`` or ``iree``, and the
    sha256 of its module): another compile, variant or launch path is another identity; None where none is loaded."""
    target, _, index = target_for(device, problem)
    return _IDENTITIES.get((problem, target, index, torch.are_deterministic_algorithms_enabled()))


def direct_calls() -> list[DirectCall]:
    """Every direct launch this process has loaded (bench/torch_step.py turns their CUDA graphs off and on)."""
    with _LOCK:
        return [k for k in _KERNELS.values() if type(k) is DirectCall]


def forget_kernels() -> None:
    """Forget every loaded kernel, remembered problem and kept workspace, as a new process would (the artifacts
    folder stays)."""
    with _LOCK:
        _KERNELS.clear()
        _WORKSPACE.clear()
        _PLANS.clear()
        _IDENTITIES.clear()
        _PROBLEMS.clear()


def kernel_family(plan: Any) -> str:
    """Which of our kernel families a plan is: ``sm_90a`` (the wgmma kernel), ``sm_80`` (the explicit sm_80
    kernels), ``IREE`` (IREE's own codegen: strategy mma, simt or iree), ``unknown`` (no plan saved)."""
    if plan is None:
        return "unknown"
    from convbw_mlir.plan_data import Strategy
    from convbw_mlir.policies import sm90

    if sm90.is_sm90(plan):
        return "sm_90a"
    return "sm_80" if plan.strategy == Strategy.EXPLICIT else "IREE"


def loaded_kernels() -> list[dict[str, Any]]:
    """The kernels this process has loaded, one dict each: ``problem`` (its name), ``target``, ``family``
    (:func:`kernel_family`), ``path`` (``direct``: launched on torch's stream; ``iree``: IREE's runtime, a host
    wait per call), ``launches`` (kernels and transfers a call queues), ``kernels`` (their names, as a
    profiler shows them), ``graphs`` (CUDA graphs recorded, one per memory it was called on twice),
    ``maps_encoded`` (tensor-map sets encoded, one per new x/dy address pair; sm_90a only) and ``maps_slots`` (the
    device slots they took: bounded, cuda_launch.MapSlots): what a training run asks of it (bench/torch_step.py)."""
    out = []
    with _LOCK:
        for key, kernel in _KERNELS.items():
            problem, target = key[:2]
            plan = _PLANS.get(key, (None,))[0]
            row = {"problem": problem.name, "target": target, "family": kernel_family(plan),
                   "path": "direct" if type(kernel) is DirectCall else "iree"}  # fmt: skip
            if type(kernel) is DirectCall:
                launcher = kernel.launcher
                row |= {"launches": len(launcher.launch.steps), "kernels": sorted(launcher.launch.exports),
                        "graphs": len(kernel._graphs), "maps_encoded": getattr(launcher, "encodings", 0),
                        "maps_slots": len(getattr(getattr(launcher, "slots", None), "device", ())),
                        "splits": plan.k_batch if plan is not None else None}  # fmt: skip
            out.append(row)
    return out


# -- the direct CUDA launch (convbw_mlir/cuda_launch.py) ---------------------------------------------
def call_for(op: Any, driver: str, index: int | None) -> Any:
    """How ``op`` runs: a :class:`DirectCall` on CUDA or ROCm (HIP) where its launch schedule allows, else IREE's
    runtime.

    Raises:
        ValueError: ``$CONVBW_CUDA_LAUNCH`` is not ``auto``, ``direct`` or ``iree``.
        RuntimeError: ``direct`` asked for and the kernel has no supported schedule (says why).
    """
    mode = os.environ.get(LAUNCH_ENV, "auto")
    if mode not in ("auto", "direct", "iree"):
        raise ValueError(f"{LAUNCH_ENV}: expected auto, direct or iree, got {mode!r}")
    if driver in ("cuda", "hip") and mode != "iree":
        launch = getattr(op, "launch", None)
        why = "its artifact has no launch schedule (compiled before it existed)" if launch is None else launch.refused
        if why is None:
            return DirectCall(launch, index, driver, op.target)
        if mode == "direct":
            raise RuntimeError(f"{LAUNCH_ENV}=direct: {op.problem.name} cannot be launched directly: {why}")
        warnings.warn(
            f"{op.problem.name}: runs through IREE's runtime, not the direct {driver.upper()} launch: {why}",
            stacklevel=4,
        )
    return PreparedCall(op.vmfb, driver, index)


_WORKSPACE: dict[tuple[int, int], torch.Tensor] = {}  # (device, stream) -> transient workspace, grown as needed
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # the handle without a Stream object
_RAW_EXEC = hasattr(torch.cuda.CUDAGraph, "raw_cuda_graph_exec")  # torch >= 2.8: the graph's cudaGraphExec_t


NATIVE_LAUNCH_ENV = "CONVBW_TORCH_NATIVE_LAUNCH"  # "0": the C++ hot path never launches DirectCall's schedule itself


def native_launch_wanted() -> bool:
    """Whether the C++ hot path launches a direct call's schedule itself: ``$CONVBW_TORCH_NATIVE_LAUNCH``, "1" or
    unset (on since the H100 run: docs/decisions.md#native-launch), "0" off.

    Raises:
        TypeError: the variable set to anything else, naming it and the value.
    """
    value = os.environ.get(NATIVE_LAUNCH_ENV, "1").strip()
    if value not in ("0", "1", ""):
        raise TypeError(f"{NATIVE_LAUNCH_ENV}: expected 0 or 1, got {value!r}")
    return value != "0"


# the driver functions DirectCall.native_plan hands over, in this order (switch_native.cpp: Driver)
NATIVE_DRIVER_FUNCTIONS = ("cuLaunchKernel", "cuMemsetD8Async", "cuMemsetD16Async", "cuMemsetD32Async", "cuMemcpyAsync",
                           "cuMemcpyHtoDAsync_v2", "cuMemAlloc_v2", "cuMemAllocHost_v2", "cuTensorMapEncodeTiled",
                           "cuTensorMapEncodeIm2col", "cuEventCreate", "cuEventRecord", "cuEventQuery",
                           "cuEventSynchronize")  # fmt: skip
_WS_STREAMS: dict[int, Any] = {}  # device -> the stream kept workspaces are allocated on (_kept_workspace)


def _kept_workspace(index: int, nbytes: int, device: torch.device) -> torch.Tensor:
    """A transient workspace kept for GPU ``index`` and its current stream: allocated on a stream of its own, so
    that no graph pool routing the current stream's allocations takes it (torch.compile's reduce-overhead warms up
    in its pool and refuses a tensor kept alive there), and recorded on the current stream, where the kernels use
    it: a workspace replaced by a larger one is reused only after the work queued on it."""
    side = _WS_STREAMS.get(index)
    if side is None:
        side = _WS_STREAMS[index] = torch.cuda.Stream(index)
    with torch.cuda.stream(side):
        ws = torch.empty(nbytes, dtype=torch.uint8, device=device)
    ws.record_stream(torch.cuda.current_stream(index))
    return ws


def current_stream_handle(index: int) -> int:
    """The raw handle of torch's current stream on GPU ``index`` (what a direct launch queues on)."""
    return _raw_stream(index) if _raw_stream else torch.cuda.current_stream(index).cuda_stream


def workspace(index: int, stream: int) -> torch.Tensor | None:
    """The transient workspace the direct launches keep for GPU ``index`` and ``stream``; None before a first call."""
    return _WORKSPACE.get((index, stream))


class DirectCall:
    """A kernel's schedule launched on torch's current stream (:class:`convbw_mlir.cuda_launch.CudaLauncher`):
    no IREE runtime, no host wait; the transient workspace is a torch tensor kept per device and stream.

    The second call on the same memory (stream and the four addresses) records the schedule as a CUDA graph
    on a side stream; later calls on that memory replay it: one launch instead of 2-3 (docs/torch.md). Not
    while torch is capturing a graph itself (then the dispatches are launched into the caller's capture).
    """

    def __init__(self, launch: Any, index: int, driver: str = "cuda", arch: str | None = None) -> None:
        if driver == "hip":  # ROCm's torch: the same streams and graphs API, HIP underneath
            from convbw_mlir.hip_launch import HipLauncher

            self.launcher = HipLauncher(launch, index, arch)
        else:
            from convbw_mlir.cuda_launch import CudaLauncher

            self.launcher = CudaLauncher(launch, index)
        self.index, self.transient, self.driver = index, launch.transient, driver
        self.use_graphs = os.environ.get(GRAPHS_ENV, "1") != "0"
        self._graphs: dict[tuple, torch.cuda.CUDAGraph] = {}
        self._seen: dict[tuple, None] = {}
        self._side: torch.cuda.Stream | None = None

    def _record(self, ptrs: tuple[int, ...], stream: int) -> torch.cuda.CUDAGraph | None:
        """The schedule on ``ptrs`` captured as a CUDA graph (nothing runs); None where capture fails (then
        this kernel stops using graphs, warning once)."""
        try:
            if self._side is None:
                self._side = torch.cuda.Stream(self.index)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.stream(self._side):
                graph.capture_begin(capture_error_mode="thread_local")
                try:
                    # replayed on ``stream``; its tensor-map slots are the graph's for good (cuda_launch.MapSlots)
                    self.launcher(ptrs, self._side.cuda_stream, maps_stream=stream, captured=True)
                finally:
                    graph.capture_end()
            return graph
        except Exception as e:  # the plain launches still work: keep them
            self.use_graphs = False
            warnings.warn(f"direct CUDA launch: no CUDA graphs for this kernel: {type(e).__name__}: {e}", stacklevel=3)
            return None

    def __call__(self, x: torch.Tensor, dy: torch.Tensor, out: torch.Tensor) -> None:
        """Queue dW of ``x``, ``dy`` into ``out`` (dense in the kernel's order) on torch's current stream.

        Raises:
            ValueError: a tensor whose data is not 16-byte aligned (the PTX declares ``.align 16``), naming it.
        """
        self.launch(x, dy, out)

    def native_launch(self) -> tuple[Callable, int, int, int, tuple | None] | None:
        """What the C++ hot path needs to launch this kernel without Python (docs/torch.md#the-native-hot-path):
        (:meth:`launch`, the driver's ``cuGraphLaunch`` address (0: graphs off, or a torch whose CUDAGraph hides its
        exec handle) and ``cuStreamIsCapturing``'s, the transient workspace's bytes, :meth:`native_plan`); None where
        it can do neither (HIP)."""
        if getattr(self, "driver", None) != "cuda":
            return None
        graphs, plan = self.use_graphs and _RAW_EXEC, self.native_plan()
        if not graphs and plan is None:
            return None
        from convbw_mlir.cuda_launch import _libcuda

        lib = _libcuda()
        address = lambda name: ctypes.cast(getattr(lib, name), ctypes.c_void_p).value  # noqa: E731
        return (
            self.launch,
            address("cuGraphLaunch") if graphs else 0,
            address("cuStreamIsCapturing"),
            self.transient,
            plan,
        )

    def native_plan(self) -> tuple | None:
        """The schedule for the C++ hot path to launch itself on memory whose graph it does not know, where
        :func:`native_launch_wanted` (on unless ``$CONVBW_TORCH_NATIVE_LAUNCH`` is "0"): (the driver functions'
        addresses in :data:`NATIVE_DRIVER_FUNCTIONS`' order, 0 where absent; the steps: ``(0, CUfunction, grid +
        block + dynamic shared bytes, ((buffer, offset), ...), constants, the maps binding or -1, maps)`` a kernel,
        each map ``(binding, 0 tiled / 1 im2col, dtype, dims, strides, box, element strides, lower, upper,
        interleave, swizzle, L2 promotion, OOB fill)``; ``(1, buffer, offset, bytes, -1, 0, pattern, width)`` a fill
        and ``(2, buffer, offset, bytes, source buffer, source offset, 0, 0)`` a copy; buffers numbered as the
        launcher's: x, dy, dW, the workspace; the tensor-map slots C++ reuses, as the launcher's
        ``slots.cap``); None else."""
        if not native_launch_wanted() or getattr(self, "driver", None) != "cuda":
            return None
        from convbw_mlir.cuda_launch import _libcuda

        lib, launcher = _libcuda(), self.launcher
        fns = tuple(
            ctypes.cast(getattr(lib, n), ctypes.c_void_p).value if hasattr(lib, n) else 0
            for n in NATIVE_DRIVER_FUNCTIONS
        )
        steps: list[tuple] = []
        for i, (step, source) in enumerate(zip(launcher._plan, launcher.launch.steps, strict=True)):
            if step[0] == "k":
                _, func, dims, _, _, binds, _ = step
                maps_binding, maps = launcher._maps.get(i, (-1, []))[:2]
                specs = tuple((m.binding, 0 if m.mode == "tiled" else 1, m.dtype, m.dims, m.strides, m.box,
                               m.element_strides, m.lower, m.upper, m.interleave, m.swizzle, m.l2_promotion,
                               m.oob_fill) for m in maps)  # fmt: skip
                steps.append((0, func, tuple(dims), tuple(binds), tuple(source.constants), maps_binding, specs))
            else:
                kind, (target, offset), length, src, pattern, width = step
                src_buffer, src_offset = src if src else (-1, 0)
                steps.append(
                    (1 if kind == "fill" else 2, target, offset, length, src_buffer, src_offset, pattern, width)
                )
        return fns, tuple(steps), launcher.slots.cap

    def launch(self, x: torch.Tensor, dy: torch.Tensor, out: torch.Tensor) -> tuple[int, torch.Tensor]:
        """:meth:`__call__`, and what the C++ hot path keeps for this memory: the raw ``cudaGraphExec_t`` the call
        replayed (0 where it replayed none: first call, a capture, graphs off) and the workspace it used (None: one
        for this call only, while the stream is captured).

        Raises:
            ValueError: a tensor whose data is not 16-byte aligned (the PTX declares ``.align 16``), naming it.
        """
        index = self.index
        stream = _raw_stream(index) if _raw_stream else torch.cuda.current_stream(index).cuda_stream
        capturing = torch.cuda.is_current_stream_capturing()
        if capturing:  # the capture's own memory, freed after the call as its other temporaries (torch's rule)
            ws = torch.empty(max(self.transient, 256), dtype=torch.uint8, device=x.device)
        else:
            ws = _WORKSPACE.get((index, stream))
            if ws is None or ws.numel() < self.transient:
                ws = _WORKSPACE[(index, stream)] = _kept_workspace(index, max(self.transient, 256), x.device)
        ptrs = (x.data_ptr(), dy.data_ptr(), out.data_ptr(), ws.data_ptr())
        if (ptrs[0] | ptrs[1] | ptrs[2]) & 15:
            i = [p & 15 != 0 for p in ptrs].index(True)
            name = ("input", "grad_output", "output")[i]
            raise ValueError(f"{name}: data at {ptrs[i]:#x} is not 16-byte aligned (the kernel's pointers are)")
        if self.use_graphs and not capturing:
            key = (stream, ptrs)
            graph = self._graphs.get(key)
            if graph is None and key in self._seen and len(self._graphs) < _MAX_GRAPHS:
                graph = self._record(ptrs, stream)
                if graph is not None:
                    self._graphs[key] = graph
            if graph is not None:
                graph.replay()  # on torch's current stream, after what is queued there
                return graph.raw_cuda_graph_exec() if self.driver == "cuda" and _RAW_EXEC else 0, ws
            if len(self._seen) > 1024:  # a bound for callers whose memory moves every call
                self._seen.clear()
            self._seen[key] = None
        self.launcher(ptrs, stream, captured=capturing)
        return 0, None if capturing else ws


# -- the entry point -------------------------------------------------------------------------------
def _host_aligned(t: torch.Tensor) -> torch.Tensor:
    """A CPU tensor as IREE's local device can import it: 64-byte aligned (else one host-side copy)."""
    if t.device.type == "cpu" and t.data_ptr() % 64:
        return t.clone(memory_format=torch.contiguous_format)  # dense in the permuted order already
    return t


def conv_weight(
    input: torch.Tensor,
    weight_size: Any,
    grad_output: torch.Tensor,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
    accumulate_into: torch.Tensor | None = None,
) -> torch.Tensor:
    """dW of a grouped 1-, 2- or 3-d convolution, as ``torch.nn.grad.conv{N}d_weight`` computes it.

    Args:
        input: x, ``(N, C, *spatial)``, contiguous or channels-last, float16/bfloat16/float32, on a
            CUDA or ROCm GPU or the CPU.
        weight_size: the weight's shape ``(K, C/groups, *filter)``.
        grad_output: dy, ``(N, K, *out)``, same dtype, device and memory format as ``input``.
        stride, padding, dilation: ints or tuples (``padding`` also ``"valid"`` or ``"same"``).
        groups: the number of groups.
        accumulate_into: a gradient to add dW to, in place (``accumulate_into += dW``, fused in the
            kernel's write): shape ``weight_size``, the input's dtype, device and memory format.

    Returns:
        dW of shape ``weight_size`` and the input's dtype, on the input's device; channels-last where
        the input is. With ``accumulate_into``, that tensor, updated.

    Raises:
        TypeError / ValueError: naming the argument (dtype, device, shape, memory format).
        RuntimeError: no kernel for the problem (see :func:`artifact_dir`).
    """
    memo = problem_memo(input, weight_size, grad_output, stride, padding, dilation, groups, accumulate_into is not None)
    problem, fmt, order, kernel, out_layout = memo.problem, memo.fmt, memo.order, memo.kernel, memo.out_layout
    if type(kernel) is DirectCall:  # on torch's stream: no imports, no waits
        if accumulate_into is not None:
            kernel(input, grad_output, _accumulator(accumulate_into, input, out_layout[0], order, fmt))
            return accumulate_into
        out = torch.empty_strided(*out_layout, dtype=input.dtype, device=input.device)
        kernel(input, grad_output, out)
        return out
    weight_size = out_layout[0]
    # dW in the input's format: (K, C, *f) for layout 4 (GKCYX), (K, *f, C) for layout 2 (GKYXC)
    if accumulate_into is not None:
        out_dense = _accumulator(accumulate_into, input, weight_size, order, fmt)
    else:
        out_dense = torch.empty([weight_size[i] for i in order], dtype=input.dtype, device=input.device)
    # detach: a view of the same memory (DLPack refuses tensors that require grad)
    x = _host_aligned(input.detach().permute(order))
    dy = _host_aligned(grad_output.detach().permute(order))
    args = kernel.prepare(
        kernel.import_dlpack(x, memo.x_shape, problem.dtype, "input"),
        kernel.import_dlpack(dy, memo.dy_shape, problem.dtype, "grad_output"),
        kernel.import_dlpack(
            out_dense, memo.dw_shape, problem.dw_dtype, "output" if accumulate_into is None else "accumulate_into"
        ),
    )
    if input.device.type == "cuda":
        # IREE's CUDA driver runs on its own stream: the inputs must be written before it reads them.
        torch.cuda.current_stream(input.device).synchronize()
    kernel.invoke(args)
    if accumulate_into is not None:
        return accumulate_into
    inverse = [order.index(i) for i in range(len(order))]
    return out_dense.permute(inverse)


def _accumulator(
    grad: Any, input: torch.Tensor, weight_size: tuple[int, ...], order: tuple[int, ...], fmt: str
) -> torch.Tensor:
    """``accumulate_into`` checked and seen in the kernel's dW order (a view: no copy).

    Raises:
        TypeError / ValueError: naming ``accumulate_into``: not a tensor, dtype, device, shape, format.
    """
    if not isinstance(grad, torch.Tensor):
        raise TypeError(f"accumulate_into: expected a torch.Tensor, got {type(grad).__name__}")
    if grad.dtype != input.dtype:
        raise TypeError(f"accumulate_into: expected dtype {input.dtype} (the input's), got {grad.dtype}")
    if grad.device != input.device:
        raise ValueError(f"accumulate_into: on {grad.device}, but input is on {input.device}")
    if tuple(grad.shape) != weight_size:
        raise ValueError(f"accumulate_into: expected shape {weight_size} (weight_size), got {tuple(grad.shape)}")
    if grad.requires_grad:
        raise ValueError("accumulate_into: a tensor that requires grad cannot be written in place")
    dense = grad.permute(order)
    if not dense.is_contiguous():
        raise ValueError(f"accumulate_into: expected the input's memory format ({fmt}), got strides {grad.stride()}")
    return dense


def conv1d_weight(input, weight_size, grad_output, stride=1, padding=0, dilation=1, groups=1, accumulate_into=None):  # noqa: ANN001, ANN201, E501
    """:func:`conv_weight` for 1-d convolutions (``torch.nn.grad.conv1d_weight``)."""
    _rank("input", input, 1)
    return conv_weight(input, weight_size, grad_output, stride, padding, dilation, groups, accumulate_into)


def conv2d_weight(input, weight_size, grad_output, stride=1, padding=0, dilation=1, groups=1, accumulate_into=None):  # noqa: ANN001, ANN201, E501
    """:func:`conv_weight` for 2-d convolutions (``torch.nn.grad.conv2d_weight``)."""
    _rank("input", input, 2)
    return conv_weight(input, weight_size, grad_output, stride, padding, dilation, groups, accumulate_into)


def conv3d_weight(input, weight_size, grad_output, stride=1, padding=0, dilation=1, groups=1, accumulate_into=None):  # noqa: ANN001, ANN201, E501
    """:func:`conv_weight` for 3-d convolutions (``torch.nn.grad.conv3d_weight``)."""
    _rank("input", input, 3)
    return conv_weight(input, weight_size, grad_output, stride, padding, dilation, groups, accumulate_into)


def _rank(name: str, t: Any, rank: int) -> None:
    if isinstance(t, torch.Tensor) and t.dim() != rank + 2:
        raise ValueError(f"{name}: a {rank}-d convolution takes {rank + 2} dimensions, got shape {tuple(t.shape)}")


# -- autograd --------------------------------------------------------------------------------------
class ConvWeightGrad(torch.autograd.Function):
    """``F.conv{N}d`` whose backward computes dW with our kernel; dx and the bias gradient stay torch's."""

    @staticmethod
    def forward(ctx, input, weight, bias, stride, padding, dilation, groups):  # noqa: ANN001, ANN205
        rank = input.dim() - 2
        conv = (torch.nn.functional.conv1d, torch.nn.functional.conv2d, torch.nn.functional.conv3d)[rank - 1]
        ctx.save_for_backward(input, weight)
        ctx.conf = (stride, padding, dilation, groups, bias is not None)
        return conv(input, weight, bias, stride, padding, dilation, groups)

    @staticmethod
    def backward(ctx, grad_output):  # noqa: ANN001, ANN205
        input, weight = ctx.saved_tensors
        stride, padding, dilation, groups, has_bias = ctx.conf
        rank = input.dim() - 2
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        grad_x = grad_b = grad_w = None
        if need_w and input.dtype not in DTYPES:  # e.g. a float64 model: torch's dW, said once per dtype
            warn_once(f"convert_model: {input.dtype} is not a type of ours (float16, bfloat16, float32): "
                       "the weight gradient is torch's")  # fmt: skip
            need_w = False
            grad_w = _torch_weight_grad(input, weight, grad_output, ctx.conf)
        if need_w and not memory_formats(input):  # a strided view torch's conv took: our kernel reads a dense copy
            warn_once(f"convert_model: input of shape {tuple(input.shape)} and strides {input.stride()} is neither "
                       "contiguous nor channels-last: the weight gradient reads a contiguous copy")  # fmt: skip
            input = input.contiguous()
        if need_x or (need_b and has_bias):
            low, high = torch_pads(padding, rank, tuple(weight.shape[2:]), _tuple("dilation", dilation, rank))
            if low != high:
                raise ValueError(f"padding: {padding!r} pads unevenly; torch's input gradient takes even pads")
            grad_x, _, grad_b = torch.ops.aten.convolution_backward(
                grad_output, input, weight, [weight.shape[0]] if has_bias else None,
                _tuple("stride", stride, rank), list(low), _tuple("dilation", dilation, rank),
                False, [0] * rank, groups, [need_x, False, bool(need_b and has_bias)],
            )  # fmt: skip
        if need_w:
            if not grad_output.permute(dense_order(memory_formats(input)[0], input.dim())).is_contiguous():
                # cuDNN may hand a differently laid out gradient; our kernel reads the input's format
                grad_output = grad_output.contiguous(memory_format=torch_memory_format(input))
            low, high = torch_pads(padding, rank, tuple(weight.shape[2:]), _tuple("dilation", dilation, rank, 1))
            # the registered op where torch.compile traces (no graph break); eager calls skip its ~40 µs of
            # custom-op dispatch (docs/torch.md#the-switch)
            if low == high and torch.compiler.is_compiling():
                grad_w = torch.ops.convbw.conv_weight(
                    input, grad_output, list(weight.shape), list(_tuple("stride", stride, rank, 1)), list(low),
                    list(_tuple("dilation", dilation, rank, 1)), groups,
                )  # fmt: skip
            else:
                grad_w = conv_weight(input, weight.shape, grad_output, stride, padding, dilation, groups)
        return grad_x, grad_w, grad_b, None, None, None, None


_WARNED: set[str] = set()


def warn_once(message: str) -> None:
    """A warning the backward pass gives once per process and message, not once per step."""
    if message not in _WARNED:
        _WARNED.add(message)
        warnings.warn(message, stacklevel=3)


def _torch_weight_grad(input: torch.Tensor, weight: torch.Tensor, grad_output: torch.Tensor, conf: tuple) -> Any:
    """torch's own dW (``aten.convolution_backward``) for what our kernels do not take."""
    stride, padding, dilation, groups, _ = conf
    rank = input.dim() - 2
    low, _high = torch_pads(padding, rank, tuple(weight.shape[2:]), _tuple("dilation", dilation, rank))
    return torch.ops.aten.convolution_backward(
        grad_output, input, weight, None, _tuple("stride", stride, rank), list(low),
        _tuple("dilation", dilation, rank), False, [0] * rank, groups, [False, True, False],
    )[1]  # fmt: skip


def torch_memory_format(t: torch.Tensor) -> torch.memory_format:
    if memory_formats(t)[0] == "contiguous" or t.dim() == 3:
        return torch.contiguous_format
    return torch.channels_last if t.dim() == 4 else torch.channels_last_3d


def conv_forward(self, input, weight, bias):  # noqa: ANN001, ANN202
    """``ConvNd._conv_forward`` through :class:`ConvWeightGrad` (zero padding only)."""
    return ConvWeightGrad.apply(input, weight, bias, self.stride, self.padding, self.dilation, self.groups)


def convert_model(model: torch.nn.Module) -> list[str]:
    """Switch ``model``'s ``Conv{1,2,3}d`` layers (in place) so their weight gradient is ours.

    Parameters and state stay as they are; only the layer's forward is routed through
    :class:`ConvWeightGrad`. Layers we cannot take (padding modes other than zeros, transposed
    convolutions, uneven ``"same"`` pads) are left alone with a warning naming them.

    Returns:
        The names of the layers switched.
    """
    done = []
    for name, layer in model.named_modules():
        if not isinstance(layer, torch.nn.Conv1d | torch.nn.Conv2d | torch.nn.Conv3d):
            continue
        rank = layer.weight.dim() - 2
        low, high = torch_pads(layer.padding, rank, tuple(layer.kernel_size), tuple(layer.dilation))
        why = None
        if layer.padding_mode != "zeros":
            why = f"padding_mode={layer.padding_mode!r}"
        elif low != high:
            why = f"padding={layer.padding!r} pads unevenly"
        if why:
            warnings.warn(f"convert_model: {name or type(layer).__name__} left to torch: {why}", stacklevel=2)
            continue
        layer._conv_forward = types.MethodType(conv_forward, layer)
        done.append(name)
    return done
