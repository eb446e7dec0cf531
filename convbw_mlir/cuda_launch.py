"""Direct CUDA launch, the run-time half: a compiled module's kernels launched on torch's stream, without the
IREE runtime. The compile-time half (reading the schedule at IREE's ``hal`` phase, and the kernels from the
executable) is :mod:`convbw_mlir.build.cuda_schedule`.

All shapes are static, so what IREE's runtime does per call is fixed at compile time: the module's
``hal`` phase holds it as IR (a memoized command buffer of ``hal.command_buffer.dispatch`` ops with
constant workgroup counts, ``hal.device.queue.alloca`` of constant-size transient buffers (each its own
aligned part of one workspace), and ``hal.device.queue.execute.indirect`` binding the arguments and the
transient). At compile time
(``build.cuda_schedule.compile_with_launch``) the module is compiled to ``hal``, that schedule is read with
the MLIR Python bindings (``read_launch``) together with the kernels from the ``hal.executable.binary``
(IREE's ``cuda_executable_def.fbs`` flatbuffer: PTX image, block dims, dynamic shared memory), and the
same compile continues from ``hal`` to the vmfb. At run time :class:`CudaLauncher` loads the PTX once
per device and launches each dispatch with ``cuLaunchKernel`` on the caller's stream (fills and copies
as async memset/memcpy), with kernel parameters in IREE's CUDA ABI: one 64-bit device pointer per
binding (base + binding-table offset + dispatch offset), then each 32-bit constant
(runtime/src/iree/hal/drivers/cuda/stream_command_buffer.c, ``..._dispatch``). No host wait, no
runtime, capturable by CUDA graphs (docs/torch.md).

A schedule op this reader does not know makes the whole schedule refused (:attr:`Launch.refused`
says why); the caller then runs the vmfb through IREE's runtime.
"""

from __future__ import annotations

import ctypes
import json
import re
import threading
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "LAUNCH_FILE",
    "CudaError",
    "CudaLauncher",
    "Dispatch",
    "ExportDef",
    "Launch",
    "Transfer",
    "check_ptx_targets",
    "launch_plan",
]

LAUNCH_FILE = "launch.json"
TRANSIENT = "transient"  # the buffer name of the module's transient (split-K partials, padded copies)


# -- the kernels: IREE's CUDA executable flatbuffer ------------------------------------------------
@dataclass(frozen=True)
class ExportDef:
    """One kernel of the executable (``iree.hal.cuda.ExportDef``)."""

    name: str
    module: int  # index into Launch.ptx
    block: tuple[int, int, int]
    shared_memory: int  # dynamic shared memory per block, bytes
    constants: int  # 32-bit push constants, passed after the bindings
    bindings: int


@dataclass(frozen=True)
class Dispatch:
    """One kernel launch: ``bindings`` are (buffer, byte offset) with buffer ``arg<i>`` or ``transient``."""

    kernel: str
    grid: tuple[int, int, int]
    bindings: tuple[tuple[str, int], ...]
    constants: tuple[int, ...] = ()


@dataclass(frozen=True)
class Transfer:
    """A fill (``pattern`` of ``pattern_bytes`` bytes over ``length`` bytes of ``target``) or a copy
    (``length`` bytes from ``source`` to ``target``); buffers are (name, byte offset)."""

    kind: str  # "fill" or "copy"
    target: tuple[str, int]
    length: int
    source: tuple[str, int] | None = None
    pattern: int = 0
    pattern_bytes: int = 0


