"""Running compiled kernels through the IREE runtime (needs no compiler).

One module for ``CompiledOp.run``, the CLI and the benchmarks: open a device of a driver, load a vmfb,
move arrays to the device, call, time.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from convbw_mlir.problem import numpy_dtype

__all__ = [
    "TENSOR_MAPS_KEY",
    "DeviceError",
    "Kernel",
    "NotEnoughMemoryError",
    "PreparedCall",
    "aligned_empty",
    "available_memory",
    "check_inputs",
    "fenced_host",
    "check_memory",
    "format_bytes",
    "numpy_dtype",
    "open_device",
    "refuse_tensor_maps",
    "time_calls",
]


# The entry function's reflection key of a module whose kernel reads TMA tensor maps (an sm_90a kernel; set by
# convbw-explicit-kernel): IREE's HAL cannot pass them, so this runtime refuses such a module.
TENSOR_MAPS_KEY = "convbw.tensor_maps"


def refuse_tensor_maps(vmfb: bytes, function: str = "conv_bwd_weight") -> None:
    """Refuse a module whose function's kernel reads tensor maps (:data:`TENSOR_MAPS_KEY` in its reflection),
    before any device is opened.

    Raises:
        ValueError: naming the target, the kernel and what runs it instead.
    """
    import iree.runtime as rt

    instance = rt.VmInstance()  # held while the module is read: the module does not keep it alive
    module = rt.VmModule.copy_buffer(instance, vmfb)
    fn = module.lookup_function(function)
    kernel = fn.reflection.get(TENSOR_MAPS_KEY) if fn is not None else None
    del fn, module, instance
    if kernel:
        raise ValueError(
            f"target sm_90a: {function}'s kernel {kernel} reads TMA tensor maps, which IREE's runtime cannot pass; "
            "run it through the direct CUDA launch (convbw_mlir.torch on a compute-capability 9.0 GPU, or "
            "convbw_mlir.cuda_launch.CudaLauncher on the artifact's launch schedule), or compile for sm_80"
        )


class DeviceError(RuntimeError):
    """The driver has no usable device (e.g. no AMD GPU for hip)."""


_DEVICES: dict[tuple[str, int], Any] = {}


def open_device(driver: str, index: int | None = None) -> Any:
    """The ``index``-th device of ``driver`` (``local-task``, ``hip``, ``cuda``), opened once and reused.

    Raises:
        DeviceError: the driver cannot be loaded or has no such device.
    """
    import iree.runtime as rt

    index = 0 if index is None else index
    key = (driver, index)
    if key in _DEVICES:
        return _DEVICES[key]
    hardware = {"hip": "an AMD GPU with the HIP runtime", "cuda": "an NVIDIA GPU with its driver"}.get(driver, "")
    try:
        drv = rt.get_driver(driver)
        infos = drv.query_available_devices()
    except (RuntimeError, ValueError) as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        reason = reason.split("UNAVAILABLE; ", 1)[-1].rstrip(": ")  # drop IREE's source-file prefix
        needs = f" (needs {hardware})" if hardware else ""
        raise DeviceError(f"device: the {driver} driver is not usable here{needs}: {reason}") from None
    if driver.startswith("local"):
        device = drv.create_default_device()
    else:
        if index >= len(infos):
            raise DeviceError(
                f"device: the {driver} driver found {len(infos)} device(s); index {index} does not exist"
                + (f" (needs {hardware})" if hardware else "")
            )
        device = drv.create_device(infos[index]["device_id"])
    _DEVICES[key] = device
    return device


class NotEnoughMemoryError(MemoryError, ValueError):
    """Arrays would not fit in the memory available; raised before allocating them.

    A ``ValueError`` too, so the CLIs report it as one line like any other bad input.
    """


def available_memory() -> int | None:
    """Bytes a new allocation can take now: Linux's MemAvailable (free plus reclaimable cache, the
    figure psutil reports), else the free pages; None where neither can be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # no such sysconf name on this platform
        return None


