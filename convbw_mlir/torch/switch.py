"""The torch custom op ``convbw::conv_weight`` and the switch that routes torch's own weight gradients to us.

- ``torch.ops.convbw.conv_weight(input, grad_output, weight_size, stride, padding, dilation, groups)``: a
  registered custom op (``torch.library.custom_op``) with a fake implementation, so ``torch.compile`` traces
  it without a graph break; :class:`convbw_mlir.torch.ConvWeightGrad` (``convert_model``) calls it while
  torch.compile traces (eager calls skip its dispatch).
- :func:`enable` / :func:`disable` / :func:`enabled`: a ``torch.library`` override of
  ``aten::convolution_backward`` for the CPU and CUDA dispatch keys that computes dW (``output_mask[1]``)
  with our kernel where the problem qualifies and hands everything else (dx, the bias gradient, problems
  we do not take) to torch's own kernel, fetched with ``torch.library.get_kernel`` before the override. On a GPU
  (``benchmark=None``, the default) dW is ours only where our kernel, with every kernel it launches, is faster than
  torch's for that layer: weighed once on first use and remembered across processes
  (:mod:`convbw_mlir.dispatch.verdicts`; docs/torch.md#never-slower-per-layer-issue-37-item-4).

Why an override and not a ``TorchDispatchMode``, and what a call costs: docs/torch.md#the-switch.
"""

from __future__ import annotations

import contextlib
import math
import platform
import threading
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from convbw_mlir.torch import entry as ct

__all__ = ["Decision", "decisions", "disable", "enable", "enabled", "is_enabled", "plan_is_deterministic", "stats"]


# -- the custom op -----------------------------------------------------------------------------------
def _out_strides(weight_size: list[int], fmt: str) -> list[int]:
    """dW's strides dense in memory format ``fmt`` (the input's): what the kernel writes, no reordering."""
    order = ct.dense_order(fmt, len(weight_size))
    dense = [weight_size[i] for i in order]
    dense_strides = [math.prod(dense[j + 1 :]) for j in range(len(dense))]
    return [dense_strides[order.index(i)] for i in range(len(order))]


