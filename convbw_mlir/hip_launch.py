"""Direct HIP launch: a HIP module's schedule launched on a caller's stream (torch's ROCm stream), without
IREE's runtime, as :class:`convbw_mlir.cuda_launch.CudaLauncher` does on CUDA.

The launch (:func:`convbw_mlir.build.hip_schedule.compile_with_hip_launch`) is checked against its code objects
first (:func:`convbw_mlir.build.hip_schedule.check_hip_launch`: kernarg layout, workgroup size, LDS), then the
HSACO images are loaded once per device with ``hipModuleLoadData`` and each dispatch is a
``hipModuleLaunchKernel`` on the given stream with IREE's HIP ABI (one pointer per binding, then one 32-bit
constant each, in 8-byte slots; 0 bytes of dynamic shared memory); fills and copies are async
memsets/copies. Never run on an AMD GPU here (none exists): without ``libamdhip64`` or without a device,
the one error is :class:`HipUnavailable`.

IREE 3.13's runtime also takes an external stream: ``HalDriver.create_device(device_id,
params={"hip_external_stream": str(stream)})`` (runtime/src/iree/hal/drivers/hip/hip_driver.c) makes IREE's
HIP device queue its work on that stream, but each call still runs IREE's VM and HAL on the host.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

from convbw_mlir.cuda_launch import Launch, launch_plan
from convbw_mlir.hip_code_object import check_hip_launch

__all__ = ["HipError", "HipLauncher", "HipUnavailable"]

# the ROCm runtime's library: the unversioned name (a ROCm install's development link), then its sonames
LIBRARIES = ("libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6")
_HIP_MEMCPY_DEVICE_TO_DEVICE = 3  # hipMemcpyKind
_LIB: Any = None
_LIB_LOCK = threading.Lock()


class HipError(RuntimeError):
    """A HIP call failed; the message names the call and HIP's error."""


class HipUnavailable(HipError):
    """No HIP runtime library or no AMD GPU on this machine."""


def _libhip() -> Any:
    """``libamdhip64`` with the few functions the launcher calls (argument types declared), initialized.

    Raises:
        HipUnavailable: the library is not found or finds no device.
    """
    global _LIB
    with _LIB_LOCK:
        if _LIB is not None:
            return _LIB
        lib = None
        for name in LIBRARIES:
            try:
                lib = ctypes.CDLL(name)
                break
            except OSError:
                continue
        if lib is None:
            raise HipUnavailable(f"HIP: no ROCm runtime on this machine ({' / '.join(LIBRARIES)} not found)")
        vp, u32, sz, i32 = ctypes.c_void_p, ctypes.c_uint, ctypes.c_size_t, ctypes.c_int
        pvp = ctypes.POINTER(vp)
        sigs = {
            "hipInit": [u32],
            "hipGetDeviceCount": [ctypes.POINTER(i32)],
            "hipSetDevice": [i32],
            "hipModuleLoadData": [pvp, vp],
            "hipModuleGetFunction": [pvp, vp, ctypes.c_char_p],
            "hipModuleLaunchKernel": [vp, u32, u32, u32, u32, u32, u32, u32, vp, vp, vp],
            "hipMemsetD8Async": [vp, ctypes.c_ubyte, sz, vp],
            "hipMemsetD16Async": [vp, ctypes.c_ushort, sz, vp],
            "hipMemsetD32Async": [vp, i32, sz, vp],
            "hipMemcpyAsync": [vp, vp, sz, i32, vp],
        }
        for name, args in sigs.items():
            f = getattr(lib, name)
            f.argtypes, f.restype = args, ctypes.c_int
        lib.hipGetErrorString.argtypes, lib.hipGetErrorString.restype = [ctypes.c_int], ctypes.c_char_p
        rc = lib.hipInit(0)
        count = ctypes.c_int(0)
        if rc or lib.hipGetDeviceCount(ctypes.byref(count)) or count.value == 0:
            why = f"hipInit: {_error(lib, rc)}" if rc else "hipGetDeviceCount: no device"
            raise HipUnavailable(f"HIP: no AMD GPU on this machine ({why})")
        lib.device_count = count.value
        _LIB = lib
    return _LIB