def format_bytes(n: int) -> str:
    """``954.0 GiB``, ``12.5 MiB``: sizes as people read them in messages."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def check_memory(needs: list[tuple[str, int]], available: int | None = None) -> None:
    """Refuse, before allocating, arrays that will not fit in memory together.

    Args:
        needs: (name, bytes) of each array, in the order they will be allocated; all stay alive.
        available: bytes available; default :func:`available_memory` (no check where it is unknown).

    Raises:
        NotEnoughMemoryError: naming the first array that does not fit, what it needs and what is available.
    """
    available = available_memory() if available is None else available
    if available is None:
        return
    total = 0
    for name, nbytes in needs:
        before, total = total, total + nbytes
        if total > available:
            with_others = f" ({format_bytes(total)} with the {format_bytes(before)} before it)" if before else ""
            raise NotEnoughMemoryError(
                f"{name}: {format_bytes(nbytes)} needed{with_others}, {format_bytes(available)} available"
            )


def check_inputs(problem: Any, x: Any, dy: Any, driver: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Check x and dy against the problem's shapes and element type, and that running fits in memory.

    Args:
        problem: the :class:`~convbw_mlir.problem.ConvBwdWeightProblem`.
        x, dy: numpy arrays in the problem's layout.
        driver: the runtime driver that will run them; for ``local-*`` drivers the device buffers
            (copies of x and dy, x with its pads, dW) are host memory and are counted too.

    Raises:
        TypeError: not arrays, or the wrong dtype.
        ValueError: the wrong shape.
        NotEnoughMemoryError: the copies running needs do not fit in the memory available.
    """
    want = numpy_dtype(problem.dtype)
    arrays = []
    for name, arr, shape in (("x", x, problem.x_shape), ("dy", dy, problem.dy_shape)):
        if not isinstance(arr, np.ndarray):
            raise TypeError(f"{name}: expected a numpy array, got {type(arr).__name__}")
        if arr.dtype != want:
            raise TypeError(f"{name}: expected dtype {want} ({problem.dtype}), got {arr.dtype}")
        if tuple(arr.shape) != tuple(shape):
            raise ValueError(f"{name}: expected shape {tuple(shape)} ({'/'.join(problem.dims(name))}), got {arr.shape}")
        arrays.append(arr)
    needs = [
        (f"{name} (contiguous copy)", a.nbytes) for name, a in zip(("x", "dy"), arrays) if not a.flags.c_contiguous
    ]
    if driver is not None and driver.startswith("local"):
        needs += [("x (device copy)", arrays[0].nbytes), ("dy (device copy)", arrays[1].nbytes)]
        if any(problem.pad_low) or any(problem.pad_high):  # the lowering materialises x with its pads
            padded = [i + lo + hi for i, lo, hi in zip(problem.input_size, problem.pad_low, problem.pad_high)]
            elems = problem.batch * problem.groups * problem.in_channels * math.prod(padded)
            needs.append(("x padded (device)", elems * want.itemsize))
        needs.append(("dw (device)", math.prod(problem.dw_shape) * numpy_dtype(problem.dw_dtype).itemsize))
    check_memory(needs)
    return np.ascontiguousarray(arrays[0]), np.ascontiguousarray(arrays[1])


# NaN after a checked kernel's inputs: past the one tile a ragged loop over-reads (docs/torch.md, overread)
FENCE_BYTES = 1 << 20


