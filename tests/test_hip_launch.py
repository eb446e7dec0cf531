"""The direct HIP launch to the device's door: the schedule and the HSACO code objects read from real IREE
compiles for gfx942, gfx1100 and gfx1200, checked against the code objects' own metadata and kernel descriptors;
corrupt code objects and disagreeing launches refused with one error; the launcher's HIP calls (a fake
libamdhip64) pass the kernarg layout the code object declares; no AMD GPU: one error. No AMD GPU exists
here: the launch itself is unproven on hardware (docs/explicit-kernels.md, AMD)."""

from __future__ import annotations

import ctypes
import dataclasses
import struct

import pytest

from convbw_mlir import hip_launch
from convbw_mlir.build.hip_schedule import compile_with_hip_launch, hip_executables_in_vmfb, read_hip_executable
from convbw_mlir.cuda_launch import Dispatch, Launch
from convbw_mlir.hip_code_object import (
    CodeObjectError,
    LaunchMismatch,
    check_hip_launch,
    kernel_arguments,
    read_code_object,
)
from convbw_mlir.hip_launch import HipLauncher, HipUnavailable
from convbw_mlir.plan import explicit_tiling
from convbw_mlir.problem import ConvBwdWeightProblem as P

pytest.importorskip("iree.compiler")
pytest.importorskip("msgpack")

RAGGED = P.from_ck("2 1 2 36 256 3 3 7 7 2 2 1 1 1 1 1 1", layout=4)  # our explicit kernel: every edge ragged
SPLIT = P.from_ck("2 960 32 1 1 3 3 7 7 1 1 1 1 1 1 1 1")  # IREE's own: pad, partial products, reduction
WAVE = {"gfx942": 64, "gfx1100": 32, "gfx1200": 32}
_COMPILED: dict = {}


def _compiled(problem: P, target: str, **options) -> tuple:
    """(op, vmfb, launch) of ``problem`` on ``target``, compiled once per session."""
    from convbw_mlir import compile_op

    key = (problem, target, tuple(options.items()))
    if key not in _COMPILED:
        op = compile_op(problem, target, output_arg=True, **options)
        _COMPILED[key] = (op, *compile_with_hip_launch(op.stages["linalg"], target, None))
    return _COMPILED[key]


@pytest.mark.parametrize("target", ["gfx942", "gfx1100", "gfx1200"])
def test_explicit_kernel_launch_agrees_with_its_code_object(target: str) -> None:
    op, vmfb, launch = _compiled(RAGGED, target, strategy="explicit")
    assert launch.refused is None, launch.refused
    (step,) = launch.steps
    objects = check_hip_launch(launch, target)
    kernel = objects[step.kernel].kernels[step.kernel]
    tiling = explicit_tiling(op.plan)
    assert kernel.kernarg_size == 24 == sum(size for _, size in kernel_arguments(3, 0))  # three pointers
    assert kernel.group_segment == tiling.lds_bytes() == kernel.descriptor.group_segment  # the planned LDS
    assert launch.exports[step.kernel].block == kernel.reqd_workgroup_size == (tiling.threads, 1, 1)
    assert kernel.wavefront_size == WAVE[target] and kernel.descriptor.wave32 == (WAVE[target] == 32)
    assert kernel.private_segment == 0  # no scratch
    # the vmfb carries the very code object the schedule was read with
    (executable,) = hip_executables_in_vmfb(vmfb)
    assert read_hip_executable(executable)[1] == launch.ptx


@pytest.mark.parametrize("target", ["gfx942", "gfx1100"])
def test_iree_split_schedule_agrees_with_each_kernels_code_object(target: str) -> None:
    _, _, launch = _compiled(SPLIT, target)
    assert launch.refused is None, launch.refused
    assert [type(s) for s in launch.steps] == [Dispatch] * 3 and launch.transient > 0
    objects = check_hip_launch(launch, target)
    for s in launch.steps:
        k = objects[s.kernel].kernels[s.kernel]
        assert k.kernarg_size == 8 * len(s.bindings) and k.wavefront_size == WAVE[target]
        assert launch.exports[s.kernel].block == k.reqd_workgroup_size