@dataclass
class Launch:
    """A module's launch schedule and kernels, or why it cannot be launched directly.

    Attributes:
        function: the exported function.
        steps: dispatches and transfers in stream order.
        transient: bytes of the transient workspace (0: none).
        arg_bytes: minimum byte length per function argument (IREE's ``hal.buffer.assert``).
        exports: the kernels by name.
        ptx: the PTX images.
        refused: why the schedule is not supported (then the rest is empty); None when it is.
    """

    function: str = ""
    steps: list[Dispatch | Transfer] = field(default_factory=list)
    transient: int = 0
    arg_bytes: tuple[int, ...] = ()
    exports: dict[str, ExportDef] = field(default_factory=dict)
    ptx: list[bytes] = field(default_factory=list)  # the kernel images: PTX (CUDA) or HSACO code objects (HIP)
    refused: str | None = None

    @property
    def dispatches(self) -> list[Dispatch]:
        return [s for s in self.steps if isinstance(s, Dispatch)]

    # -- persistence (beside the vmfb in CompiledOp's artifact folder) ---------------------------
    def files(self) -> dict[str, bytes]:
        """``launch.json`` and one ``launch-<i>.ptx`` per PTX image."""
        meta = {
            "function": self.function,
            "refused": self.refused,
            "transient": self.transient,
            "arg_bytes": list(self.arg_bytes),
            "exports": [vars(e) | {"block": list(e.block)} for e in self.exports.values()],
            "steps": [
                {"dispatch": s.kernel, "grid": list(s.grid), "bindings": [list(b) for b in s.bindings],
                 "constants": list(s.constants)}
                if isinstance(s, Dispatch)
                else {s.kind: list(s.target), "length": s.length,
                      "source": list(s.source) if s.source else None,
                      "pattern": s.pattern, "pattern_bytes": s.pattern_bytes}
                for s in self.steps
            ],
            "ptx": [f"launch-{i}.ptx" for i in range(len(self.ptx))],
        }  # fmt: skip
        out = {LAUNCH_FILE: (json.dumps(meta, indent=1) + "\n").encode()}
        out |= {f"launch-{i}.ptx": p for i, p in enumerate(self.ptx)}
        return out

    @classmethod
    def from_files(cls, read: Any) -> Launch:
        """The launch :meth:`files` wrote; ``read(name) -> bytes`` reads a file of the artifact.

        Raises:
            ValueError: a malformed ``launch.json``.
        """
        try:
            meta = json.loads(read(LAUNCH_FILE))
            steps: list[Dispatch | Transfer] = []
            for s in meta["steps"]:
                if "dispatch" in s:
                    binds = tuple((b[0], int(b[1])) for b in s["bindings"])
                    steps.append(Dispatch(s["dispatch"], tuple(s["grid"]), binds, tuple(s["constants"])))
                else:
                    kind = "fill" if "fill" in s else "copy"
                    src = tuple(s["source"]) if s.get("source") else None
                    steps.append(Transfer(kind, tuple(s[kind]), s["length"], src, s["pattern"], s["pattern_bytes"]))
            exports = [ExportDef(**(e | {"block": tuple(e["block"])})) for e in meta["exports"]]
            return cls(
                function=meta["function"],
                steps=steps,
                transient=int(meta["transient"]),
                arg_bytes=tuple(meta["arg_bytes"]),
                exports={e.name: e for e in exports},
                ptx=[read(name) for name in meta["ptx"]],
                refused=meta["refused"],
            )
        except (KeyError, TypeError, json.JSONDecodeError) as e:
            raise ValueError(f"{LAUNCH_FILE}: malformed: {type(e).__name__}: {e}") from None


def launch_plan(launch: Launch, funcs: dict[str, int], dynamic_shared: bool) -> tuple[list[tuple], list[Any]]:
    """What a launcher's call loop reads, per step, and the parameter arrays it must keep alive: a kernel
    ``("k", function, grid + block + dynamic shared bytes, payload, params address, bindings, name)`` whose
    params point into its payload (one 8-byte slot per binding, then each 32-bit constant in its slot: IREE's
    CUDA and HIP ABI), or a transfer ``(kind, (buffer, offset), length, source, pattern, width)``; buffers by
    their position in the pointer tuple a call passes (the arguments, then the transient).
    ``dynamic_shared``: pass the export's dynamic shared memory (CUDA); HIP kernels declare theirs statically."""

    def index(name: str) -> int:
        return len(launch.arg_bytes) if name == TRANSIENT else int(name[3:])

    plan: list[tuple] = []
    keep: list[Any] = []
    for s in launch.steps:
        if isinstance(s, Dispatch):
            e = launch.exports[s.kernel]
            n = len(s.bindings) + len(s.constants)
            payload = (ctypes.c_uint64 * max(n, 1))()
            params = (ctypes.c_void_p * max(n, 1))(*[ctypes.addressof(payload) + 8 * i for i in range(n)])
            for i, c in enumerate(s.constants):  # a 32-bit value in its 8-byte slot
                payload[len(s.bindings) + i] = c
            keep.append(params)  # kept alive: the plan holds its address
            binds = [(index(b), off) for b, off in s.bindings]
            dims = (*s.grid, *e.block, e.shared_memory if dynamic_shared else 0)
            plan.append(("k", funcs[s.kernel], dims, payload, ctypes.addressof(params), binds, s.kernel))
        else:
            src = (index(s.source[0]), s.source[1]) if s.source else None
            plan.append((s.kind, (index(s.target[0]), s.target[1]), s.length, src, s.pattern, s.pattern_bytes))
    return plan, keep


