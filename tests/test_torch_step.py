"""A training step through the switch on an H100/H200, what runs here: the switch's direct-kernel call, the
target each problem is compiled for ahead of a compute-capability 9.0 GPU, the loaded-kernel report, and the
ResNet-50 stages of examples/torch_enable.py and bench/torch_step.py (docs/torch.md#a-training-step)."""

import importlib.util
import sys

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (an optional extra: pip install .[torch])")
from convbw_mlir import torch as ct  # noqa: E402 - after the skip: it needs torch
from convbw_mlir.plan_data import Plan, Strategy, Tile  # noqa: E402
from convbw_mlir.problem import ConvBwdWeightProblem  # noqa: E402
from convbw_mlir.torch import entry as ct_entry  # noqa: E402


def _example():
    from conftest import ROOT

    spec = importlib.util.spec_from_file_location("torch_enable", ROOT / "examples" / "torch_enable.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    return example


pytestmark = pytest.mark.usefixtures("torch_switch_off")  # conftest: the switch off before and after


def test_the_switch_calls_a_direct_kernel_itself_without_the_entry_points_per_call_memo(monkeypatch):
    # a training step is host-bound at ResNet-50 layer3's sizes: conv_weight's argument memo (~5-10 µs a call) is
    # paid once, when the decision is made, not per weight gradient
    kernel = object.__new__(ct_entry.DirectCall)  # a direct launch whose kernel writes 7s (no GPU here)
    launched = []
    monkeypatch.setattr(ct_entry.DirectCall, "__call__", lambda self, x, dy, out: launched.append(1) or out.fill_(7))
    monkeypatch.setattr(ct_entry, "kernel_for", lambda problem, device: kernel)
    monkeypatch.setattr(ct_entry, "_PROBLEMS", {})  # so no other test meets this kernel
    entry_calls = []
    real = ct_entry.conv_weight
    monkeypatch.setattr(ct_entry, "conv_weight", lambda *a, **k: entry_calls.append(1) or real(*a, **k))
    conv = torch.nn.Conv2d(4, 8, 3, padding=1, bias=False)
    x = torch.randn(2, 4, 6, 6, requires_grad=True)
    ct.enable()
    for _ in range(2):
        conv.weight.grad = None
        conv(x).square().sum().backward()
        assert torch.equal(conv.weight.grad, torch.full_like(conv.weight, 7))
    assert ct.stats() == {"ours": 2} and len(launched) == 2
    assert entry_calls == []


def _problem(c: int, k: int = 64, layout: int = 2, dtype: str = "bf16") -> ConvBwdWeightProblem:
    return ConvBwdWeightProblem(1, 8, c, k, (8, 8), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1), dtype=dtype, layout=layout)


@pytest.mark.parametrize(
    "capability, problem, target",
    [
        ((9, 0), _problem(64), "sm_90a"),  # the Hopper kernel takes it
        ((9, 0), _problem(3), "sm_80"),  # 3 channels: not an im2col box of 64
        ((9, 0), _problem(64, layout=4), "sm_90a"),  # NCHW: its layout-2 copies take the Hopper kernel
        ((9, 0), _problem(64, layout=4).with_(filter_size=(1, 1), pad_low=(0, 0), pad_high=(0, 0)), "sm_80"),
        ((9, 0), None, "sm_80"),
        ((10, 0), _problem(64), "sm_80"),  # sm_90a PTX runs on 9.0 only
        ((8, 0), _problem(64), "sm_80"),
    ],
    ids=["takes", "few-channels", "layout4", "layout4-1x1", "no-problem", "cc100", "cc80"],
)
def test_cuda_target_is_sm90a_only_on_cc90_for_what_the_hopper_kernel_takes(capability, problem, target):
    assert ct.cuda_target(capability, problem) == target


def test_an_older_gpu_than_sm80_is_one_error_naming_its_capability():
    with pytest.raises(ValueError, match=r"^input: compute capability 7\.5 is older than IREE's sm_80 target"):
        ct.cuda_target((7, 5), _problem(64))


def test_precompile_sm90a_compiles_each_problem_for_the_target_an_h100_asks_for_it(monkeypatch, tmp_path):
    # before: every problem was compiled for sm_90a, and ResNet-50's 3-channel stem, which an H100 looks up under
    # sm_80, was missing there (no compiler on the GPU machine: torch's dW, with a warning)
    import convbw_mlir

    compiled = []

    class Saved:
        def save(self, folder):
            pass

    monkeypatch.setattr(convbw_mlir, "compile_op", lambda p, target, **kw: compiled.append((p, target)) or Saved())
    monkeypatch.setenv(ct.ARTIFACTS_ENV, str(tmp_path))
    argv = ["--model", "resnet50", "--dtype", "bf16", "--batch", "2", "--size", "64", "--precompile", "sm_90a"]
    assert _example().main(argv) == 0
    targets = {p.name: t for p, t in compiled}
    assert len(targets) == len(compiled) > 20
    stem = [name for name in targets if "_c3_" in name]
    assert len(stem) == 1 and targets[stem[0]] == "sm_80"
    assert all(t == "sm_90a" for name, t in targets.items() if name not in stem)
    assert all(ct.cuda_target((9, 0), p) == t for p, t in compiled)


