"""The switch's C++ hot path: ``enable(native=True)`` (or ``CONVBW_TORCH_NATIVE=1``) registers a C++ kernel for
``aten::convolution_backward`` (``switch_native.cpp``) over the Python one, so that a call whose signature the
switch has decided runs torch's part without entering Python (docs/torch.md#the-native-hot-path).

The source is compiled on first use with ``torch.utils.cpp_extension.load`` (the C++ compiler and ninja torch
needs for extensions; ATen/c10 headers only, no CUDA's) into ``$CONVBW_TORCH_NATIVE_DIR``, else the kernel cache's
``native/`` folder, one build per source, torch and Python version; where it does not build the switch warns once
and keeps the Python path. A miss (a signature the table does not hold) is handed to the Python switch whole
(:func:`_miss`): it decides as it always does, and what it decided is remembered in the C++ table.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
import threading
import warnings
from pathlib import Path
from typing import Any

import torch

__all__ = ["DIR_ENV", "ENV", "SOURCE", "build_dir", "counts", "graph_launches", "load", "loaded", "map_slots",
           "plain_launches", "register", "reset_counts", "sync", "table_size", "wanted"]  # fmt: skip
ENV = "CONVBW_TORCH_NATIVE"  # "1": enable() takes the C++ path where native=None; "0" or unset: the Python path
DIR_ENV = "CONVBW_TORCH_NATIVE_DIR"  # where the extension is built (else <kernel cache>/native)
SOURCE = Path(__file__).with_name("switch_native.cpp")

# the C++ side's modes (switch_native.cpp: Mode)
OFF, TABLE, PYTHON = 0, 1, 2
# the C++ counters: 0 ours, 1 unaligned, then the reasons the Python switch gave, in the order first seen
_REASONS = ["ours", "torch: data not 16-byte aligned"]  # [1]: the switch's own words, given by register()
_REASON_INDEX = {why: i for i, why in enumerate(_REASONS)}
# the Python switch's pieces this module calls, handed over by register() (switch imports this module: no import back)
_SWITCH: dict[str, Any] = {}

_STATE: dict[str, Any] = {"module": None, "tried": False, "settings": {}, "next_id": 0}
_MAX_SETTINGS = 64
_LOCK = threading.Lock()
_KEYSETS = {
    "CPU": torch._C.DispatchKeySet(torch._C.DispatchKey.CPU),
    "CUDA": torch._C.DispatchKeySet(torch._C.DispatchKey.CUDA),
}


def wanted(native: Any) -> bool:
    """What ``enable(native=...)`` asks: True/False as given, None from ``$CONVBW_TORCH_NATIVE``.

    Raises:
        TypeError: ``native`` not None/True/False, or the variable not "0"/"1", naming it and the value.
    """
    if native is None:
        value = os.environ.get(ENV, "0").strip()
        if value not in ("0", "1", ""):
            raise TypeError(f"{ENV}: expected 0 or 1, got {value!r}")
        return value == "1"
    if not isinstance(native, bool):
        raise TypeError(f"native: expected None, True or False, got {native!r}")
    return native


def build_dir() -> Path:
    """The folder the extension is built in: one per source, torch and Python version (never shared by two)."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    tag = f"torch{torch.__version__}-py{sys.version_info[0]}{sys.version_info[1]}-{digest}".replace("+", "_")
    env = os.environ.get(DIR_ENV)
    if env:
        return Path(env).expanduser() / tag
    from convbw_mlir.dispatch.cache import KernelCache

    return KernelCache().native_dir() / tag