def check_ptx_targets(ptx: list[bytes], capability: tuple[int, int]) -> None:
    """Refuse PTX this device cannot run: an arch-specific target (``sm_90a``: wgmma, setmaxnreg) on any
    other compute capability than its own, or a plain target newer than the device (the driver's JIT
    compiles older PTX forward only).

    Raises:
        ValueError: naming the PTX target and the device's compute capability.
    """
    major, minor = capability
    for image in ptx:
        found = re.search(rb"^\s*\.target\s+sm_(\d+)(a?)", image, re.M)
        if not found:
            continue
        arch, specific = int(found.group(1)), bool(found.group(2))
        target = f"sm_{arch}{'a' if specific else ''}"
        if (specific and arch != 10 * major + minor) or arch > 10 * major + minor:
            raise ValueError(f"launch: the kernels are {target} PTX, which a device of compute capability "
                             f"{major}.{minor} cannot run; compile for sm_80 (or the device's own target)")  # fmt: skip


# -- running it: the CUDA driver API through ctypes ------------------------------------------------
class CudaError(RuntimeError):
    """A CUDA driver call failed; the message names the call and the driver's error."""


_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8  # cuda.h CUfunction_attribute
_LIB: Any = None
_LIB_LOCK = threading.Lock()


def _libcuda() -> Any:
    """``libcuda.so.1`` with the few driver functions the launcher calls (argument types declared)."""
    global _LIB
    with _LIB_LOCK:
        if _LIB is None:
            lib = ctypes.CDLL("libcuda.so.1")
            vp, u32, sz = ctypes.c_void_p, ctypes.c_uint, ctypes.c_size_t
            pvp = ctypes.POINTER(vp)
            sigs = {
                "cuInit": [u32],
                "cuDeviceGet": [ctypes.POINTER(ctypes.c_int), ctypes.c_int],
                "cuDeviceGetAttribute": [ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_int],
                "cuDevicePrimaryCtxRetain": [pvp, ctypes.c_int],
                "cuCtxGetCurrent": [pvp],
                "cuCtxSetCurrent": [vp],
                "cuModuleLoadData": [pvp, ctypes.c_char_p],
                "cuModuleGetFunction": [pvp, vp, ctypes.c_char_p],
                "cuFuncSetAttribute": [vp, ctypes.c_int, ctypes.c_int],
                "cuLaunchKernel": [vp, u32, u32, u32, u32, u32, u32, u32, vp, vp, vp],
                "cuMemsetD8Async": [ctypes.c_uint64, ctypes.c_ubyte, sz, vp],
                "cuMemsetD16Async": [ctypes.c_uint64, ctypes.c_ushort, sz, vp],
                "cuMemsetD32Async": [ctypes.c_uint64, u32, sz, vp],
                "cuMemcpyAsync": [ctypes.c_uint64, ctypes.c_uint64, sz, vp],
                "cuGetErrorString": [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)],
            }
            for name, args in sigs.items():
                f = getattr(lib, name)
                f.argtypes, f.restype = args, ctypes.c_int
            _check(lib, lib.cuInit(0), "cuInit")
            _LIB = lib
    return _LIB


def _check(lib: Any, rc: int, what: str) -> None:
    if rc:
        msg = ctypes.c_char_p()
        lib.cuGetErrorString(rc, ctypes.byref(msg))
        raise CudaError(f"{what}: CUDA error {rc} ({(msg.value or b'?').decode()})")


