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

Tensor maps (sm_90a kernels: TMA): a ``CUtensorMap`` holds the address of the memory it describes, so it is
encoded at launch. The schedule's :class:`TensorMap` records say, per map, which binding of which dispatch it
describes, its dims, strides, box, im2col corners and swizzle; the launcher encodes them
(``cuTensorMapEncodeTiled`` / ``cuTensorMapEncodeIm2col``) for the bound addresses, once per address pair,
into a device slot of its own (:class:`MapSlots`: a bounded pool, a slot reused once the GPU is done with it, kept
for good by a CUDA graph that captured it) and binds that slot as the dispatch's maps binding.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "LAUNCH_FILE",
    "MAP_SLOTS_ENV",
    "CudaError",
    "CudaLauncher",
    "Dispatch",
    "ExportDef",
    "Launch",
    "MapSlots",
    "TensorMap",
    "Transfer",
    "check_ptx_targets",
    "image_kind",
    "launch_plan",
]

LAUNCH_FILE = "launch.json"
_EM_CUDA = 190  # ELF e_machine of an NVIDIA cubin (an AMD code object's is 224, EM_AMDGPU)


def image_kind(image: bytes) -> str:
    """What a kernel image is: ``cubin`` (NVIDIA ELF: SASS, loaded without JIT), ``ptx`` (text, JIT-compiled by the
    driver at load), or ``elf`` (another ELF: a HIP code object)."""
    if image[:4] != b"\x7fELF":
        return "ptx"
    return "cubin" if len(image) > 20 and int.from_bytes(image[18:20], "little") == _EM_CUDA else "elf"


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


@dataclass(frozen=True)
class TensorMap:
    """One ``CUtensorMap`` the launcher encodes for dispatch ``kernel`` (cuda.h's ``cuTensorMapEncode*``).

    Attributes:
        kernel: the dispatch (its kernel's name) whose binding ``binding`` the map describes (its address at
            launch, binding offset included) and whose binding ``maps_binding`` receives the encoded maps.
        slot: the map's place in the maps buffer (128 bytes each).
        mode: ``tiled`` or ``im2col``.
        dtype: ``CUtensorMapDataType`` (6: f16, 9: bf16).
        dims: sizes, innermost first; strides: byte strides of dims 1.. (``len(dims) - 1`` values).
        box: tiled: the box's sizes; im2col: (channels per pixel, pixels per column).
        element_strides: traversal strides, one per dim.
        lower, upper: im2col's pixel box corners (spatial dims, innermost first); empty for tiled.
        swizzle, interleave, l2_promotion, oob_fill: the enums (3: 128-byte swizzle; 3: 256-byte promotion).
    """

    kernel: str
    binding: int
    maps_binding: int
    slot: int
    mode: str
    dtype: int
    dims: tuple[int, ...]
    strides: tuple[int, ...]
    box: tuple[int, ...]
    element_strides: tuple[int, ...]
    lower: tuple[int, ...] = ()
    upper: tuple[int, ...] = ()
    swizzle: int = 3
    interleave: int = 0
    l2_promotion: int = 3
    oob_fill: int = 0

    def __post_init__(self) -> None:
        for name in ("dims", "strides", "box", "element_strides", "lower", "upper"):
            object.__setattr__(self, name, tuple(int(v) for v in getattr(self, name)))
        rank = len(self.dims)
        if self.mode not in ("tiled", "im2col"):
            raise ValueError(f"tensor map: mode {self.mode!r} (tiled or im2col)")
        if not 1 <= rank <= 5 or len(self.strides) != rank - 1 or len(self.element_strides) != rank:
            raise ValueError(f"tensor map: dims {self.dims}, strides {self.strides}, element_strides "
                             f"{self.element_strides} (rank 1-5, rank - 1 strides, rank element strides)")  # fmt: skip
        if self.mode == "tiled" and len(self.box) != rank:
            raise ValueError(f"tensor map: box {self.box} (a tiled map's box has one size a dim)")
        if self.mode == "im2col" and (len(self.box) != 2 or len(self.lower) != rank - 2 or len(self.upper) != rank - 2):
            raise ValueError(f"tensor map: box {self.box}, lower {self.lower}, upper {self.upper} (im2col: 2 box "
                             "values, rank - 2 corners)")  # fmt: skip
        if any(s % 16 for s in self.strides):
            raise ValueError(f"tensor map: strides {self.strides} (multiples of 16 bytes)")