def _error(lib: Any, rc: int) -> str:
    return f"HIP error {rc} ({(lib.hipGetErrorString(rc) or b'?').decode()})"


def _check(lib: Any, rc: int, what: str) -> None:
    if rc:
        raise HipError(f"{what}: {_error(lib, rc)}")


class HipLauncher:
    """A :class:`Launch` of a HIP module on one AMD device: its HSACO loaded once, each call a few async
    HIP calls on the caller's stream.

    Args:
        launch: a supported schedule (``launch.refused is None``) whose ``ptx`` holds HSACO images.
        device: the HIP device ordinal (torch's index on ROCm).
        arch: the device's processor (``gfx942``); the code objects must be for it (checked where given).

    Raises:
        ValueError: a refused launch, or ``device`` not a device of this machine.
        CodeObjectError, LaunchMismatch: the code objects disagree with the launch (before any HIP call).
        HipUnavailable: no ROCm runtime or no AMD GPU.
        HipError: HIP refused a code object or a kernel.
    """

    def __init__(self, launch: Launch, device: int, arch: str | None = None) -> None:
        check_hip_launch(launch, arch)  # before the device: a launch that disagrees never reaches it
        lib = self._lib = _libhip()
        if not 0 <= device < lib.device_count:
            raise ValueError(f"device: {device} is not one of this machine's {lib.device_count} AMD GPUs")
        self.launch, self.device = launch, device
        self._lock = threading.Lock()  # the kernels' parameter arrays are shared: one call fills them at a time
        _check(lib, lib.hipSetDevice(device), "hipSetDevice")
        self._images = [ctypes.create_string_buffer(bytes(image), len(image)) for image in launch.ptx]
        modules = []
        for i, image in enumerate(self._images):
            mod = ctypes.c_void_p()
            _check(lib, lib.hipModuleLoadData(ctypes.byref(mod), image), f"hipModuleLoadData(code object {i})")
            modules.append(mod)
        self._modules = modules  # never unloaded: a process keeps its kernels (as IREE's executable cache)
        funcs = {}
        for e in launch.exports.values():
            f = ctypes.c_void_p()
            _check(lib, lib.hipModuleGetFunction(ctypes.byref(f), modules[e.module], e.name.encode()),
                   f"hipModuleGetFunction({e.name})")  # fmt: skip
            funcs[e.name] = f.value
        self._plan, self._params = launch_plan(launch, funcs, dynamic_shared=False)  # no dynamic LDS on AMD

    def __call__(
        self, pointers: tuple[int, ...], stream: int, maps_stream: int | None = None, captured: bool | None = None
    ) -> None:
        """Queue the schedule on ``stream`` (a ``hipStream_t``; torch's ``cuda_stream`` on ROCm):
        ``pointers`` are the arguments' device addresses and the transient workspace's (``maps_stream``,
        ``captured``: the CUDA launcher's; AMD kernels read no tensor maps).

        Raises:
            HipError: a launch failed (the message names the kernel).
        """
        lib = self._lib
        with self._lock:
            for step in self._plan:
                if step[0] == "k":
                    _, func, dims, payload, params, binds, name = step
                    for i, (which, off) in enumerate(binds):
                        payload[i] = pointers[which] + off
                    _check(lib, lib.hipModuleLaunchKernel(func, *dims, stream, params, None),
                           f"hipModuleLaunchKernel({name})")  # fmt: skip
                    continue
                kind, (t, toff), length, src, pattern, width = step
                dst = pointers[t] + toff
                if kind == "copy":
                    rc = lib.hipMemcpyAsync(
                        dst, pointers[src[0]] + src[1], length, _HIP_MEMCPY_DEVICE_TO_DEVICE, stream
                    )
                    _check(lib, rc, "hipMemcpyAsync")
                else:
                    fill = {1: lib.hipMemsetD8Async, 2: lib.hipMemsetD16Async, 4: lib.hipMemsetD32Async}[width]
                    if width == 4 and pattern >= 1 << 31:  # hipMemsetD32Async takes a signed int
                        pattern -= 1 << 32
                    _check(lib, fill(dst, pattern, length // width, stream), f"hipMemsetD{8 * width}Async")