def test_the_stage_models_are_resnet50s_own_blocks():
    example = _example()
    torch.manual_seed(0)
    whole = example.build("resnet50", 10)
    stage = example.build("resnet50_layer3", 10)
    blocks = [m for m in whole if isinstance(m, example.Bottleneck)][7:13]  # 3 + 4 blocks before layer3
    shapes = [tuple(p.shape) for b in blocks for p in b.parameters()]
    assert shapes == [tuple(p.shape) for p in stage[:6].parameters()]
    assert example.input_channels("resnet50_layer3") == 512 and example.input_channels("resnet50") == 3
    out = stage(torch.randn(2, 512, 8, 8))
    assert out.shape == (2, 10)


def test_the_step_bench_lists_each_distinct_convolution_of_the_stage_with_its_count():
    from conftest import ROOT

    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import torch_step
    finally:
        sys.path.remove(str(ROOT / "bench"))
    import argparse

    sigs = torch_step._signatures(argparse.Namespace(stage="layer3", batch=2, size=28))
    assert sum(s["count"] for s in sigs) == 19  # 6 bottlenecks of 3 convolutions and one downsample
    counts = {(s["w"], s["stride"]): s["count"] for s in sigs}
    assert counts[((256, 256, 3, 3), (1, 1))] == 5 and counts[((1024, 512, 1, 1), (2, 2))] == 1
    # the paired part's "subset": all but the stride-1 1x1s, as enable(layers=...) sees a convolution
    taken = {(s["w"], s["stride"]) for s in sigs if torch_step._faster_layers((s["w"], s["stride"], (0, 0), (1, 1), 1))}
    assert taken == {((256, 256, 3, 3), (1, 1)), ((256, 256, 3, 3), (2, 2)), ((1024, 512, 1, 1), (2, 2))}


def test_kernel_family_names_the_kernel_a_plan_is():
    sm90 = Plan("sm_90a", Strategy.EXPLICIT, tile=Tile(128, 256, 64, 2, 1, 4, "NV_WGMMA_F32_64x256x16_BF16"))
    sm80 = Plan("sm_80", Strategy.EXPLICIT, tile=Tile(128, 128, 32, 2, 2, 3, "NV_MMA_SYNC_F32_16x8x16_F16"))
    assert [ct.kernel_family(p) for p in (sm90, sm80, Plan("sm_80", Strategy.MMA), None)] == [
        "sm_90a", "sm_80", "IREE", "unknown",
    ]  # fmt: skip


@pytest.mark.usefixtures("torch_artifacts")
def test_loaded_kernels_says_which_kernel_family_and_path_each_problem_took():
    x, dy = torch.randn(2, 4, 6, 6), torch.randn(2, 8, 6, 6)
    ct.conv2d_weight(x, (8, 4, 3, 3), dy, padding=1)
    problem = ct.problem_for(x, (8, 4, 3, 3), dy, padding=1)[0]
    rows = [r for r in ct.loaded_kernels() if r["problem"] == problem.name]
    assert rows and rows[0]["target"] == "host" and rows[0]["path"] == "iree"
    assert rows[0]["family"] in ("sm_80", "IREE")  # the host plan: the explicit kernel is NVIDIA's


@pytest.mark.parametrize(("ours_s", "theirs_s", "want"), [(2.0, 1.0, "torch"), (1.0, 2.0, "ours"), (1.0, 1.0, "ours")])
def test_benchmark_keeps_the_faster_weight_gradient_timed_once_per_problem(ours_s, theirs_s, want, monkeypatch,
                                                                           tmp_path):  # fmt: skip
    from convbw_mlir.torch import switch as sw

    monkeypatch.setenv("CONVBW_CACHE_DIR", str(tmp_path))  # no verdict remembered by another case

    timed = []  # the calls _time was given: ours first, then torch's, once per problem

    def fake_time(call, device):
        call()  # each side really runs (warm-up), then the given time
        timed.append(device.type)
        return ours_s if len(timed) % 2 else theirs_s

    monkeypatch.setattr(sw, "_time", fake_time)
    conv = torch.nn.Conv2d(4, 8, 3, padding=1, bias=False)
    x = torch.randn(2, 4, 6, 6, requires_grad=True)
    ct.enable(benchmark=True)
    for _ in range(3):
        conv.weight.grad = None
        conv(x).square().sum().backward()
    assert len(timed) == 2  # decided once, kept for the process
    expected = {"ours": 3} if want == "ours" else {"torch: slower than torch's (benchmark)": 3}
    assert ct.stats() == expected
    ct.disable()
    reference = conv.weight.grad.clone()
    conv.weight.grad = None
    conv(x).square().sum().backward()
    torch.testing.assert_close(reference, conv.weight.grad, rtol=1e-4, atol=1e-4)