class CudaLauncher:
    """A :class:`Launch` on one CUDA device: its PTX loaded once, each call a few async driver calls.

    Args:
        launch: a supported schedule (``launch.refused is None``).
        device: the CUDA device ordinal (torch's index).

    Raises:
        ValueError: a refused schedule, or PTX the device cannot run (:func:`check_ptx_targets`).
        CudaError: the driver refused the PTX or a kernel.
    """

    def __init__(self, launch: Launch, device: int) -> None:
        if launch.refused:
            raise ValueError(f"launch: refused ({launch.refused})")
        lib = self._lib = _libcuda()
        self.launch, self.device = launch, device
        dev = ctypes.c_int()
        _check(lib, lib.cuDeviceGet(ctypes.byref(dev), device), "cuDeviceGet")
        cc = [ctypes.c_int(), ctypes.c_int()]
        for value, attribute in zip(cc, (75, 76)):  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR / _MINOR
            _check(lib, lib.cuDeviceGetAttribute(ctypes.byref(value), attribute, dev), "cuDeviceGetAttribute")
        check_ptx_targets(launch.ptx, (cc[0].value, cc[1].value))
        ctx = ctypes.c_void_p()
        # torch's runtime uses the device's primary context: load the kernels into that one
        _check(lib, lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
        self._ctx = ctx.value
        self._cur = ctypes.c_void_p()
        self._lock = threading.Lock()  # the kernels' parameter arrays are shared: one call fills them at a time
        self._bind()
        modules = []
        for i, image in enumerate(launch.ptx):
            mod = ctypes.c_void_p()
            _check(lib, lib.cuModuleLoadData(ctypes.byref(mod), image + b"\0"), f"cuModuleLoadData(ptx {i})")
            modules.append(mod)
        self._modules = modules  # never unloaded: a process keeps its kernels (as IREE's executable cache)
        funcs = {}
        for e in launch.exports.values():
            f = ctypes.c_void_p()
            _check(lib, lib.cuModuleGetFunction(ctypes.byref(f), modules[e.module], e.name.encode()),
                   f"cuModuleGetFunction({e.name})")  # fmt: skip
            if e.shared_memory:  # as IREE's native_executable.c: opt in to the dynamic shared memory asked for
                _check(lib, lib.cuFuncSetAttribute(f, _CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                                   e.shared_memory), f"cuFuncSetAttribute({e.name})")  # fmt: skip
            funcs[e.name] = f.value
        self._plan, self._params = launch_plan(launch, funcs, dynamic_shared=True)

    def _bind(self) -> None:
        """Make the primary context current on this thread (torch's threads have it already)."""
        cur = self._cur
        self._lib.cuCtxGetCurrent(ctypes.byref(cur))
        if cur.value != self._ctx:
            _check(self._lib, self._lib.cuCtxSetCurrent(self._ctx), "cuCtxSetCurrent")

    def __call__(self, pointers: tuple[int, ...], stream: int) -> None:
        """Queue the schedule on ``stream``: ``pointers`` are the arguments' device addresses and the
        transient workspace's (of at least ``launch.transient`` bytes; anything where there is none).

        Raises:
            CudaError: a launch failed (the message names the kernel).
        """
        lib = self._lib
        with self._lock:
            self._bind()
            self._queue(lib, pointers, stream)

    def _queue(self, lib: Any, pointers: tuple[int, ...], stream: int) -> None:
        for step in self._plan:
            if step[0] == "k":
                _, func, dims, payload, params, binds, name = step
                for i, (which, off) in enumerate(binds):
                    payload[i] = pointers[which] + off
                rc = lib.cuLaunchKernel(func, *dims, stream, params, None)
                if rc:
                    _check(lib, rc, f"cuLaunchKernel({name})")
            else:
                kind, (t, toff), length, src, pattern, width = step
                dst = pointers[t] + toff
                if kind == "copy":
                    _check(lib, lib.cuMemcpyAsync(dst, pointers[src[0]] + src[1], length, stream), "cuMemcpyAsync")
                else:
                    fill = {1: lib.cuMemsetD8Async, 2: lib.cuMemsetD16Async, 4: lib.cuMemsetD32Async}[width]
                    _check(lib, fill(dst, pattern, length // width, stream), f"cuMemsetD{8 * width}Async")