def load() -> Any:
    """The built extension (compiled the first time: ~20-40 s), or None with one warning where it does not build."""
    with _LOCK:
        if _STATE["tried"]:
            return _STATE["module"]
        _STATE["tried"] = True
        try:
            from torch.utils import cpp_extension

            where = build_dir()
            where.mkdir(parents=True, exist_ok=True)
            name = "convbw_native_" + where.name.rsplit("-", 1)[1]
            _STATE["module"] = cpp_extension.load(
                name, [str(SOURCE)], build_directory=str(where), extra_cflags=["-O2"], verbose=False
            )
        except Exception as e:  # no compiler, no ninja, headers of another torch: the Python path works
            warnings.warn(
                f"convbw_mlir.torch.enable(native=True): the C++ hot path did not build ({type(e).__name__}: "
                f"{_cause(str(e))}); the weight gradients take the Python path",
                stacklevel=3,
            )
        return _STATE["module"]


def _cause(message: str) -> str:
    """The telling line of a failed build's output (the compiler's error, a missing program), else its last."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()] or [repr(message)]
    telling = [line for line in lines if any(k in line for k in ("error:", "not found", "No such file", "required"))]
    return (telling or lines)[-1 if not telling else 0][:300]


def loaded() -> Any:
    """The extension where an earlier :func:`load` built it (its kernel may be registered), else None."""
    return _STATE["module"]


def sync(active: Any) -> None:
    """The C++ kernel's state after the switch's changed (under the switch's lock): off where ``active`` is None,
    else the table under these settings' id or, where they are not native, every call to the Python switch (the
    C++ kernel, once registered, stays: as the Python one does)."""
    module = _STATE["module"]
    if module is None:
        return
    if active is None:
        module.set_state(OFF, -1, _miss)
    else:
        module.set_state(TABLE if active.native else PYTHON, _settings_id(active), _miss)


def _settings_id(active: Any) -> int:
    """The number of one ``enable()``'s record in the C++ keys: its decisions are its own, as the Python memo
    is (a new ``enable()`` decides anew: kernels may have come or gone since), and come back with the record
    (``enabled()`` restoring it); numbers are never reused. Records are held, so their ids stay theirs."""
    with _LOCK:
        ids = _STATE["settings"]
        if id(active) not in ids:
            if len(ids) >= _MAX_SETTINGS:  # the oldest records' decisions go: start over
                ids.clear()
                _STATE["module"].clear()
            ids[id(active)] = (active, _STATE["next_id"])
            _STATE["next_id"] += 1
        return ids[id(active)][1]


def register(seen: threading.local, kernel: Any, weight_grad: Any, unaligned: str) -> None:
    """The C++ kernel over the Python one on the CPU and CUDA keys, once per process (never removed).

    Args:
        seen: the switch's thread-local whose ``.seen`` is the decision of the call just made.
        kernel: the switch's Python kernel of a dispatch key ("CPU", "CUDA").
        weight_grad: the switch's dW for a decision (``switch._our_weight_grad``).
        unaligned: why the switch gives torch a call on unaligned data (the counter's name).
    """
    _SWITCH.update(seen=seen, kernel=kernel, weight_grad=weight_grad)
    _REASONS[1] = f"torch: {unaligned}"
    _REASON_INDEX.clear()
    _REASON_INDEX.update({why: i for i, why in enumerate(_REASONS)})
    with warnings.catch_warnings():  # torch says a kernel is overridden (the Python switch's): we mean it
        warnings.filterwarnings("ignore", message=".*Overriding a previously registered kernel")
        _STATE["module"].register_kernel()


def counts() -> dict[str, int]:
    """The weight gradients the C++ kernel handled itself (misses are the Python switch's and counted there)."""
    module = _STATE["module"]
    if module is None:
        return {}
    values = module.counts()
    return {why: values[i] for i, why in enumerate(_REASONS) if values[i]}


def reset_counts() -> None:
    if _STATE["module"] is not None:
        _STATE["module"].reset_counts()


def graph_launches() -> int:
    """Our dW's CUDA graphs the C++ kernel launched itself (no Python) since :func:`reset_counts`."""
    return 0 if _STATE["module"] is None else _STATE["module"].graph_launches()


def plain_launches() -> int:
    """Our dW's schedules the C++ kernel launched itself without a graph (``$CONVBW_TORCH_NATIVE_LAUNCH=1``)."""
    return 0 if _STATE["module"] is None else _STATE["module"].plain_launches()


def map_slots() -> tuple[int, int]:
    """(tensor-map slots the C++ launches allocated, reuses of one that waited for the GPU) over the process: a
    bounded pool a kernel, as the Python launcher's (``cuda_launch.MapSlots``)."""
    return (0, 0) if _STATE["module"] is None else tuple(_STATE["module"].map_slots())


def table_size() -> int:
    return 0 if _STATE["module"] is None else _STATE["module"].table_size()


def _reason(why: str) -> int:
    """The C++ counter of torch's reason ``why`` (-1: out of counters, the call is not remembered)."""
    index = _REASON_INDEX.get(f"torch: {why}")
    if index is None:
        with _LOCK:
            index = _REASON_INDEX.get(f"torch: {why}")
            if index is None:
                if len(_REASONS) >= _STATE["module"].REASONS:
                    return -1
                index = _REASON_INDEX[f"torch: {why}"] = len(_REASONS)
                _REASONS.append(f"torch: {why}")
    return index


@torch.compiler.disable  # called from C++ under compiled code's backward: never traced
def _miss(*args: Any) -> tuple:
    """A call the C++ table does not hold, through the Python switch whole: (dx, dW, db, the id of the settings
    it was decided under, the C++ counter to remember it by (-1: not to), ours: the callable for dW, for a
    direct launch dW's (size, strides), which the C++ side allocates and the callable, the kernel, fills, and
    where the kernel's CUDA graphs can be replayed from C++ what that needs (:func:`_graphed`))."""
    key = "CUDA" if args[1].is_cuda else "CPU"
    switch_seen = _SWITCH["seen"]
    switch_seen.seen = None
    dx, dw, db = _SWITCH["kernel"](key)(_KEYSETS[key], *args)
    seen, switch_seen.seen = getattr(switch_seen, "seen", None), None
    if seen is None:
        return dx, dw, db, -1, -1, None, None, None
    active, decision, conf = seen
    held = _STATE["settings"].get(id(active))
    settings = held[1] if held is not None and held[0] is active else -1  # -1: numbered no more: not remembered
    if not decision.ours:
        return dx, dw, db, settings, _reason(decision.why), None, None, None
    if (
        decision.direct is not None
        and not decision.copy_x
        and decision.dy_format is None
        and decision.dw_strides is None
    ):
        kernel, (size, strides) = decision.direct  # what switch._weight_grad does, dW allocated in C++
        layout = (tuple(size), tuple(strides))
        return dx, dw, db, settings, 0, torch.compiler.disable(kernel.__call__), layout, _graphed(kernel)
    return dx, dw, db, settings, 0, functools.partial(_weight_grad, decision, conf), None, None


def _graphed(kernel: Any) -> tuple | None:
    """For a direct launch C++ may launch itself (``DirectCall.native_launch``): (launch(x, dy, dW) -> (the
    cudaGraphExec_t it replayed or 0, the workspace or None), cuGraphLaunch's address (0: no graphs),
    cuStreamIsCapturing's, the workspace's bytes, the schedule to launch where no graph is known or None:
    ``DirectCall.native_plan``); None: every call of it through Python (HIP)."""
    spec = getattr(kernel, "native_launch", None)
    spec = spec() if spec is not None else None
    if spec is None:
        return None
    launch, graph_launch, capturing, transient, plan = spec
    return torch.compiler.disable(launch), int(graph_launch or 0), int(capturing), int(transient), plan


@torch.compiler.disable
def _weight_grad(decision: Any, conf: tuple, x: torch.Tensor, w: torch.Tensor, go: torch.Tensor) -> torch.Tensor:
    """Our dW for a remembered decision: the Python switch's own (copies, direct launch, torch's strides)."""
    return _SWITCH["weight_grad"](decision, x, w, go, conf)