@dataclass
class Launch:
    """A module's launch schedule and kernels, or why it cannot be launched directly.

    Attributes:
        function: the exported function.
        steps: dispatches and transfers in stream order.
        transient: bytes of the transient workspace (0: none).
        arg_bytes: minimum byte length per function argument (IREE's ``hal.buffer.assert``).
        exports: the kernels by name.
        ptx: the kernel images: PTX or cubins (CUDA: :func:`image_kind`), HSACO code objects (HIP).
        tensor_maps: the CUtensorMaps the launcher encodes at each call (sm_90a kernels), empty: none.
        refused: why the schedule is not supported (then the rest is empty); None when it is.
    """

    function: str = ""
    steps: list[Dispatch | Transfer] = field(default_factory=list)
    transient: int = 0
    arg_bytes: tuple[int, ...] = ()
    exports: dict[str, ExportDef] = field(default_factory=dict)
    ptx: list[bytes] = field(default_factory=list)  # the kernel images: PTX (CUDA) or HSACO code objects (HIP)
    refused: str | None = None
    tensor_maps: list[TensorMap] = field(default_factory=list)

    @property
    def dispatches(self) -> list[Dispatch]:
        return [s for s in self.steps if isinstance(s, Dispatch)]

    # -- persistence (beside the vmfb in CompiledOp's artifact folder) ---------------------------
    @property
    def image_kinds(self) -> list[str]:
        """:func:`image_kind` of each image: whether the driver JIT-compiles them at load (``ptx``) or not."""
        return [image_kind(i) for i in self.ptx]

    def _image_names(self) -> list[str]:
        return [f"launch-{i}.{'cubin' if k == 'cubin' else 'ptx'}" for i, k in enumerate(self.image_kinds)]

    def files(self) -> dict[str, bytes]:
        """``launch.json`` and one ``launch-<i>.ptx`` per PTX image (``launch-<i>.cubin`` per cubin)."""
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
            "ptx": self._image_names(),
            "images": self.image_kinds,
            "tensor_maps": [{k: list(v) if isinstance(v, tuple) else v for k, v in vars(m).items()}
                            for m in self.tensor_maps],
        }  # fmt: skip
        out = {LAUNCH_FILE: (json.dumps(meta, indent=1) + "\n").encode()}
        out |= dict(zip(self._image_names(), self.ptx))
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
                tensor_maps=[TensorMap(**m) for m in meta.get("tensor_maps", [])],  # absent before sm_90a kernels
            )
        except (KeyError, TypeError, ValueError, json.JSONDecodeError) as e:
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
        if image_kind(image) != "ptx":  # SASS of one arch: the driver itself refuses another device's
            continue
        found = re.search(rb"^\s*\.target\s+sm_(\d+)(a?)", image, re.M)
        if not found:
            continue
        arch, specific = int(found.group(1)), bool(found.group(2))
        target = f"sm_{arch}{'a' if specific else ''}"
        if (specific and arch != 10 * major + minor) or arch > 10 * major + minor:
            raise ValueError(f"launch: the kernels are {target} PTX, which a device of compute capability "
                             f"{major}.{minor} cannot run; compile for sm_80 (or the device's own target)")  # fmt: skip