def test_kernel_arguments_pack_constants_after_the_pointers_at_their_alignment() -> None:
    assert kernel_arguments(2, 3) == ((0, 8), (8, 8), (16, 4), (20, 4), (24, 4))
    assert kernel_arguments(0, 0) == ()


def _image(target: str = "gfx942") -> bytes:
    return _compiled(RAGGED, target, strategy="explicit")[2].ptx[0]


def _note_type_offset(image: bytes) -> int:
    """The byte offset of the NT_AMDGPU_METADATA note's type field."""
    at = image.index(b"AMDGPU\0\0") - 4
    assert struct.unpack_from("<I", image, at)[0] == 32
    return at


def _corrupt(how: str) -> bytes:
    image = bytearray(_image())
    if how == "truncated":
        return bytes(image[: len(image) // 2])
    if how == "magic":
        image[1:4] = b"XYZ"
    elif how == "machine":
        image[18:20] = struct.pack("<H", 62)  # EM_X86_64
    elif how == "note type":
        image[_note_type_offset(image)] = 31
    elif how == "metadata":
        start = _note_type_offset(image) + 12
        image[start : start + 16] = b"\xc1" * 16  # 0xc1: never used in msgpack
    return bytes(image)


@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("truncated", "past the file's"),
        ("magic", "not an ELF file"),
        ("machine", "e_machine 62, expected 224"),
        ("note type", "0 NT_AMDGPU_METADATA notes"),
        ("metadata", "not msgpack"),
    ],
)
def test_corrupt_code_object_is_refused_with_one_line(how: str, message: str) -> None:
    with pytest.raises(CodeObjectError, match=message) as e:
        read_code_object(_corrupt(how))
    assert "\n" not in str(e.value)
    launch = dataclasses.replace(_compiled(RAGGED, "gfx942", strategy="explicit")[2], ptx=[_corrupt(how)])
    with pytest.raises(CodeObjectError):  # the launcher checks before it looks for a device
        HipLauncher(launch, 0)


def test_corrupt_executable_and_vmfb_are_refused() -> None:
    _, vmfb, _ = _compiled(RAGGED, "gfx942", strategy="explicit")
    (executable,) = hip_executables_in_vmfb(vmfb)
    with pytest.raises(CodeObjectError, match="not an IREE HIP executable"):
        read_hip_executable(b"CDA1" + executable[4:])
    with pytest.raises(CodeObjectError, match="vmfb: no IREE bytecode module"):
        hip_executables_in_vmfb(vmfb[:200])


def _mismatched(change: str) -> Launch:
    launch = _compiled(RAGGED, "gfx942", strategy="explicit")[2]
    (step,) = launch.steps
    e = launch.exports[step.kernel]
    if change == "block":
        return dataclasses.replace(launch, exports={e.name: dataclasses.replace(e, block=(256, 1, 1))})
    if change == "shared memory":
        return dataclasses.replace(launch, exports={e.name: dataclasses.replace(e, shared_memory=1024)})
    return dataclasses.replace(launch, steps=[dataclasses.replace(step, constants=(7,))])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("block", r"workgroup size: the launch has \(256, 1, 1\), the code object \(512, 1, 1\)"),
        ("shared memory", "dynamic shared memory: the launch has 1024, the code object 0"),
        ("constant", r"kernel arguments \(offset, size\): the launch has \[.*\(24, 4\)\]"),
    ],
)
def test_launch_that_disagrees_with_the_code_object_is_refused_naming_the_field(change: str, message: str) -> None:
    with pytest.raises(LaunchMismatch, match=message):
        check_hip_launch(_mismatched(change))


def test_code_object_for_another_processor_is_refused() -> None:
    with pytest.raises(LaunchMismatch, match="gemm: target: the launch has gfx1100, the code object gfx942"):
        check_hip_launch(_compiled(RAGGED, "gfx942", strategy="explicit")[2], "gfx1100")


def test_no_hip_runtime_is_one_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hip_launch, "_LIB", None)
    monkeypatch.setattr(hip_launch, "LIBRARIES", ("libconvbw-test-no-such-hip.so",))
    with pytest.raises(HipUnavailable, match=r"^HIP: no ROCm runtime on this machine \(libconvbw") as e:
        HipLauncher(_compiled(RAGGED, "gfx942", strategy="explicit")[2], 0)
    assert "\n" not in str(e.value)


