"""bench/host_path.py, the switch's host cost a call on a CPU (issue 37 item 3): its stub of the CUDA driver stays
the driver's (prototypes checked against the launcher's ctypes declarations, and cuda.h where installed), and it
drives the real launch: the driver calls a call it counts are the schedule's, on the Python path and the C++ one.

Named to run after test_torch_ops.py: the C++ kernel, once registered, stays for the process."""

import json

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (an optional extra: pip install .[torch])")
from conftest import bench_script  # noqa: E402

from convbw_mlir import cuda_launch  # noqa: E402
from convbw_mlir.cuda_launch import Dispatch, ExportDef, Launch, TensorMap  # noqa: E402
from convbw_mlir.policies import sm90  # noqa: E402
from convbw_mlir.problem import ConvBwdWeightProblem  # noqa: E402

hp = bench_script("host_path")
PROBLEM = "2 1 8 64 64 3 3 8 8 1 1 1 1 1 1 1 1"  # test_sm90_product.py's TINY: x (8, 64, 8, 8), 3x3, pad 1


@pytest.fixture(scope="module")
def stub(tmp_path_factory):
    return hp.build_stub(tmp_path_factory.mktemp("stub"))


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    """One sm_90a-like kernel folder: the wgmma kernel with its two tensor maps, then a second stage (split-K's sum)."""
    problem = ConvBwdWeightProblem.from_ck(PROBLEM).with_(layout=2, dtype="bf16")
    maps = [TensorMap(**m) for m in sm90.tensor_maps(problem, "k0")]
    launch = Launch("f", [Dispatch("k0", (4, 1, 1), (("arg1", 0), ("arg0", 0), ("transient", 0)), (3,)),
                          Dispatch("k1", (1, 1, 1), (("transient", 256), ("arg2", 0)))],
                    4096, (0, 0, 0), {"k0": ExportDef("k0", 0, (384, 1, 1), 1024, 1, 3),
                                      "k1": ExportDef("k1", 0, (128, 1, 1), 0, 0, 2)},
                    [b".version 8.0\n.target sm_90a\n"], tensor_maps=maps)  # fmt: skip
    root = tmp_path_factory.mktemp("ts")
    folder = root / "tiny" / "v-1"
    folder.mkdir(parents=True)
    for name, data in launch.files().items():
        (folder / name).write_bytes(data)
    (root / "tiny" / "op.json").write_text(json.dumps({"problem": problem.to_dict(), "launch": True, "files": "v-1"}))
    return root


def test_the_cuda_stub_has_every_driver_function_the_launch_calls_as_the_launcher_declares_it(stub):
    hp.check_signatures()  # raises naming what drifted
    assert hp.Counters(stub).names[:2] == ["cuInit", "cuDeviceGet"]


@pytest.mark.parametrize(
    ("function", "params", "message"),
    [("cuMemsetD8Async", ["CUdeviceptr", "unsigned char", "size_t"], "cuMemsetD8Async: 3 parameters in the stub, 4"),
     ("cuLaunchKernel", ["CUfunction", *["unsigned int"] * 7, "int", "void**", "void**"],
      "cuLaunchKernel: parameter 8 is int in the stub, c_void_p"),
     ("cuMemcpyHtoDAsync_v2", ["CUdeviceptr", "void*", "int", "CUstream"],
      "cuMemcpyHtoDAsync_v2: parameter 2 is int in the stub, c_ulong"),
     ("cuTensorMapEncodeTiled", None, "cuTensorMapEncodeTiled: not in bench/cuda_stub.c")],
)  # fmt: skip
def test_a_stub_that_drifts_from_the_drivers_calls_is_an_error_naming_the_function(function, params, message):
    prototypes = hp.stub_prototypes()
    if params is None:
        del prototypes[function]
    else:
        prototypes[function] = params
    with pytest.raises(RuntimeError, match=message.replace("*", r"\*")):
        hp.check_signatures(prototypes)