def fenced_host(array: np.ndarray, slack_bytes: int = FENCE_BYTES) -> np.ndarray:
    """``array`` flattened, followed by at least ``slack_bytes`` of NaN (what a fenced device buffer holds)."""
    flat = np.full(array.size + -(-slack_bytes // array.itemsize), np.nan, dtype=array.dtype)
    flat[: array.size] = array.ravel()
    return flat


@dataclass
class Kernel:
    """A vmfb loaded on one device; ``__call__`` takes host or device arrays and returns a device array."""

    vmfb: bytes
    driver: str
    device_index: int | None = None
    function: str = "conv_bwd_weight"

    def __post_init__(self) -> None:
        import iree.runtime as rt

        refuse_tensor_maps(self.vmfb, self.function)
        self.device = open_device(self.driver, self.device_index)
        self.config = rt.Config(device=self.device)
        module = rt.VmModule.copy_buffer(self.config.vm_instance, self.vmfb)
        self._fn = rt.load_vm_module(module, self.config)[self.function]

    def to_device(self, array: np.ndarray) -> Any:
        import iree.runtime as rt

        return rt.asdevicearray(self.device, array)

    def to_device_fenced(self, array: np.ndarray, slack_bytes: int = FENCE_BYTES) -> Any:
        """``array`` on the device at the start of a larger buffer whose rest is NaN: a kernel that reads
        past the end of its input picks NaN up (finite garbage times a padding zero would hide it)."""
        import iree.runtime as rt

        flat = fenced_host(array, slack_bytes)
        name = next((n for n in _HAL_ELEMENT_TYPES if numpy_dtype(n) == array.dtype), None)
        if name is None:
            raise TypeError(f"array: dtype {array.dtype} is none of {', '.join(_HAL_ELEMENT_TYPES)}")
        element_type = getattr(rt.HalElementType, _HAL_ELEMENT_TYPES[name])
        staged = self.device.allocator.allocate_buffer_copy(
            memory_type=rt.MemoryType.DEVICE_LOCAL, allowed_usage=rt.BufferUsage.DEFAULT, device=self.device,
            buffer=flat, element_type=element_type,
        )  # fmt: skip
        view = rt.HalBufferView(staged.get_buffer(), list(array.shape), element_type)  # the first array.size only
        return rt.DeviceArray(self.device, view)

    def __call__(self, *args: Any) -> Any:
        return self._fn(*args)

    def run(self, *arrays: np.ndarray) -> np.ndarray:
        """Copy inputs in, run once, copy the result out."""
        return np.asarray(self(*[self.to_device(a) for a in arrays]).to_host())


# A timed batch lasts about this long, sharing its final read-back among its calls: docs/decisions.md#timing-batches
BATCH_SECONDS = 25e-3
MAX_BATCH = 64


def time_calls(
    fn: Any, *args: Any, warmup: int = 2, min_reps: int = 20, min_seconds: float = 0.2, sync: Any = None
) -> list[float]:
    """Seconds per call of ``fn(*args)`` on device-resident arguments.

    Calls are timed in batches that end by waiting for the device (reading the last result back, or
    ``sync()`` where given, e.g. torch.cuda.synchronize), until ``min_reps`` batches and ``min_seconds``
    have passed. Returns one figure per batch: its time divided by its number of calls.

    The batch size is fixed once, from one timed call after the warm-up (:data:`BATCH_SECONDS`), so every
    sample of a kernel is taken the same way (docs/decisions.md#timing-batches).
    """

    def _sync(result: Any) -> None:
        if sync is not None:
            sync()
        elif hasattr(result, "to_host"):
            result.to_host()

    for _ in range(warmup):
        _sync(fn(*args))
    t0 = time.perf_counter()
    _sync(fn(*args))
    one = time.perf_counter() - t0
    batch = max(1, min(MAX_BATCH, round(BATCH_SECONDS / max(one, 1e-9))))
    samples: list[float] = []
    start_all = time.perf_counter()
    while len(samples) < min_reps or time.perf_counter() - start_all < min_seconds:
        t0 = time.perf_counter()
        for _ in range(batch):
            out = fn(*args)
        _sync(out)
        samples.append((time.perf_counter() - t0) / batch)
        if len(samples) >= 10_000:
            break
    return samples


_HAL_ELEMENT_TYPES = {"f16": "FLOAT_16", "bf16": "BFLOAT_16", "f32": "FLOAT_32"}
# IREE's heap buffers (local-task) import only host memory aligned to this (iree/hal/buffer_heap.c).
HOST_ALIGNMENT = 64


class PreparedCall:
    """A kernel compiled with ``compile_op(..., output_arg=True)``, called without the Python invoker.

    dW is written into a buffer the caller owns (the function's ``{iree.abi.output = 0}`` argument), so
    nothing is allocated for the result per call; arguments are imported without copies (DLPack:
    torch tensors on the GPU or CPU, numpy arrays on the CPU); :meth:`prepare` builds the argument
    list once and :meth:`invoke` runs it through ``VmContext.invoke`` (docs/torch.md has what each step
    costs). The call is synchronous: it returns when dW is written.

    Args:
        vmfb: the module.
        driver: ``local-task``, ``cuda`` or ``hip``.
        device_index: the device among the driver's devices (None: the first).
        function: the exported function.

    Raises:
        ValueError: the vmfb's function has no output argument (compiled without ``output_arg=True``).
        DeviceError: no such device.
    """

    def __init__(self, vmfb: bytes, driver: str, device_index: int | None = None, function: str = "conv_bwd_weight"):
        import iree.runtime as rt

        refuse_tensor_maps(vmfb, function)
        self._rt = rt
        self.driver = driver
        self.device = open_device(driver, device_index)
        config = rt.Config(device=self.device)
        module = rt.VmModule.copy_buffer(config.vm_instance, vmfb)
        self._context = rt.VmContext(config.vm_instance, [*config.default_vm_modules, module])
        self._config = config  # keeps the instance and HAL module alive with the context
        fn = module.lookup_function(function)
        if fn is None:
            raise ValueError(f"vmfb: no function {function!r} (has {module.function_names})")
        if "iree.abi.output" not in fn.reflection.get("iree.abi.declaration", ""):
            raise ValueError(
                f"vmfb: {function} takes no output argument; compile with compile_op(..., output_arg=True)"
            )
        self._fn = fn
        # The tied output is a !hal.buffer (compile_op(output_arg=True)) or a tensor argument that is also
        # an input (an accumulate epilogue's D): the latter takes a buffer view.
        self._out_is_view = ": !hal.buffer {iree.abi.output" not in fn.reflection.get("iree.abi.declaration", "")
        # --iree-execution-model=async-external: the function takes a wait and a signal fence and
        # returns once the work is queued; calls are ordered on one timeline semaphore.
        self.is_async = fn.reflection.get("iree.abi.model") == "coarse-fences"
        self._timeline = self.device.create_semaphore(0) if self.is_async else None
        self._tick = 0

    def element_type(self, dtype: str) -> Any:
        """IREE's element type for ``f16``, ``bf16`` or ``f32``."""
        return getattr(self._rt.HalElementType, _HAL_ELEMENT_TYPES[dtype])

    def import_dlpack(self, obj: Any, shape: tuple[int, ...], dtype: str, name: str = "array") -> Any:
        """A buffer view of ``shape`` over ``obj``'s memory, without a copy.

        Args:
            obj: anything with ``__dlpack__`` (a torch tensor, a numpy array), dense (C-contiguous) in
                the order ``shape`` gives, on this device's memory.
            shape: the shape the kernel takes (same element count, e.g. ``(N, G, C, H, W)`` for an
                ``(N, G*C, H, W)`` tensor).
            dtype: its element type name.
            name: the argument's name, for errors.

        Raises:
            ValueError: IREE refused the memory (wrong device, misaligned host memory), naming ``name``.
        """
        try:
            view = self.device.from_dlpack_capsule(obj.__dlpack__())
        except (IndexError, ValueError, RuntimeError, BufferError, TypeError) as e:
            raise ValueError(f"{name}: IREE's {self.driver} device cannot import it: {e}") from None
        return self._rt.HalBufferView(view.get_buffer(), list(shape), self.element_type(dtype))

    def prepare(self, x: Any, dy: Any, out: Any) -> Any:
        """The argument list for ``x``, ``dy`` (buffer views in the kernel's shapes) and ``out`` (a buffer
        view or buffer dW is written into); reusable for every call on the same memory."""
        args = self._rt.VmVariantList(3)
        args.push_ref(x.ref)
        args.push_ref(dy.ref)
        if self._out_is_view:
            args.push_ref(out.ref)
        else:
            args.push_ref(out.get_buffer().ref if hasattr(out, "get_buffer") else out.ref)
        return args

    def invoke(self, args: Any, wait: bool = True) -> None:
        """Run once on a prepared argument list; returns when dW is written.

        Args:
            wait: for an async-external module, False returns once the call is queued (after the
                previous one, on this kernel's timeline); :meth:`wait` waits for all queued calls.
        """
        if not self.is_async:
            self._context.invoke(self._fn, args, self._rt.VmVariantList(1))
            return
        full = self._rt.VmVariantList(len(args) + 2)
        for i in range(len(args)):
            full.push_ref(args.get_as_ref(i))
        full.push_ref(self._rt.HalFence.create_at(self._timeline, self._tick).ref)
        self._tick += 1
        full.push_ref(self._rt.HalFence.create_at(self._timeline, self._tick).ref)
        self._context.invoke(self._fn, full, self._rt.VmVariantList(1))
        if wait:
            self.wait()

    def wait(self) -> None:
        """Wait until every call queued with ``invoke(..., wait=False)`` has finished."""
        if self.is_async:
            self._timeline.wait(self._tick)

    def __call__(self, x: Any, dy: Any, out: Any) -> None:
        self.invoke(self.prepare(x, dy, out))

    def import_numpy(self, arr: np.ndarray, dtype: str, name: str = "array") -> Any:
        """A buffer view over a numpy array's memory (host drivers only), without a copy.

        Raises:
            ValueError: a GPU driver (numpy arrays are host memory: use ``CompiledOp.run``), or an array
                that is not C-contiguous, 64-byte aligned (:func:`aligned_empty`) and writable; naming
                ``name``.
        """
        if not self.driver.startswith("local"):
            raise ValueError(f"{name}: a numpy array is host memory; the {self.driver} device takes device memory")
        problems = []
        if not arr.flags.c_contiguous:
            problems.append("not C-contiguous")
        if arr.ctypes.data % HOST_ALIGNMENT:
            problems.append(f"not {HOST_ALIGNMENT}-byte aligned (use runtime.aligned_empty)")
        if not arr.flags.writeable:
            problems.append("read-only (numpy's DLPack export refuses those)")
        if problems:
            raise ValueError(f"{name}: cannot be passed without a copy: {', '.join(problems)}")
        return self.import_dlpack(arr, arr.shape, dtype, name)


def aligned_empty(shape: tuple[int, ...], dtype: Any, alignment: int = HOST_ALIGNMENT) -> np.ndarray:
    """An uninitialised C-contiguous array whose data starts on an ``alignment``-byte boundary."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    raw = np.empty(nbytes + alignment, np.uint8)
    start = -raw.ctypes.data % alignment
    return raw[start : start + nbytes].view(dtype).reshape(shape)