class _FakeHip:
    """libamdhip64 as the launcher calls it: records each kernel launch's arguments, packed as the HIP
    runtime packs kernelParams into the kernarg segment (each value at the code object's offset and size)."""

    device_count = 1

    def __init__(self, args: tuple) -> None:
        self.args, self.launches, self.loaded = args, [], []

    def hipSetDevice(self, device):
        return 0

    def hipModuleLoadData(self, out, image):
        self.loaded.append(bytes(image))
        return 0

    def hipModuleGetFunction(self, out, module, name):
        ctypes.cast(out, ctypes.POINTER(ctypes.c_void_p))[0] = 0x1000 + len(name)
        return 0

    def hipModuleLaunchKernel(self, f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        kernarg = bytearray(max(off + size for off, size, _ in self.args))
        slots = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))
        for i, (off, size, _) in enumerate(self.args):
            kernarg[off : off + size] = ctypes.string_at(slots[i], size)
        self.launches.append(((gx, gy, gz), (bx, by, bz), shared, stream, bytes(kernarg), extra))
        return 0


def test_launcher_passes_the_kernarg_segment_the_code_object_declares(monkeypatch: pytest.MonkeyPatch) -> None:
    launch = _compiled(RAGGED, "gfx942", strategy="explicit")[2]
    (step,) = launch.steps
    kernel = read_code_object(launch.ptx[0]).kernels[step.kernel]
    fake = _FakeHip(kernel.args)
    monkeypatch.setattr(hip_launch, "_libhip", lambda: fake)
    launcher = HipLauncher(launch, 0, "gfx942")
    assert fake.loaded == launch.ptx
    x, dy, dw = 0x7F0000000000, 0x7F0000100000, 0x7F0000200000
    launcher((x, dy, dw, 0), stream=0xABC)
    ((grid, block, shared, stream, kernarg, extra),) = fake.launches
    assert (grid, block, shared, stream, extra) == (step.grid, kernel.reqd_workgroup_size, 0, 0xABC, None)
    by_name = {"arg0": x, "arg1": dy, "arg2": dw}
    assert kernarg == struct.pack("<3Q", *(by_name[b] + off for b, off in step.bindings))


def test_launcher_refuses_a_device_this_machine_lacks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hip_launch, "_libhip", lambda: _FakeHip(()))
    with pytest.raises(ValueError, match="device: 3 is not one of this machine's 1 AMD GPUs"):
        HipLauncher(_compiled(RAGGED, "gfx942", strategy="explicit")[2], 3)


def test_compile_op_for_hip_carries_a_checked_launch_that_survives_the_cache_and_a_save(tmp_path) -> None:
    # what the torch entry's direct HIP call loads: compiled once, from the kernel cache, and from a saved folder
    from convbw_mlir import CompiledOp, compile_op

    op = compile_op(RAGGED, "gfx942", output_arg=True, cache=tmp_path / "cache", strategy="explicit")
    assert op.launch is not None and op.launch.refused is None
    check_hip_launch(op.launch, "gfx942")  # the code objects agree with what the launch passes
    hit = compile_op(RAGGED, "gfx942", output_arg=True, cache=tmp_path / "cache", strategy="explicit")
    assert hit.launch == op.launch
    assert CompiledOp.load(op.save(tmp_path / "saved")).launch == op.launch


def test_the_torch_entry_launches_a_hip_kernel_through_the_hip_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    ct_entry = pytest.importorskip("convbw_mlir.torch.entry")
    op, _, launch = _compiled(RAGGED, "gfx942", strategy="explicit")
    (step,) = launch.steps
    fake = _FakeHip(read_code_object(launch.ptx[0]).kernels[step.kernel].args)
    monkeypatch.setattr(hip_launch, "_libhip", lambda: fake)
    call = ct_entry.call_for(op, "hip", 0)
    assert isinstance(call.launcher, HipLauncher) and fake.loaded == launch.ptx