def test_benchmark_is_a_bool():
    with pytest.raises(TypeError, match=r"benchmark: expected True, False or None \(on for GPUs\), got 'yes'"):
        ct.enable(benchmark="yes")


def test_a_direct_calls_launch_tells_the_cxx_path_the_graph_it_replayed_for_that_memory_and_its_workspace(
    monkeypatch,
):
    # the C++ hot path launches a graph itself only for memory whose graph DirectCall named (docs/torch.md)
    import ctypes

    kernel = object.__new__(ct_entry.DirectCall)  # no GPU here: the launcher, the graph and the stream stood in for
    kernel.index, kernel.transient, kernel.driver, kernel.use_graphs = 0, 100, "cuda", True
    kernel._graphs, kernel._seen, kernel._side = {}, {}, None
    plain, recorded, replays, captures = [], [], [], []
    kernel.launcher = lambda ptrs, stream, maps_stream=None, captured=None: (
        plain.append(ptrs) or captures.append(captured)
    )

    class Graph:
        def replay(self):
            replays.append(1)

        def raw_cuda_graph_exec(self):
            return 0xE1

    monkeypatch.setattr(ct_entry.DirectCall, "_record", lambda self, ptrs, stream: recorded.append(ptrs) or Graph())
    monkeypatch.setattr(ct_entry, "_raw_stream", lambda index: 7)
    monkeypatch.setattr(ct_entry, "_RAW_EXEC", True)
    monkeypatch.setattr(ct_entry, "_WORKSPACE", {})
    monkeypatch.setattr(
        ct_entry, "_kept_workspace", lambda index, nbytes, device: torch.empty(nbytes, dtype=torch.uint8)
    )
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    x, dy, out, other = torch.zeros(64), torch.zeros(64), torch.zeros(64), torch.zeros(64)
    got = [kernel.launch(x, dy, out) for _ in range(3)] + [kernel.launch(x, dy, other)]
    ws = ct_entry._WORKSPACE[(0, 7)]
    assert ws.numel() >= 100
    assert [(e, w is ws) for e, w in got] == [(0, True), (0xE1, True), (0xE1, True), (0, True)]
    assert (len(plain), len(recorded), len(replays)) == (2, 1, 2)  # first call and new memory plain, then the graph
    assert captures == [False, False]  # the launcher told no capture is on: it need not ask the driver

    fns = {n: ctypes.CFUNCTYPE(ctypes.c_int)(lambda: 0) for n in ("cuGraphLaunch", "cuStreamIsCapturing")}
    monkeypatch.setattr("convbw_mlir.cuda_launch._libcuda", lambda: type("Lib", (), fns))
    monkeypatch.setenv(ct_entry.NATIVE_LAUNCH_ENV, "0")  # graphs only: the schedule's launch from C++ turned off
    spec = kernel.native_launch()
    assert spec[0] == kernel.launch and spec[3] == 100
    assert spec[1:3] == tuple(ctypes.cast(fns[n], ctypes.c_void_p).value for n in fns)
    kernel.use_graphs = False  # CONVBW_CUDA_GRAPHS=0 (or a capture that failed): every call through Python
    assert kernel.native_launch() is None
    kernel.use_graphs, kernel.driver = True, "hip"  # ROCm: its graphs are not launched from C++
    assert kernel.native_launch() is None