def test_the_harness_counts_the_schedules_driver_calls_a_call_on_the_python_and_cxx_launch_paths(
    stub, artifacts, monkeypatch, tmp_path
):
    from convbw_mlir.torch import native

    monkeypatch.setenv(native.DIR_ENV, str(hp.HERE.parent / "build" / "native"))
    (layer,) = hp.layers(artifacts)
    assert (layer.x_shape, layer.dy_shape, layer.w_shape) == ((8, 64, 8, 8), (8, 64, 8, 8), (64, 64, 3, 3))
    counters = hp.Counters(stub)
    got = {}
    with hp.stubbed(stub):
        work = hp.Workload([layer], period=64)
        for path in ("python", "cxx_launch"):  # the Python path first: the C++ kernel stays once registered
            for memory in ("moving", "repeat"):
                got[path, memory] = hp.measure(path, memory, work, counters, passes=4, profile=path == "python")
    assert cuda_launch._LIB is None or cuda_launch._LIB._name != stub._name  # the stub is put back
    moving = got["python", "moving"]["driver_calls_per_call"]
    # a new x, dy pair every call: both maps encoded for it and copied, then the two kernels
    assert moving["cuTensorMapEncodeTiled"] == moving["cuTensorMapEncodeIm2col"] == moving["cuMemcpyHtoDAsync_v2"] == 1
    assert moving["cuLaunchKernel"] == 2
    # the same x and dy every call: nothing encoded again; the graph recorded on a memory's second call replayed
    # (where the CPU allocator hands dW's block back: it keys the graph too)
    repeat = got["python", "repeat"]["driver_calls_per_call"]
    assert not {"cuTensorMapEncodeTiled", "cuTensorMapEncodeIm2col", "cuMemcpyHtoDAsync_v2"} & set(repeat)
    assert repeat["cuGraphLaunch"] > 0
    # C++ launches the same schedule itself: the same driver calls, no Python (its stream check instead of the
    # Python launcher's context check)
    cxx = dict(got["cxx_launch", "moving"]["driver_calls_per_call"])
    assert cxx.pop("cuStreamIsCapturing") == 1 and moving.pop("cuCtxGetCurrent") == 1 and cxx == moving
    assert moving["cuEventRecord"] == 1  # the maps' slot marked read by the kernel just queued (not reused before)
    assert got["cxx_launch", "moving"]["cxx_plain_launches_per_call"] == 1
    assert all(r["ours"] == 1 for r in got.values())
    assert got["python", "moving"]["profile_us_per_call"]  # cProfile's rows: where the Python path's time goes


def test_tensor_map_slots_stay_bounded_over_10000_moving_pairs_and_reuse_waits_while_the_gpu_reads(
    stub, artifacts, monkeypatch
):
    # issue 37: every new x, dy pair kept a slot of device and pinned memory for good (10,478 held after 10,400
    # calls: bench/results/cpu_2026-12-06_slots/); now a pool of $CONVBW_TENSOR_MAP_SLOTS a kernel, on both paths
    from convbw_mlir.torch import native

    monkeypatch.setenv(native.DIR_ENV, str(hp.HERE.parent / "build" / "native"))
    monkeypatch.setenv(cuda_launch.MAP_SLOTS_ENV, "4")
    counters = hp.Counters(stub)
    got = {}
    with hp.stubbed(stub):
        work = hp.Workload(hp.layers(artifacts), period=20_000)
        for path in ("python", "cxx_launch"):
            got[path] = hp.measure(path, "moving", work, counters, passes=5_000, profile=False)
        stub.stub_hold_events(1)  # the GPU reads nothing until a wait: every reuse of a slot waits for its reads
        try:
            held = hp.measure("python", "moving", work, counters, passes=20, profile=False)
        finally:
            stub.stub_hold_events(0)
    python, cxx = got["python"], got["cxx_launch"]
    assert python["calls"] + cxx["calls"] >= 10_000 and python["maps_held"] == 4 and cxx["maps_held_cxx"] == 4
    assert python["driver_calls_per_call"]["cuTensorMapEncodeTiled"] == 1  # a new pair every call, all encoded
    assert cxx["driver_calls_per_call"]["cuTensorMapEncodeTiled"] == 1 and cxx["cxx_plain_launches_per_call"] == 1
    # held: 3 warm-up calls and the first timed one take fresh slots, each later one waits for the oldest slot
    assert python["map_waits"] == 0 and held["maps_held"] == 4 and held["map_waits"] == 19
    assert held["driver_calls_per_call"]["cuEventSynchronize"] == 19 / 20