def _kernel_inputs(x: torch.Tensor, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x and dy as the kernel reads them: x dense (else a contiguous copy), dy in x's memory format (else a
    copy: inductor, cuDNN and views choose layouts of their own). The fake implementation takes the same."""
    if not ct.memory_formats(x):
        x = x.contiguous()
    fmt = _copy_format(dy, x)
    return x, (dy if fmt is None else dy.contiguous(memory_format=fmt))


# needs_exact_strides: inductor hands the op tensors with the strides its fake implementation saw (it may
# otherwise pick other layouts, e.g. channels-last for convolutions), so dW's strides are the ones it planned for
_TAGS = tuple(getattr(torch.Tag, t) for t in ("needs_exact_strides",) if hasattr(torch.Tag, t))


@torch.library.custom_op("convbw::conv_weight", mutates_args=(), tags=_TAGS)
def conv_weight_op(
    input: torch.Tensor,
    grad_output: torch.Tensor,
    weight_size: list[int],
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    groups: int,
) -> torch.Tensor:
    """dW of a convolution (:func:`convbw_mlir.torch.conv_weight` with even pads) as a torch op; any strides."""
    x, dy = _kernel_inputs(input, grad_output)
    return ct.conv_weight(x, weight_size, dy, stride, padding, dilation, groups)


@conv_weight_op.register_fake
def _conv_weight_fake(input, grad_output, weight_size, stride, padding, dilation, groups):  # noqa: ANN001, ANN202
    x, _ = _kernel_inputs(input, grad_output)
    return input.new_empty_strided(list(weight_size), _out_strides(list(weight_size), ct.memory_formats(x)[0]))


# -- which plans are deterministic --------------------------------------------------------------------
def plan_is_deterministic(plan: Any, flags: Iterable[str] = ()) -> bool:
    """Whether a kernel of ``plan``, compiled with IREE ``flags``, gives bit-identical dW run after run
    (what ``torch.use_deterministic_algorithms(True)`` asks).

    The plan says (``plan.deterministic``: :func:`convbw_mlir.plan.plan_is_deterministic`, true of every plan
    of ours: all sum in a fixed order); IREE's opt-in split reduction flag is not trusted, nor a kernel whose
    plan is unknown (an artifact saved before plans existed).
    """
    if plan is None or plan.deterministic is False:
        return False
    return not any("split-reduction" in f for f in flags)


# -- the switch ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Config:
    min_flops: int
    dtypes: frozenset
    layers: Callable[[Any], bool] | None
    benchmark: bool | None = None  # None: on for the device types of _BENCHMARK_DEVICES


# calls timed per side when ``enable(benchmark=True)`` weighs our dW against torch's (after two warm-up calls each)
BENCHMARK_CALLS = 10
# where enable()'s default (benchmark=None) weighs: GPUs (ROCm's torch uses the cuda type too); on the CPU, where the
# switch is for tests and small runs, each timed call of a real layer costs milliseconds to seconds
_BENCHMARK_DEVICES = frozenset({"cuda"})


@dataclass(frozen=True, slots=True)
class Decision:
    """What the override does with the weight gradient of one argument signature (made once, remembered)."""

    ours: bool
    why: str = ""  # torch's: the reason stats() counts it under ("torch: <why>")
    copy_x: bool = False  # x is dense in neither format: our kernel reads a contiguous copy
    dy_format: torch.memory_format | None = None  # dy copied into x's format first, where it is not in it
    dw_strides: tuple[int, ...] | None = None  # dW copied into torch's strides, where ours (x's format) differ
    direct: tuple[Any, tuple] | None = None  # (kernel, dW's (size, strides)): launched straight on x and dy


_UNALIGNED = Decision(False, "data not 16-byte aligned")  # the direct launch's pointers are aligned


@dataclass(frozen=True)
class _Active:
    """The settings of one ``enable()`` and the decisions made under them, replaced whole (never cleared in
    place): a backward running in another thread while ``enable()`` changes the settings stores its decision in
    the record it read, never in the new one. decisions: argument signature -> decision (the format checks
    cost ~13 µs each, a dictionary lookup ~0.1)."""

    config: _Config
    decisions: dict[tuple, Decision]
    native: bool = False  # the C++ hot path takes the calls it has decided (convbw_mlir/torch/native)


# lib: the override, registered by the first enable() and never removed (a kernel deregistered while another
# thread dispatches through it is freed under that thread: a torch internal assert, issue 42); active: None
# while off (the override is then a pass-through to torch's kernel)
_STATE: dict[str, Any] = {"lib": None, "active": None, "kernels": {}}
_SEEN = threading.local()  # .seen: (settings, decision, conf) of the call just decided: the C++ table's entry
_STATS: Counter = Counter()
_SWITCH_LOCK = threading.Lock()
_KEYS = ("CPU", "CUDA")  # ROCm builds of torch use the CUDA key too; other devices are not overridden


_CONV = torch.nn.modules.conv._ConvNd
# what enable(dtypes=...) takes: torch's dtypes, their names as torch spells them, and ours
_DTYPE_NAMES = {name: d for d, ours in ct.DTYPES.items() for name in (str(d).removeprefix("torch."), ours)}


def _dtype_set(dtypes: Any) -> frozenset:
    """``dtypes`` (one dtype or name, or several) as a set of torch dtypes.

    Raises:
        TypeError: naming ``dtypes`` and the value that is none of float16, bfloat16, float32.
    """
    values = [dtypes] if isinstance(dtypes, str | torch.dtype) else dtypes
    try:
        values = list(values)
    except TypeError:
        raise TypeError(f"dtypes: expected a dtype or several of float16, bfloat16, float32, got {dtypes!r}") from None
    if not values:
        raise TypeError("dtypes: expected a non-empty subset of float16, bfloat16, float32, got none")
    out = set()
    for v in values:
        d = _DTYPE_NAMES.get(v.removeprefix("torch.")) if isinstance(v, str) else v
        if not isinstance(d, torch.dtype) or d not in ct.DTYPES:
            raise TypeError(f"dtypes: expected a non-empty subset of float16, bfloat16, float32, got {v!r}")
        out.add(d)
    return frozenset(out)


def _layer_filter(layers: Any) -> Callable[[Any], bool] | None:
    """``layers`` as a predicate on (weight shape, stride, padding, dilation, groups).

    Raises:
        TypeError: naming ``layers`` and what it got.
    """
    if isinstance(layers, torch.nn.Module):  # before callable(): a module is callable too
        layers = [layers]
    elif layers is None or callable(layers):
        return layers
    try:
        mods = list(layers)
    except TypeError:
        raise TypeError(f"layers: expected None, a callable or convolution modules, got {layers!r}") from None
    if not mods:
        raise ValueError("layers: expected convolution modules (or modules holding them), got none")
    signatures = set()
    for m in mods:
        if isinstance(m, torch.nn.Module) and not isinstance(m, _CONV):
            # a module holding no convolution would send every weight gradient to torch without a word
            held = [c for c in m.modules() if isinstance(c, _CONV) and not c.transposed]
            if not held:
                raise TypeError(f"layers: {type(m).__name__} is not a convolution and holds none")
            mods.extend(held)
            continue
        if not isinstance(m, _CONV):
            raise TypeError(f"layers: expected convolution modules, got {type(m).__name__}")
        if m.transposed:
            raise TypeError(f"layers: {type(m).__name__}: a transposed convolution's weight gradient stays torch's")
        if isinstance(m.padding, str):  # "same"/"valid": the pads aten sees
            low, _ = ct.torch_pads(m.padding, len(m.kernel_size), tuple(m.kernel_size), tuple(m.dilation))
        else:
            low = tuple(m.padding)
        signatures.add((tuple(m.weight.shape), tuple(m.stride), low, tuple(m.dilation), m.groups))
    return lambda sig: sig in signatures


def enable(
    min_flops: int = 0,
    dtypes: Iterable[torch.dtype] = (torch.float16, torch.bfloat16, torch.float32),
    layers: Any = None,
    benchmark: bool | None = None,
    native: bool | None = None,
) -> None:
    """Route the weight gradient of every convolution torch computes to our kernels (until :func:`disable`).

    torch's ``aten::convolution_backward`` with ``output_mask[1]`` set is overridden on the CPU and CUDA
    keys: dW comes from our kernel where the problem qualifies, dx and the bias gradient stay torch's,
    and any problem we do not take goes to torch's kernel whole. Calling it again replaces the settings.

    Args:
        min_flops: only problems of at least this many multiply-adds x 2 (smaller ones stay torch's).
        dtypes: the dtypes to take: one or several of float16, bfloat16, float32 (torch dtypes or their names,
            ``"float16"`` or ``"f16"``).
        layers: None (all), convolution modules (or modules holding some; a problem qualifies when its
            weight shape, stride, padding, dilation and groups are one of theirs), or a callable taking
            that tuple and returning whether to take it.
        benchmark: take our dW only where it, with every kernel it launches, is faster than torch's own: timed
            the first time each problem comes (as ``torch.backends.cudnn.benchmark`` picks an algorithm:
            :data:`BENCHMARK_CALLS` calls each after a warm-up, CUDA events on a GPU, the host clock on the CPU;
            never while a CUDA graph is captured) and remembered across processes in the kernel cache's folder
            (:mod:`convbw_mlir.dispatch.verdicts`, keyed by problem, target, device name, torch and cuDNN
            versions and our kernel's identity), so a later process decides without timing. ``stats()`` counts
            the others as ``torch: slower than torch's (benchmark)`` or ``(remembered)``. None (the default):
            on for GPUs, off on the CPU; False: ours wherever we have a kernel.
        native: the C++ hot path (docs/torch.md#the-native-hot-path): True, False, or None for
            ``$CONVBW_TORCH_NATIVE`` ("1"; default off). Built on first use; where it does not build, one
            warning and the Python path.

    Raises:
        TypeError / ValueError: naming the argument.
        RuntimeError: this torch has no ``torch.library.get_kernel`` (torch >= 2.9 needed for the switch).
    """
    if isinstance(min_flops, bool) or not isinstance(min_flops, int) or min_flops < 0:
        raise ValueError(f"min_flops: expected an int >= 0, got {min_flops!r}")
    dtypes = _dtype_set(dtypes)
    if benchmark is not None and not isinstance(benchmark, bool):
        raise TypeError(f"benchmark: expected True, False or None (on for GPUs), got {benchmark!r}")
    config = _Config(min_flops, dtypes, _layer_filter(layers), benchmark)
    if not hasattr(torch.library, "get_kernel"):
        raise RuntimeError(
            f"convbw_mlir.torch.enable needs torch >= 2.9 (torch.library.get_kernel); this is {torch.__version__}"
        )
    from convbw_mlir.torch import native as cxx

    use_native = cxx.wanted(native)
    if use_native:
        ct.native_launch_wanted()  # a bad $CONVBW_TORCH_NATIVE_LAUNCH: one error here, before anything is registered
    use_native = use_native and cxx.load() is not None  # the build (first time only) outside the lock
    with _SWITCH_LOCK:
        _register()
        if use_native:  # what the C++ side calls back into, handed over (native imports nothing of this module)
            cxx.register(_SEEN, lambda key: _STATE["kernels"][key], _our_weight_grad, _UNALIGNED.why)
        _STATE["active"] = _Active(config, {}, use_native)
        cxx.sync(_STATE["active"])


def _register() -> None:
    """The override on every key of :data:`_KEYS`, once per process (under the switch's lock)."""
    if _STATE["lib"] is not None:
        return
    op = torch.ops.aten.convolution_backward.default
    originals = {key: torch.library.get_kernel(op, key) for key in _KEYS}
    lib = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():  # torch says once that a kernel (CUDA's) is overridden: we mean it
        warnings.filterwarnings("ignore", message=".*Overriding a previously registered kernel")
        for key in _KEYS:
            _STATE["kernels"][key] = _override(originals[key])
            lib.impl("convolution_backward", _STATE["kernels"][key], key, with_keyset=True)
    _STATE["lib"] = lib


def disable() -> None:
    """Give every weight gradient back to torch's own kernel (bit for bit), from any thread.

    The override stays registered as a pass-through (the mechanism's floor a call, docs/torch.md#the-switch):
    removing a kernel while another thread's backward dispatches through it frees it under that thread.
    """
    from convbw_mlir.torch import native as cxx

    with _SWITCH_LOCK:
        _STATE["active"] = None
        cxx.sync(None)


def is_enabled() -> bool:
    return _STATE["active"] is not None


@contextlib.contextmanager
def enabled(**settings: Any) -> Iterator[None]:
    """:func:`enable` for a ``with`` block; the switch's earlier state (on with its settings, or off) after."""
    before = _STATE["active"]
    enable(**settings)
    try:
        yield
    finally:
        from convbw_mlir.torch import native as cxx

        with _SWITCH_LOCK:
            _STATE["active"] = before
            cxx.sync(before)


def stats() -> dict[str, int]:
    """Weight gradients computed since the last reset: ``{"ours": n, "torch: <why>": n, ...}``; ``stats(reset)``."""
    from convbw_mlir.torch import native as cxx

    out = Counter(_STATS)
    out.update(cxx.counts())  # the calls the C++ hot path handled without the Python switch
    return dict(out)


def decisions() -> dict[tuple, Decision]:
    """The decisions remembered under the current settings, live (a detached empty dict while off):
    bench/torch_step.py keeps them across its modes, so that no timed step decides anew."""
    active = _STATE["active"]
    return {} if active is None else active.decisions


def reset_stats() -> None:
    from convbw_mlir.torch import native as cxx

    _STATS.clear()
    cxx.reset_counts()


def _decide(go: torch.Tensor, x: torch.Tensor, w: torch.Tensor, args: tuple, config: _Config) -> Decision:
    """The :class:`Decision` for these convolution_backward arguments (memoized by the caller)."""
    stride, padding, dilation, transposed, output_padding, groups = args
    if transposed:
        return Decision(False, "transposed convolution")
    if x.dtype not in config.dtypes:
        return Decision(False, f"dtype {x.dtype}")
    if go.dtype != x.dtype or w.dtype != x.dtype:  # torch's kernel decides what these give (or refuses them)
        return Decision(False, "mixed dtypes")
    if not 3 <= x.dim() <= 5:
        return Decision(False, f"{x.dim() - 2}-d convolution")
    flops = 2 * go.numel() * w.numel() // max(w.shape[0], 1)
    if flops < config.min_flops:
        return Decision(False, "below min_flops")
    if config.layers is not None and not config.layers(
        (tuple(w.shape), tuple(stride), tuple(padding), tuple(dilation), int(groups))
    ):
        return Decision(False, "not in layers")
    if not ct.memory_formats(x):
        ct.warn_once(f"convbw_mlir.torch.enable: input of shape {tuple(x.shape)} and strides {x.stride()} is "
                      "neither contiguous nor channels-last: the weight gradient reads a contiguous copy")  # fmt: skip
    xd = _dense(x)
    try:
        memo = ct.problem_memo(
            xd, list(w.shape), _like(go, xd), list(stride), list(padding), list(dilation), int(groups)
        )
    except Exception as e:  # no kernel (compile error, no compiler): torch's, said once per problem
        ct.warn_once(f"convbw_mlir.torch.enable: weight gradient left to torch: {type(e).__name__}: {e}")
        return Decision(False, "no kernel")
    if _deterministic():
        plan, flags = _plan_of(xd, w, _like(go, xd), args)
        if not plan_is_deterministic(plan, flags):
            ct.warn_once("convbw_mlir.torch.enable: torch.use_deterministic_algorithms(True) and our kernel's "
                          "plan is not known to be deterministic: the weight gradient is torch's")  # fmt: skip
            return Decision(False, "not deterministic")
    go_format = _copy_format(go, xd)
    # a direct launch on the tensors as they come: the override calls the kernel itself, not conv_weight, whose
    # argument memo costs ~5-10 µs a call more (a training step's host time, docs/torch.md#a-training-step)
    direct = None
    if type(memo.kernel) is ct.DirectCall and xd is x and go_format is None:
        direct = (memo.kernel, memo.out_layout)
    return Decision(True, "", xd is not x, go_format, _torch_dw_strides(go, x, w, args, xd), direct)


def _torch_dw_strides(go: torch.Tensor, x: torch.Tensor, w: torch.Tensor, args: tuple, xd: torch.Tensor) -> Any:
    """The strides torch's own kernel gives dW (its meta kernel's: what torch.compile plans with), where ours
    (dense in x's format) differ in a dimension longer than 1; else None."""
    meta = [t.to("meta") for t in (go, x, w)]
    want = aten_convolution_backward(*meta, None, *args, [False, True, False])[1].stride()
    ours = _out_strides(list(w.shape), ct.memory_formats(xd)[0])
    same = all(a == b or size == 1 for a, b, size in zip(want, ours, w.shape))
    return None if same else tuple(want)


aten_convolution_backward = torch.ops.aten.convolution_backward.default


def _dense(x: torch.Tensor) -> torch.Tensor:
    return x if ct.memory_formats(x) else x.contiguous()


def _like(go: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """dy in x's memory format (cuDNN and views may hand another): our kernel reads both in one format."""
    fmt = _copy_format(go, x)
    return go if fmt is None else go.contiguous(memory_format=fmt)


def _copy_format(go: torch.Tensor, x: torch.Tensor) -> torch.memory_format | None:
    """The memory format dy must be copied into to match dense ``x``; None where it does already."""
    return None if ct.memory_formats(x)[0] in ct.memory_formats(go) else ct.torch_memory_format(x)


def _plan_of(x: torch.Tensor, w: torch.Tensor, go: torch.Tensor, args: tuple) -> Any:
    stride, padding, dilation, _, _, groups = args
    problem = ct.problem_memo(x, list(w.shape), go, list(stride), list(padding), list(dilation), int(groups)).problem
    return ct.plan_of(problem, x.device)


_deterministic = torch._C._get_deterministic_algorithms  # torch.are_deterministic_algorithms_enabled's own call
_profiling = torch._C._autograd._profiler_enabled


def _weight_grad(direct, x, w, go, stride, padding, dilation, groups):  # noqa: ANN001, ANN202
    """Our dW: the direct kernel called straight on x and dy where the decision holds it, else the entry point."""
    if direct is None:
        return ct.conv_weight(x, w.shape, go, stride, padding, dilation, groups)
    kernel, (size, strides) = direct
    dw = torch.empty_strided(size, strides, dtype=x.dtype, device=x.device)
    kernel(x, go, dw)
    return dw


def _override(original: Any) -> Callable:
    """The ``convolution_backward`` kernel of one dispatch key: ours for dW where we take it, ``original``'s else."""

    @torch.compiler.disable  # called by the dispatcher under compiled code: never traced
    def convolution_backward(keyset, *args):  # noqa: ANN001, ANN002, ANN202
        go, x, w, _, stride, padding, dilation, transposed, output_padding, groups, mask = args
        active = _STATE["active"]  # read once: another thread may switch it meanwhile
        if not mask[1] or active is None:
            return original.call_boxed(keyset, *args)
        config, decisions = active.config, active.decisions
        conf = (stride, padding, dilation, transposed, output_padding, groups)
        # everything the decision depends on: dW's strides follow the weight's too (torch's meta kernel)
        key = (x.shape, x.stride(), go.shape, go.stride(), x.dtype, go.dtype, w.dtype, x.device, w.shape, w.stride(),
               tuple(stride), tuple(padding), tuple(dilation), transposed, tuple(output_padding), groups,
               _deterministic())  # fmt: skip
        decision = decisions.get(key)
        aligned = not (x.is_cuda and (x.data_ptr() | go.data_ptr()) & 15)
        if decision is None:
            if len(decisions) > 4096:  # a bound for programs that see endless shapes
                decisions.clear()
            decision = _decide(go, x, w, conf, config)
            final = True
            if decision.ours and _benchmarks(config, x):
                theirs = lambda: original.call_boxed(keyset, *args[:-1], [False, True, False])  # noqa: E731
                decision, final = _weighed(decision, go, x, w, conf, aligned, theirs)
            if final:  # an unweighed decision (a capture, unaligned data) is made again on the next call
                decisions[key] = decision
        # what the C++ hot path remembers for this key (native/__init__.py): only a decision the memo keeps
        _SEEN.seen = (active, decision, conf) if decisions.get(key) is decision else None
        if decision.ours and not aligned:
            decision = _UNALIGNED
        if not decision.ours:
            _STATS[f"torch: {decision.why}"] += 1
            return original.call_boxed(keyset, *args)
        dx = db = None
        if mask[0] or mask[2]:  # torch's kernel for the rest, asked not to compute dW
            dx, _, db = original.call_boxed(keyset, *args[:-1], [mask[0], False, mask[2]])
        if _profiling():  # a named range, so torch.profiler tells our dW from torch's (examples/torch_enable.py)
            with torch.profiler.record_function("convbw::conv_weight"):
                dw = _our_weight_grad(decision, x, w, go, conf)
        else:
            dw = _our_weight_grad(decision, x, w, go, conf)
        _STATS["ours"] += 1
        return dx, dw, db

    return convolution_backward


def _our_weight_grad(decision: Decision, x: torch.Tensor, w: torch.Tensor, go: torch.Tensor, conf: tuple) -> Any:
    """Our dW under ``decision`` ("ours"): x and dy copied where it says, dW in torch's strides where they differ."""
    stride, padding, dilation, _, _, groups = conf
    if decision.copy_x:
        x = x.contiguous()
    if decision.dy_format is not None:
        go = go.contiguous(memory_format=decision.dy_format)
    dw = _weight_grad(decision.direct, x, w, go, stride, padding, dilation, groups)
    if decision.dw_strides is not None:  # torch's layout for dW (e.g. channels-last weights, contiguous x): a copy
        dw = torch.empty_strided(dw.shape, decision.dw_strides, dtype=dw.dtype, device=dw.device).copy_(dw)
    return dw


def _capturing(x: torch.Tensor) -> bool:
    """Whether a CUDA graph is being captured on x's device's current stream (no timing then)."""
    return x.is_cuda and torch.cuda.is_current_stream_capturing()


def _time(call: Callable[[], Any], device: torch.device) -> float:
    """Seconds of :data:`BENCHMARK_CALLS` calls of ``call`` after two warm-up ones (compiles, CUDA graphs,
    cuDNN's own algorithm search): on a GPU the calls' GPU time by CUDA events, queued behind a ~2 ms sleep
    kernel so the host's launch time stays out (the override's host cost is paid whichever computes dW)."""
    call(), call()
    if device.type != "cuda":
        start = time.perf_counter()
        for _ in range(BENCHMARK_CALLS):
            call()
        return time.perf_counter() - start
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(4_000_000)  # clock cycles: the host queues the timed calls meanwhile
    begin.record()
    for _ in range(BENCHMARK_CALLS):
        call()
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) / 1e3


def _benchmarked(
    decision: Decision, ours: Callable[[], Any], theirs: Callable[[], Any], device: torch.device
) -> tuple[Decision, float, float]:
    """``decision`` where our dW takes no longer than torch's own (:func:`_time`), else torch's; and the two times."""
    ours_s, theirs_s = _time(ours, device), _time(theirs, device)
    if ours_s <= theirs_s:
        return decision, ours_s, theirs_s
    return Decision(False, "slower than torch's (benchmark)"), ours_s, theirs_s


# -- never slower per layer: weighed once, remembered across processes ---------------------------------
def _benchmarks(config: _Config, x: torch.Tensor) -> bool:
    """Whether the settings weigh our dW against torch's on x's device."""
    return config.benchmark if config.benchmark is not None else x.device.type in _BENCHMARK_DEVICES


def _weighed(
    decision: Decision, go: torch.Tensor, x: torch.Tensor, w: torch.Tensor, conf: tuple, aligned: bool,
    theirs: Callable[[], Any],
) -> tuple[Decision, bool]:  # fmt: skip
    """``decision`` (ours) or torch's, from the verdict remembered for this layer, else timed now and remembered;
    and whether that is final (False: not timed, where a CUDA graph is being captured or the data is unaligned)."""
    from convbw_mlir.dispatch.verdicts import Verdict, VerdictStore

    try:
        key = _verdict_key(decision, go, x, w, conf)
        store = VerdictStore() if key is not None else None  # the folder as $CONVBW_CACHE_DIR says now
    except Exception as e:  # e.g. a bad $CONVBW_CACHE_MAX_BYTES: weighed all the same, for this process only
        ct.warn_once(f"convbw_mlir.torch.enable: switch verdicts not remembered: {type(e).__name__}: {e}")
        store = None
    if store is not None:
        verdict = store.get(key)
        if verdict is not None:
            return (decision if verdict.ours else Decision(False, "slower than torch's (remembered)")), True
    if not aligned or _capturing(x):
        return decision, False
    weighed, ours_s, torch_s = _benchmarked(decision, lambda: _our_weight_grad(decision, x, w, go, conf), theirs,
                                            x.device)  # fmt: skip
    if store is not None:
        store.put(key, Verdict(weighed.ours, ours_s, torch_s))
    return weighed, True


def _device_name(device: torch.device) -> str:
    """The device's model (what its times hold for): the GPU's name, or the CPU's."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu {platform.processor() or platform.machine()}"


def _verdict_key(decision: Decision, go: torch.Tensor, x: torch.Tensor, w: torch.Tensor, conf: tuple) -> Any:
    """Everything the two times depend on, as the verdict store keys them: the problem and where it runs, torch's
    and cuDNN's versions and settings, our kernel (its identity) and the copies around it; None where our kernel's
    identity is unknown (nothing is remembered then)."""
    stride, padding, dilation, _, _, groups = conf
    xd = _dense(x)
    memo = ct.problem_memo(xd, list(w.shape), _like(go, xd), list(stride), list(padding), list(dilation), int(groups))
    identity = ct.kernel_identity(memo.problem, x.device)
    if identity is None:
        return None
    cudnn = torch.backends.cudnn
    return {
        "problem": memo.problem.to_dict(),
        "target": ct.target_for(x.device, memo.problem)[0],
        "device": _device_name(x.device),
        "torch": str(torch.__version__),
        "cudnn": str(cudnn.version() if cudnn.is_available() else None),
        "kernel": identity,
        # ours: the copies of x, dy and dW around the kernel; torch's: the weight's format and its algorithm settings
        "copies": [decision.copy_x, str(decision.dy_format), list(decision.dw_strides or ())],
        "weight_format": (ct.memory_formats(w) or ["strided"])[0],
        "deterministic": bool(_deterministic()),
        "cudnn_benchmark": bool(cudnn.benchmark),
        "tf32": bool(cudnn.allow_tf32) if x.dtype == torch.float32 else None,
        "calls": BENCHMARK_CALLS,
    }