def test_while_the_stream_is_captured_a_direct_calls_workspace_is_the_calls_own_and_nothing_is_kept(monkeypatch):
    # torch.compile(mode="reduce-overhead") failed on an H100 with "Detected 1 tensor(s) in the cudagraph pool not
    # tracked as outputs" (bench/results/h100_2026-12-06_host37): a workspace kept from inside its pool. Under a
    # capture the workspace is the call's own (the capture's memory, freed after the call as torch's temporaries);
    # outside, the one kept per stream, allocated apart from any pool (_kept_workspace)
    kernel = object.__new__(ct_entry.DirectCall)
    kernel.index, kernel.transient, kernel.driver, kernel.use_graphs = 0, 1000, "cuda", True
    kernel._graphs, kernel._seen, kernel._side = {}, {}, None
    launched, kept, told = [], [], []
    kernel.launcher = lambda ptrs, stream, maps_stream=None, captured=None: (
        launched.append(ptrs) or told.append(captured)
    )
    monkeypatch.setattr(ct_entry, "_raw_stream", lambda index: 7)
    monkeypatch.setattr(ct_entry, "_WORKSPACE", {})
    monkeypatch.setattr(
        ct_entry, "_kept_workspace", lambda index, nbytes, device: kept.append(nbytes) or torch.empty(nbytes)
    )
    capturing = [True]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    x, dy, out = torch.zeros(64), torch.zeros(64), torch.zeros(64)
    assert [kernel.launch(x, dy, out) for _ in range(2)] == [(0, None), (0, None)]
    assert (ct_entry._WORKSPACE, kept, len(launched)) == ({}, [], 2)  # each launch had a workspace, none kept
    capturing[0] = False
    _, ws = kernel.launch(x, dy, out)
    assert kept == [1000] and ct_entry._WORKSPACE == {(0, 7): ws} and launched[-1][3] == ws.data_ptr()
    assert told == [True, True, False]  # a capture's launches pin their tensor-map slots (cuda_launch.MapSlots)


def test_a_direct_calls_native_plan_is_its_launchers_schedule_by_default_and_none_where_turned_off(monkeypatch):
    # what C++ launches itself ($CONVBW_TORCH_NATIVE_LAUNCH=1): CudaLauncher's own plan, buffers numbered x, dy, dW,
    # workspace, each kernel's constants and tensor maps; the driver functions by address (0: absent)
    import ctypes
    import types

    from convbw_mlir.cuda_launch import Dispatch, ExportDef, Launch, TensorMap, Transfer, launch_plan

    t = "transient"
    launch = Launch(
        function="f",
        steps=[
            Transfer("fill", (t, 0), 64, None, 0, 4),
            Dispatch("k0", (2, 1, 1), (("arg0", 0), ("arg1", 16), (t, 0), (t, 0)), (7, 9)),
            Dispatch("k1", (1, 1, 1), ((t, 0), ("arg2", 0))),
            Transfer("copy", ("arg2", 0), 16, (t, 0)),
        ],  # fmt: skip
        transient=64,
        arg_bytes=(1, 1, 1),
        exports={"k0": ExportDef("k0", 0, (128, 1, 1), 4096, 2, 4), "k1": ExportDef("k1", 0, (32, 1, 1), 0, 0, 2)},
        tensor_maps=[TensorMap("k0", 0, 3, 0, "tiled", 9, (8, 36), (16,), (8, 4), (1, 1))],
    )
    plan, _ = launch_plan(launch, {"k0": 0xF1, "k1": 0xF2}, dynamic_shared=True)
    kernel = object.__new__(ct_entry.DirectCall)
    kernel.driver = "cuda"
    kernel.launcher = types.SimpleNamespace(launch=launch, _plan=plan, _maps={1: (3, launch.tensor_maps)},
                                            slots=types.SimpleNamespace(cap=5))  # fmt: skip
    fns = {n: ctypes.CFUNCTYPE(ctypes.c_int)(lambda: 0) for n in ct_entry.NATIVE_DRIVER_FUNCTIONS[:8]}
    monkeypatch.setattr("convbw_mlir.cuda_launch._libcuda", lambda: type("Lib", (), fns))
    monkeypatch.setenv(ct_entry.NATIVE_LAUNCH_ENV, "0")
    assert kernel.native_plan() is None  # turned off: every launch without a graph through Python
    monkeypatch.delenv(ct_entry.NATIVE_LAUNCH_ENV)  # on by default since the H100 run (docs/decisions.md#native-launch)
    addresses, steps, cap = kernel.native_plan()
    # the encoders and the events absent from this stand-in driver: 0 (C++ then launches such a plan through Python)
    assert addresses == (*(ctypes.cast(f, ctypes.c_void_p).value for f in fns.values()), *[0] * 6)
    assert cap == 5  # the tensor-map slots C++ reuses: the launcher's (cuda_launch.MapSlots)
    tiled = (0, 0, 9, (8, 36), (16,), (8, 4), (1, 1), (), (), 0, 3, 3, 0)
    assert steps == (
        (1, 3, 0, 64, -1, 0, 0, 4),
        (0, 0xF1, (2, 1, 1, 128, 1, 1, 4096), ((0, 0), (1, 16), (3, 0), (3, 0)), (7, 9), 3, (tiled,)),
        (0, 0xF2, (1, 1, 1, 32, 1, 1, 0), ((3, 0), (2, 0)), (), -1, ()),
        (2, 2, 0, 16, 3, 0, 0, 0),
    )
    kernel.driver = "hip"
    assert kernel.native_plan() is None