def im2col_corners(spatial: tuple[int, ...], out: tuple[int, ...], stride: tuple[int, ...],
                   pad: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:  # fmt: skip
    """x's im2col bounding box per image (cuTensorMapEncodeIm2col's pixelBoxLowerCorner / UpperCorner), one value
    a spatial dim innermost first (``(w, h)``; ``(w,)``; ``(w, h, d)``), from x's ``spatial`` sizes, dy's ``out``
    sizes, the ``stride`` and the low ``pad`` (each outermost first): from ``-p`` to ``dim - 1 + p - (F - 1) d``,
    so that walking it at the stride visits exactly the output's positions."""
    inner = list(zip(spatial, out, stride, pad))[::-1]
    lower = tuple(-p for _, _, _, p in inner)
    # the last output position's pixel, (o - 1) s - p, is the box's upper end, dim - 1 + upper
    upper = tuple((o - 1) * s - p - (size - 1) for size, o, s, p in inner)
    return lower, upper


# -- running it: the CUDA driver API through ctypes ------------------------------------------------
class CudaError(RuntimeError):
    """A CUDA driver call failed; the message names the call and the driver's error."""


_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8  # cuda.h CUfunction_attribute
_LIB: Any = None
_LIB_LOCK = threading.Lock()


_vp, _u32, _sz, _u64, _i32 = ctypes.c_void_p, ctypes.c_uint, ctypes.c_size_t, ctypes.c_uint64, ctypes.c_int
_P = ctypes.POINTER
# the driver functions the launcher calls, as cuda.h declares them (bench/cuda_stub.c defines the same prototypes
# and bench/host_path.py checks the two agree): name -> argument types; every one returns a CUresult
DRIVER_SIGNATURES: dict[str, list[Any]] = {
    "cuInit": [_u32],
    "cuDeviceGet": [_P(_i32), _i32],
    "cuDeviceGetAttribute": [_P(_i32), _i32, _i32],
    "cuDevicePrimaryCtxRetain": [_P(_vp), _i32],
    "cuCtxGetCurrent": [_P(_vp)],
    "cuCtxSetCurrent": [_vp],
    "cuModuleLoadData": [_P(_vp), ctypes.c_char_p],
    "cuModuleGetFunction": [_P(_vp), _vp, ctypes.c_char_p],
    "cuFuncSetAttribute": [_vp, _i32, _i32],
    "cuLaunchKernel": [_vp, _u32, _u32, _u32, _u32, _u32, _u32, _u32, _vp, _vp, _vp],
    "cuMemsetD8Async": [_u64, ctypes.c_ubyte, _sz, _vp],
    "cuMemsetD16Async": [_u64, ctypes.c_ushort, _sz, _vp],
    "cuMemsetD32Async": [_u64, _u32, _sz, _vp],
    "cuMemcpyAsync": [_u64, _u64, _sz, _vp],
    "cuGetErrorString": [_i32, _P(ctypes.c_char_p)],
    "cuMemAlloc_v2": [_P(_u64), _sz],
    "cuMemAllocHost_v2": [_P(_vp), _sz],
    "cuMemcpyHtoDAsync_v2": [_u64, _vp, _sz, _vp],
    "cuStreamIsCapturing": [_vp, _P(_i32)],
    "cuEventCreate": [_P(_vp), _u32],
    "cuEventRecord": [_vp, _vp],
    "cuEventQuery": [_vp],
    "cuEventSynchronize": [_vp],
    "cuThreadExchangeStreamCaptureMode": [_P(_i32)],
}
# CUDA 12 drivers only (sm_90a kernels): absent elsewhere, asked for only by a launch with tensor maps
OPTIONAL_SIGNATURES: dict[str, list[Any]] = {
    "cuTensorMapEncodeTiled": [_vp, _i32, _u32, _vp, _P(_u64), _P(_u64), _P(_u32), _P(_u32), _i32, _i32, _i32, _i32],
    "cuTensorMapEncodeIm2col": [_vp, _i32, _u32, _vp, _P(_u64), _P(_u64), _P(_i32), _P(_i32), _u32, _u32, _P(_u32),
                                _i32, _i32, _i32, _i32],
}  # fmt: skip


def declare(lib: Any) -> Any:
    """``lib`` (a ``ctypes.CDLL`` of the driver, or a stand-in with its functions) with the argument types of
    :data:`DRIVER_SIGNATURES` and :data:`OPTIONAL_SIGNATURES` (those it has) declared, initialized."""
    optional = [(k, v) for k, v in OPTIONAL_SIGNATURES.items() if hasattr(lib, k)]
    for name, args in [*DRIVER_SIGNATURES.items(), *optional]:
        f = getattr(lib, name)
        f.argtypes, f.restype = args, ctypes.c_int
    _check(lib, lib.cuInit(0), "cuInit")
    return lib


def _libcuda() -> Any:
    """``libcuda.so.1`` with the few driver functions the launcher calls (argument types declared)."""
    global _LIB
    with _LIB_LOCK:
        if _LIB is None:
            _LIB = declare(ctypes.CDLL("libcuda.so.1"))
    return _LIB


class _Encoder:
    """One :class:`TensorMap`'s ``cuTensorMapEncode*`` call, its constant arguments (dims, strides, box, corners as
    ctypes arrays) built once: a call passes only where the 128 bytes go and the address described (the launcher
    encodes a map per new address pair: building the arrays each time cost ~15 µs of the ~35 a call on moving
    memory, docs/torch.md#host-cost-a-call-on-a-cpu)."""

    __slots__ = ("fn", "head", "tail", "what")

    def __init__(self, lib: Any, m: TensorMap) -> None:
        u32, u64 = ctypes.c_uint32, ctypes.c_uint64
        name = "cuTensorMapEncodeTiled" if m.mode == "tiled" else "cuTensorMapEncodeIm2col"
        if not hasattr(lib, name):
            raise CudaError(f"{name}: not in this CUDA driver (tensor maps need CUDA 12; the kernels are sm_90a)")
        rank = len(m.dims)
        dims, strides = (u64 * rank)(*m.dims), (u64 * max(rank - 1, 1))(*m.strides)
        elems = (u32 * rank)(*m.element_strides)
        enums = (m.interleave, m.swizzle, m.l2_promotion, m.oob_fill)
        if m.mode == "tiled":
            self.tail = (dims, strides, (u32 * rank)(*m.box), elems, *enums)
        else:
            corners = [(ctypes.c_int * max(rank - 2, 1))(*c) for c in (m.lower, m.upper)]
            self.tail = (dims, strides, *corners, m.box[0], m.box[1], elems, *enums)
        self.fn, self.head, self.what = getattr(lib, name), (m.dtype, rank), f"{name}(binding {m.binding} of {m.kernel}"

    def __call__(self, lib: Any, out: Any, address: int) -> None:
        """Encode into ``out`` (128 bytes, 64-byte aligned: a ctypes buffer or its address)."""
        rc = self.fn(out, *self.head, address, *self.tail)
        if rc:
            _check(lib, rc, f"{self.what} at {address:#x})")


def encode_tensor_map(lib: Any, m: TensorMap, address: int) -> bytes:
    """The 128 bytes of ``m``'s ``CUtensorMap`` for memory at device ``address`` (cuTensorMapEncode*).

    Raises:
        CudaError: the driver has no tensor maps (before CUDA 12) or refused the map (naming its binding).
    """
    raw = (ctypes.c_uint8 * 192)()  # CUtensorMap is alignas(64): an aligned 128 bytes inside
    out = (ctypes.c_uint8 * 128).from_buffer(raw, -ctypes.addressof(raw) % 64)
    _Encoder(lib, m)(lib, out, address)
    return bytes(out)


_MAPS_SLOT = 256  # bytes of device memory a dispatch's maps take (two 128-byte CUtensorMaps)
_MAPS_SLAB = 64  # slots allocated at a time
MAP_SLOTS_ENV = "CONVBW_TENSOR_MAP_SLOTS"  # slots a launcher reuses (default DEFAULT_MAP_SLOTS); graphs' come on top
DEFAULT_MAP_SLOTS = 64  # one slab: 16 KiB of device and 16 KiB of pinned memory a kernel
_CU_EVENT_DISABLE_TIMING = 2  # cuda.h CUevent_flags
_CUDA_ERROR_NOT_READY = 600
_CU_STREAM_CAPTURE_MODE_RELAXED = 2


def map_slots_cap(value: str | None = None) -> int:
    """The number of tensor-map slots a launcher reuses: ``value``, else ``$CONVBW_TENSOR_MAP_SLOTS``, else
    :data:`DEFAULT_MAP_SLOTS`.

    Raises:
        ValueError: not a whole number >= 1, naming the variable and the value.
    """
    raw = os.environ.get(MAP_SLOTS_ENV) if value is None else value
    if raw is None or not raw.strip():
        return DEFAULT_MAP_SLOTS
    try:
        cap = int(raw)
    except ValueError:
        cap = 0
    if cap < 1:
        raise ValueError(f"{MAP_SLOTS_ENV}={raw!r}: the tensor-map slots a kernel keeps, a whole number >= 1")
    return cap


class MapSlots:
    """The device slots (256 bytes, with a pinned host twin for the upload) a launcher encodes its tensor maps into,
    one per (step, stream, described addresses) key, bounded: at most ``cap`` slots are reused, least recently used
    first, each only once the GPU is done with every launch that read it (a CUDA event recorded on the stream after
    each use, ``cuEventQuery`` before reuse; the oldest still running is waited for, ``cuEventSynchronize``). A slot
    a CUDA graph captured (its address is baked into the graph, and the upload from its pinned twin too) is
    :meth:`pin` ned: never reused, not counted in the cap, so graphs add their own slots (our graphs are at most
    ``_MAX_GRAPHS`` a kernel and never destroyed; torch's captures are few and long-lived). Why wait rather than
    grow past the cap: the bound is the point, and a wait comes only when the host is ``cap`` new address pairs of
    one kernel ahead of the GPU, many training steps, where it costs nothing the queue would not. Not thread-safe:
    the launcher's lock guards it."""

    def __init__(self, lib: Any, cap: int) -> None:
        self.lib, self.cap = lib, cap
        self.keys: OrderedDict[tuple, int] = OrderedDict()  # key -> slot, least recently used first
        self.device: list[int] = []  # per slot: its device address, pinned host address, event, key
        self.host: list[int] = []
        self.events: list[int] = []
        self.key_of: list[tuple | None] = []
        self.pinned: set[int] = set()
        self.free: list[int] = []
        self.waits = 0  # reuses that had to wait for the GPU

    def find(self, key: tuple) -> int | None:
        """The slot holding ``key``'s maps, marked most recently used; None where none does."""
        slot = self.keys.get(key)
        if slot is not None:
            self.keys.move_to_end(key)
        return slot

    def take(self, key: tuple, capturing: bool = False) -> int:
        """A slot for ``key``'s maps, free to be written now (its last reader done): a fresh one while fewer than
        ``cap`` unpinned slots exist, else the least recently used unpinned one, after its event. ``capturing``: the
        calling thread is capturing a stream, where an allocation or an event wait is refused as unsafe: this thread's
        capture mode is relaxed around them (they are not part of the graph; its events were recorded outside it).

        Raises:
            CudaError: an allocation, event query or wait failed.
        """
        if not capturing:
            return self._take(key)
        lib, mode = self.lib, ctypes.c_int(_CU_STREAM_CAPTURE_MODE_RELAXED)
        _check(lib, lib.cuThreadExchangeStreamCaptureMode(ctypes.byref(mode)), "cuThreadExchangeStreamCaptureMode")
        try:
            return self._take(key)
        finally:
            _check(lib, lib.cuThreadExchangeStreamCaptureMode(ctypes.byref(mode)), "cuThreadExchangeStreamCaptureMode")

    def _take(self, key: tuple) -> int:
        if not self.free and len(self.device) - len(self.pinned) < self.cap:
            self._grow(min(_MAPS_SLAB, self.cap - (len(self.device) - len(self.pinned))))
        if self.free:
            slot = self.free.pop()
        else:
            old = next(k for k, s in self.keys.items() if s not in self.pinned)  # least recently used, no graph's
            slot = self.keys[old]
            event, lib = self.events[slot], self.lib
            rc = lib.cuEventQuery(event)
            if rc == _CUDA_ERROR_NOT_READY:  # the GPU has not read it yet: wait for that use alone
                self.waits += 1
                _check(lib, lib.cuEventSynchronize(event), "cuEventSynchronize (tensor maps)")
            elif rc:
                _check(lib, rc, "cuEventQuery (tensor maps)")
            del self.keys[old]
        self.keys[key], self.key_of[slot] = slot, key
        return slot

    def used(self, slot: int, stream: int) -> None:
        """Mark ``slot`` read by the work just queued on ``stream`` (not reused before it is done)."""
        if slot not in self.pinned:
            _check(self.lib, self.lib.cuEventRecord(self.events[slot], stream), "cuEventRecord (tensor maps)")

    def pin(self, slot: int) -> None:
        """Keep ``slot`` as it is for the process: a CUDA graph captured its address."""
        self.pinned.add(slot)

    def _grow(self, n: int) -> None:
        lib = self.lib
        dev, host = ctypes.c_uint64(), ctypes.c_void_p()
        _check(lib, lib.cuMemAlloc_v2(ctypes.byref(dev), _MAPS_SLOT * n), "cuMemAlloc (tensor maps)")
        _check(lib, lib.cuMemAllocHost_v2(ctypes.byref(host), _MAPS_SLOT * n), "cuMemAllocHost (tensor maps)")
        for i in range(n):  # never freed: a slot's memory and event live as long as the launcher (the process)
            event = ctypes.c_void_p()
            _check(lib, lib.cuEventCreate(ctypes.byref(event), _CU_EVENT_DISABLE_TIMING), "cuEventCreate")
            self.free.insert(0, len(self.device))  # handed out in address order
            self.device.append(dev.value + _MAPS_SLOT * i)
            self.host.append(host.value + _MAPS_SLOT * i)
            self.events.append(event.value)
            self.key_of.append(None)


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
            _check(
                lib,
                lib.cuModuleLoadData(ctypes.byref(mod), image + b"\0"),
                f"cuModuleLoadData({image_kind(image)} {i})",
            )
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
        # tensor maps: per kernel step, (maps binding, its maps); encoded per address tuple into a slot of ours
        self._maps: dict[int, tuple[int, list[TensorMap], tuple[int, ...]]] = {}
        for i, step in enumerate(self._plan):
            maps = sorted((m for m in launch.tensor_maps if step[0] == "k" and m.kernel == step[6]),
                          key=lambda m: m.slot)  # fmt: skip
            if maps:
                if len({m.maps_binding for m in maps}) != 1 or 128 * (maps[-1].slot + 1) > _MAPS_SLOT:
                    raise ValueError(f"launch: tensor maps of {step[6]}: one maps binding, at most 2 maps")
                self._maps[i] = (maps[0].maps_binding, maps, tuple(m.binding for m in maps))
        unlaunched = {m.kernel for m in launch.tensor_maps} - {s[6] for s in self._plan if s[0] == "k"}
        if unlaunched:
            raise ValueError(
                f"launch: tensor maps of {', '.join(sorted(unlaunched))}, which the schedule does not launch"
            )
        self.slots = MapSlots(lib, map_slots_cap())  # the encoded maps' device slots, bounded
        self.encodings = 0  # map sets encoded (a new address pair each): what moving memory costs
        self._encoders: dict[int, list[_Encoder]] = {}  # per kernel step with maps, built at its first encoding
        self._capture_status = ctypes.c_int()

    def _bind(self) -> None:
        """Make the primary context current on this thread (torch's threads have it already)."""
        cur = self._cur
        self._lib.cuCtxGetCurrent(ctypes.byref(cur))
        if cur.value != self._ctx:
            _check(self._lib, self._lib.cuCtxSetCurrent(self._ctx), "cuCtxSetCurrent")

    def __call__(
        self, pointers: tuple[int, ...], stream: int, maps_stream: int | None = None, captured: bool | None = None
    ) -> None:
        """Queue the schedule on ``stream``: ``pointers`` are the arguments' device addresses and the
        transient workspace's (of at least ``launch.transient`` bytes; anything where there is none).
        ``maps_stream``: the stream whose tensor maps for these addresses the kernels may read (a CUDA graph
        captured on a side stream and replayed on that one: no copy of the maps in the graph). ``captured``:
        whether ``stream`` is being captured into a CUDA graph, where the caller knows (None: the driver is asked
        where the schedule has tensor maps; a slot bound in a capture is the graph's for good).

        Raises:
            CudaError: a launch failed (the message names the kernel).
        """
        lib = self._lib
        with self._lock:
            self._bind()
            self._queue(lib, pointers, stream, stream if maps_stream is None else maps_stream, captured)

    def _maps_for(self, index: int, payload: Any, stream: int, maps_stream: int, captured: bool) -> int:
        """The slot of step ``index``'s tensor maps for the addresses its payload binds: encoded once per address
        tuple and stream into pinned memory and copied to the device slot on ``stream`` (stream order: a CUDA
        graph captures the copy too; a slot copied on another stream could be read before its copy lands)."""
        bindings = self._maps[index][2]
        addresses = tuple(payload[b] for b in bindings)
        slots = self.slots
        if maps_stream != stream:
            found = slots.find((index, maps_stream, *addresses))
            if found is not None:
                return found
        key = (index, stream, *addresses)
        found = slots.find(key)
        if found is not None:
            return found
        lib = self._lib
        slot = slots.take(key, captured)
        dev, host = slots.device[slot], slots.host[slot]
        encoders = self._encoders.get(index)
        if encoders is None:
            encoders = self._encoders[index] = [_Encoder(lib, m) for m in self._maps[index][1]]
        for k, (encode, address) in enumerate(zip(encoders, addresses)):  # straight into the pinned slot (aligned)
            encode(lib, host + 128 * k, address)
        _check(lib, lib.cuMemcpyHtoDAsync_v2(dev, host, 128 * len(encoders), stream), "cuMemcpyHtoDAsync")
        self.encodings += 1
        return slot

    def _capturing(self, lib: Any, stream: int) -> bool:
        """Whether ``stream`` is being captured into a CUDA graph (ours, torch's, a user's): a slot bound then
        stays the graph's."""
        status = self._capture_status
        _check(lib, lib.cuStreamIsCapturing(stream, ctypes.byref(status)), "cuStreamIsCapturing")
        return status.value != 0

    def _queue(self, lib: Any, pointers: tuple[int, ...], stream: int, maps_stream: int, captured: bool | None) -> None:
        for index, step in enumerate(self._plan):
            if step[0] == "k":
                _, func, dims, payload, params, binds, name = step
                for i, (which, off) in enumerate(binds):
                    payload[i] = pointers[which] + off
                slot = None
                if index in self._maps:
                    if captured is None:
                        captured = self._capturing(lib, stream)
                    slot = self._maps_for(index, payload, stream, maps_stream, captured)
                    payload[self._maps[index][0]] = self.slots.device[slot]
                    if captured:
                        self.slots.pin(slot)
                rc = lib.cuLaunchKernel(func, *dims, stream, params, None)
                if rc:
                    _check(lib, rc, f"cuLaunchKernel({name})")
                if slot is not None and not captured:
                    self.slots.used(slot, stream)
            else:
                kind, (t, toff), length, src, pattern, width = step
                dst = pointers[t] + toff
                if kind == "copy":
                    _check(lib, lib.cuMemcpyAsync(dst, pointers[src[0]] + src[1], length, stream), "cuMemcpyAsync")
                else:
                    fill = {1: lib.cuMemsetD8Async, 2: lib.cuMemsetD16Async, 4: lib.cuMemsetD32Async}[width]
                    _check(lib, fill(dst, pattern, length // width, stream), f"cuMemsetD{8 * width}Async")
