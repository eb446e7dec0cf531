"""The switch's C++ hot path (enable(native=True), convbw_mlir/torch/native) on the CPU: the same routing as the
Python switch, the calls it has decided served without it, dx and the bias gradient bit for bit torch's, a
failing build falling back to the Python path with one warning (docs/torch.md#the-native-hot-path).

Named to run after test_torch_ops.py: once registered, the C++ kernel stays for the process (as the Python one
does), and the Python switch's own tests run first without it."""

import dataclasses
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (an optional extra: pip install .[torch])")
from test_torch_ops import backward_while_another_thread_toggles  # noqa: E402 - the same check, the C++ path on

from convbw_mlir import torch as ct  # noqa: E402 - after the skip: it needs torch
from convbw_mlir.torch import native  # noqa: E402
from convbw_mlir.torch import switch as sw  # noqa: E402

pytestmark = pytest.mark.usefixtures("torch_artifacts", "built")
ROOT = Path(__file__).resolve().parents[1]
ARGS = [None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1]  # convolution_backward's after (dy, x, w): 3x3, pad 1
aten = torch.ops.aten.convolution_backward.default


@pytest.fixture(scope="module")
def built():
    """The extension, built once into build/native of the checkout (kept across runs: ~20-40 s the first time)."""
    mp = pytest.MonkeyPatch()
    if not os.environ.get(native.DIR_ENV):
        mp.setenv(native.DIR_ENV, str(ROOT / "build" / "native"))
    if native.load() is None:
        pytest.fail("the C++ hot path did not build here (g++ and ninja are expected on the test machine)")
    yield
    mp.undo()


@pytest.fixture(autouse=True)
def _switch_off():
    ct.disable()
    ct.reset_stats()
    yield
    ct.disable()


def _model(seed=0):  # the two convolutions test_torch_ops.py shares: no kernels of their own
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Conv2d(4, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 3, padding=1, groups=2)
    )


def _x(seed=1):
    return torch.randn(2, 4, 6, 6, generator=torch.Generator().manual_seed(seed)).requires_grad_()


def _grads(model, x):
    model.zero_grad()
    x.grad = None
    model(x).square().sum().backward()
    return [x.grad.clone()] + [p.grad.clone() for p in model.parameters()]


def test_native_takes_every_decided_call_without_python_and_dx_and_bias_stay_torchs_bit_for_bit():
    model, x = _model(), _x()
    want = _grads(model, x)
    ct.enable(native=True)
    assert sw._STATE["active"].native
    for _ in range(3):
        got = _grads(model, x)
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            if i in (0, 2, 4):  # dx and the biases' gradients: torch's own kernel
                assert torch.equal(g, w), i
            else:
                torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
    assert ct.stats() == {"ours": 6}
    assert native.counts() == {"ours": 4}  # the first step's two calls decided in Python, the rest in C++
    assert native.table_size() >= 2


def test_native_disable_gives_torchs_kernel_bit_for_bit_and_counts_nothing():
    model, x = _model(), _x()
    want = _grads(model, x)
    ct.enable(native=True)
    _grads(model, x)
    ct.disable()
    ct.reset_stats()
    assert all(torch.equal(g, w) for g, w in zip(_grads(model, x), want, strict=True))
    assert ct.stats() == {}


def test_native_remembers_torchs_reason_and_each_enables_own_decisions():
    model, x = _model(), _x()
    ct.enable(native=True, min_flops=1 << 60)
    _grads(model, x), _grads(model, x)
    assert ct.stats() == {"torch: below min_flops": 4}
    assert native.counts() == {"torch: below min_flops": 2}
    with ct.enabled(native=True):  # other settings: decided anew, never the other settings' decision
        ct.reset_stats()
        _grads(model, x), _grads(model, x)
        assert ct.stats() == {"ours": 4}
    ct.reset_stats()
    _grads(model, x)  # the first enable()'s record is back, and its decisions with it: all in C++
    assert ct.stats() == native.counts() == {"torch: below min_flops": 2}


def test_a_new_enable_decides_anew_under_native_as_the_python_switch_does(monkeypatch):
    # the C++ table kept decisions across enable() calls of equal settings: a decision made before kernels came
    # or went (here: a stand-in kernel) served the next enable() (a later test's dW was another's)
    model, x = _model(), _x()
    ct.enable(native=True, min_flops=1 << 60)
    _grads(model, x), _grads(model, x)
    ct.enable(native=True, min_flops=1 << 60)
    ct.reset_stats()
    _grads(model, x)
    assert native.counts() == {}  # decided by the Python switch again (then remembered for this enable())
    assert ct.stats() == {"torch: below min_flops": 2}


@pytest.mark.parametrize("x_fmt, w_fmt", [(torch.contiguous_format, torch.channels_last), (torch.channels_last,) * 2])
def test_native_dw_comes_back_with_the_strides_torchs_kernel_gives_it(x_fmt, w_fmt):
    x = torch.randn(2, 4, 6, 6).contiguous(memory_format=x_fmt)
    w = torch.randn(8, 4, 3, 3).contiguous(memory_format=w_fmt)
    dy = torch.randn(2, 8, 6, 6).contiguous(memory_format=x_fmt)
    want = aten(dy, x, w, *ARGS, [False, True, False])[1]
    ct.enable(native=True)
    for _ in range(2):  # the miss (Python) and the table's (C++)
        got = aten(dy, x, w, *ARGS, [False, True, False])[1]
        assert got.stride() == want.stride()
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert native.counts() == {"ours": 1}


def test_an_error_in_our_dw_under_native_is_the_callers_exception_and_the_switch_works_after(monkeypatch):
    model, x = _model(), _x()
    want = _grads(model, x)
    ct.enable(native=True)
    _grads(model, x)  # decided: the next calls are the table's

    def broken(*a):
        raise ValueError("our kernel broke")

    monkeypatch.setattr(sw, "_weight_grad", broken)
    with pytest.raises(ValueError, match="our kernel broke"):
        _grads(model, x)
    monkeypatch.undo()
    ct.reset_stats()
    for g, w in zip(_grads(model, x), want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
    assert native.counts() == {"ours": 2}


def test_native_false_after_native_sends_every_call_through_the_python_switch():
    model, x = _model(), _x()
    ct.enable(native=True)
    _grads(model, x)
    ct.reset_stats()
    ct.enable(native=False)
    assert not sw._STATE["active"].native
    _grads(model, x), _grads(model, x)
    assert ct.stats() == {"ours": 4}
    assert native.counts() == {}


@pytest.mark.parametrize(
    "value, error, message",
    [("yes", TypeError, "native: expected None, True or False, got 'yes'"), (1, TypeError, "native: expected")],
)
def test_a_bad_native_setting_is_one_error_naming_it_and_leaves_the_switch_off(value, error, message):
    with pytest.raises(error, match=message):
        ct.enable(native=value)
    assert not ct.is_enabled()


def test_a_bad_native_variable_is_one_error_naming_it(monkeypatch):
    monkeypatch.setenv(native.ENV, "on")
    with pytest.raises(TypeError, match="CONVBW_TORCH_NATIVE: expected 0 or 1, got 'on'"):
        ct.enable()
    assert not ct.is_enabled()
    monkeypatch.setenv(native.ENV, "1")
    ct.enable()
    assert sw._STATE["active"].native


def test_a_bad_native_launch_variable_is_one_error_naming_it_and_leaves_the_switch_off(monkeypatch):
    monkeypatch.setenv("CONVBW_TORCH_NATIVE_LAUNCH", "false")  # "0" turns the launch from C++ off, nothing else
    with pytest.raises(TypeError, match="CONVBW_TORCH_NATIVE_LAUNCH: expected 0 or 1, got 'false'"):
        ct.enable(native=True)
    assert not ct.is_enabled()
    monkeypatch.setenv("CONVBW_TORCH_NATIVE_LAUNCH", "0")
    ct.enable(native=True)
    assert sw._STATE["active"].native


def test_enable_and_disable_from_another_thread_never_break_a_native_backward_running_meanwhile():
    assert not backward_while_another_thread_toggles(_model(), _x(), 100, native=True)
    assert ct.stats().get("ours", 0) > 0


def test_without_a_compiler_native_warns_once_and_the_python_path_computes_dw(tmp_path):
    # a machine without g++: the switch must still work, said once
    script = textwrap.dedent("""
        import warnings, torch
        from convbw_mlir import torch as ct
        from convbw_mlir.torch import switch as sw
        m = torch.nn.Conv2d(4, 8, 3, padding=1)
        x = torch.randn(2, 4, 6, 6)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            ct.enable(native=True)
            ct.enable(native=True)
        said = [str(w.message) for w in seen if "C++ hot path did not build" in str(w.message)]
        m(x).sum().backward()
        print(said[0] if said else "")
        print(len(said), sw._STATE["active"].native, ct.stats())
    """)
    env = dict(os.environ, CXX=str(tmp_path / "no-such-compiler"), CONVBW_TORCH_NATIVE_DIR=str(tmp_path / "native"))
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[-2] == "1 False {'ours': 1}", out.stdout + out.stderr
    assert "no-such-compiler" in out.stdout.split("\n")[-3]  # the cause (the missing compiler), not ninja's last words


def test_a_process_that_used_the_native_path_exits_cleanly():
    # the table's entries hold Python callables: freed by static destructors after Python's end, they crashed the
    # process at exit (a segmentation fault after bench/torch_switch_hotpath.py's last line)
    script = textwrap.dedent("""
        import torch
        from convbw_mlir import torch as ct
        m = torch.nn.Conv2d(4, 8, 3, padding=1)
        x = torch.randn(2, 4, 6, 6)
        ct.enable(native=True)
        for _ in range(2):
            m(x).sum().backward()
        print(ct.stats())
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert (out.returncode, out.stdout.strip()) == (0, "{'ours': 2}"), out.stderr[-2000:]


def test_a_direct_launch_decision_gets_dw_allocated_in_cxx_with_the_kernels_layout(monkeypatch):
    # the GPU's common case (a DirectCall on x and dy as they come), stood in for on the CPU: C++ allocates dW in
    # the layout the decision holds and the kernel fills it; a wrong size or stride would show in `seen`
    x, dy = torch.randn(2, 4, 6, 6), torch.randn(2, 8, 6, 6)
    w = torch.randn(8, 4, 3, 3)
    want = aten(dy, x, w, *ARGS, [False, True, False])[1]
    seen = []

    def kernel(x_in, dy_in, out):  # x and dy as they came, dW filled (computing it here would recurse into us)
        seen.append(
            (x_in.data_ptr() == x.data_ptr(), dy_in.data_ptr() == dy.data_ptr(), tuple(out.shape), out.stride())
        )
        out.copy_(want)

    decide = sw._decide
    monkeypatch.setattr(
        sw, "_decide", lambda *a: dataclasses.replace(decide(*a), direct=(kernel, ((8, 4, 3, 3), (36, 9, 3, 1))))
    )
    python_calls, weight_grad = [], sw._weight_grad
    monkeypatch.setattr(sw, "_weight_grad", lambda *a: python_calls.append(1) or weight_grad(*a))
    ct.enable(native=True)
    for _ in range(3):
        got = aten(dy, x, w, *ARGS, [False, True, False])[1]
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert seen == [(True, True, (8, 4, 3, 3), (36, 9, 3, 1))] * 3  # the miss (Python's allocation), then twice C++'s
    assert native.counts() == {"ours": 2}
    assert len(python_calls) == 1  # the Python switch's dW path for the miss only


def test_native_under_torch_compile_runs_our_kernel_from_the_compiled_backward():
    model, x = _model(), _x()
    want = _grads(model, x)
    ct.enable(native=True)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    for _ in range(2):
        model.zero_grad()
        x.grad = None
        compiled(x).square().sum().backward()
        for g, w in zip([x.grad] + [p.grad for p in model.parameters()], want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
    assert ct.stats() == {"ours": 4}
    assert native.counts() == {"ours": 2}


def test_a_compiled_function_that_calls_backward_runs_the_native_path_eagerly_after_its_graph_break():
    # dynamo's frame hook is live in that backward: the Python the C++ kernel calls must not be traced
    model, x = _model(), _x()
    want = _grads(model, x)
    ct.enable(native=True)
    _grads(model, x)  # decided: the step's calls are the table's

    def step(t):
        loss = model(t).square().sum()
        loss.backward()
        return loss

    model.zero_grad()
    x.grad = None
    ct.reset_stats()
    torch._dynamo.reset()
    torch._dynamo.explain(step)(x)
    for g, w in zip([p.grad for p in model.parameters()], want[1:], strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
    assert native.counts() == {"ours": 2}


class _GraphedKernel:
    """A DirectCall stood in for on the CPU: its Python launch fills dW and says which graph it replayed (one per
    dW address, the address itself), and the driver's cuGraphLaunch / cuStreamIsCapturing are ctypes callbacks
    recording what C++ hands them."""

    def __init__(self, want):
        import ctypes

        self.want, self.plain, self.python, self.graphs = want, [], [], []
        self.capturing, self.rc = 0, 0
        self.ws = torch.empty(256, dtype=torch.uint8)

        def graph_launch(exec_, stream):
            self.graphs.append((exec_, stream))
            return self.rc

        def is_capturing(stream, status):
            status[0] = self.capturing
            return 0

        self._fns = [
            ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)(graph_launch),
            ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int))(is_capturing),
        ]
        self.addresses = [ctypes.cast(f, ctypes.c_void_p).value for f in self._fns]

    def __call__(self, x, dy, out):  # the plain launch (a capture, the miss's Python path)
        self.plain.append(out.data_ptr())
        out.copy_(self.want)

    def launch(self, x, dy, out):
        out.copy_(self.want)
        # DirectCall's rule: a graph from the second call on the same memory on
        exec_ = out.data_ptr() if out.data_ptr() in self.python else 0
        self.python.append(out.data_ptr())
        return exec_, self.ws

    def native_launch(self):
        return self.launch, *self.addresses, 64, None


def _graphed_switch(monkeypatch):
    x, dy = torch.randn(2, 4, 6, 6), torch.randn(2, 8, 6, 6)
    w = torch.randn(8, 4, 3, 3)
    want = aten(dy, x, w, *ARGS, [False, True, False])[1]
    kernel = _GraphedKernel(want)
    decide = sw._decide
    monkeypatch.setattr(
        sw, "_decide", lambda *a: dataclasses.replace(decide(*a), direct=(kernel, ((8, 4, 3, 3), (36, 9, 3, 1))))
    )
    ct.enable(native=True)
    return kernel, lambda: aten(dy, x, w, *ARGS, [False, True, False])[1]


def test_a_direct_launchs_cuda_graph_python_replayed_is_launched_from_cxx_without_python_on_that_memory(monkeypatch):
    kernel, call = _graphed_switch(monkeypatch)
    torch.testing.assert_close(call(), kernel.want)  # the miss: the Python switch whole (its plain launch)
    for _ in range(12):  # each dW dropped before the next: the allocator hands its memory back
        got = call()
        if not (kernel.graphs and kernel.graphs[-1][0] == got.data_ptr()):  # else from C++: the fake wrote nothing
            torch.testing.assert_close(got, kernel.want)
        del got
    told = {p for i, p in enumerate(kernel.python) if p in kernel.python[:i]}  # the graphs Python said it replayed
    assert kernel.graphs, "no call was served by the graph from C++"
    assert all(stream is None and exec_ in told for exec_, stream in kernel.graphs)  # stream 0: the CPU's stand-in
    assert len(kernel.plain) == 1 and len(kernel.python) + len(kernel.graphs) == 12
    assert native.graph_launches() == len(kernel.graphs) and native.counts() == {"ours": 12}
    assert all(kernel.python.count(p) == 2 for p in told)  # once Python told a memory's graph, C++ launches it


def test_while_a_graph_is_captured_the_direct_launch_goes_into_the_capture_through_python(monkeypatch):
    kernel, call = _graphed_switch(monkeypatch)
    kernel.capturing = 1  # cuStreamIsCapturing: active
    for _ in range(4):
        torch.testing.assert_close(call(), kernel.want)
    assert (len(kernel.plain), kernel.python, kernel.graphs) == (4, [], [])


def test_a_failed_graph_launch_from_cxx_is_one_error_naming_it_and_the_switch_works_after(monkeypatch):
    kernel, call = _graphed_switch(monkeypatch)
    for _ in range(12):
        call()
        if kernel.graphs:
            break
    assert kernel.graphs, "no call was served by the graph from C++"
    kernel.rc = 700  # CUDA_ERROR_ILLEGAL_ADDRESS
    with pytest.raises(RuntimeError, match="cuGraphLaunch of our dW kernel's CUDA graph: CUDA error 700"):
        for _ in range(12):
            call()
    kernel.rc = 0
    ct.disable()
    torch.testing.assert_close(call(), kernel.want)  # torch's own again


def test_graphs_launched_from_cxx_while_another_thread_turns_the_switch_never_break_a_call(monkeypatch):
    # entries (their graphs and callables) and the workspace table are shared with a thread that enables, disables
    # and, past 64 settings, clears the C++ table meanwhile: no call fails, and every one Python served is right
    import threading

    kernel, call = _graphed_switch(monkeypatch)
    errors, done = [], threading.Event()

    def toggle():
        try:
            while not done.wait(0.002):  # on between turns: entries live a few calls, some reach their graph
                ct.disable()
                ct.enable(native=True)
        except Exception as e:
            errors.append(e)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    toggler = threading.Thread(target=toggle)
    toggler.start()
    try:
        for _ in range(150):
            got = call()
            if not (kernel.graphs and kernel.graphs[-1][0] == got.data_ptr()):
                torch.testing.assert_close(got, kernel.want)  # torch's, or ours through Python: both the same dW
            del got
    finally:
        done.set()
        toggler.join()
        sys.setswitchinterval(interval)
    assert not errors
    assert kernel.graphs, "no call was served by the graph from C++"


class _FakeDriver:
    """The driver functions DirectCall.native_plan hands over (entry.NATIVE_DRIVER_FUNCTIONS' order), as ctypes
    callbacks recording what C++ passes: kernel launches with their parameters read back, fills, copies, tensor-map
    encodings (the map's first 8 bytes: the address it describes) and their copies to the device."""

    def __init__(self, params_per_kernel):
        import ctypes as c

        self.launches, self.fills, self.copies, self.encoded, self.uploads = [], [], [], [], []
        self._host = []
        self.rc = 0  # what cuLaunchKernel returns
        # the GPU's progress, told by the test: with `hold` an event recorded stays not ready (cuEventQuery's
        # CUDA_ERROR_NOT_READY) until `pending` is cleared or a cuEventSynchronize on it (listed in `waited`)
        self.hold, self.pending, self.waited, self.allocs, self.overwritten_pending = False, {}, [], [], []
        u64, vp, u32, sz = c.c_uint64, c.c_void_p, c.c_uint, c.c_size_t

        def launch(func, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
            slots = c.cast(params, c.POINTER(vp))
            n = params_per_kernel[func]
            self.launches.append((func, (gx, gy, gz, bx, by, bz, smem), stream,
                                  [c.cast(slots[i], c.POINTER(u64))[0] for i in range(n)]))  # fmt: skip
            return self.rc

        def encode(mode):
            def f(out, dtype, rank, address, dims, strides, *rest):
                self.encoded.append((mode, dtype, rank, address, [dims[i] for i in range(rank)]))
                c.memmove(out, c.byref(u64(address)), 8)
                return 0

            return f

        def alloc_host(ptr, size):
            buf = c.create_string_buffer(size)
            self._host.append(buf)
            ptr[0] = c.addressof(buf)
            return 0

        def alloc(ptr, size):
            ptr[0] = 0x7000_0000 + 0x10000 * len(self._host)
            self.allocs.append(size)
            return 0

        def upload(dst, src, size, stream):
            self.uploads.append((dst, [c.cast(src + 128 * k, c.POINTER(u64))[0] for k in range(size // 128)]))
            # whether the GPU may still read the slot written (one slab: slot i at 256 i, its event i + 1)
            self.overwritten_pending.append(self.pending.get((dst - 0x7000_0000) // 256 + 1, False))
            return 0

        def event_create(ptr, flags):
            self.pending[len(self.pending) + 1] = False
            ptr[0] = len(self.pending)
            return 0

        def event_record(event, stream):
            self.pending[event] = self.hold
            return 0

        def event_sync(event):
            self.waited.append(event)
            self.pending[event] = False
            return 0

        p_u64, p_u32, p_i = c.POINTER(u64), c.POINTER(u32), c.POINTER(c.c_int)
        self._fns = [
            c.CFUNCTYPE(c.c_int, vp, u32, u32, u32, u32, u32, u32, u32, vp, vp, vp)(launch),
            None,
            None,
            c.CFUNCTYPE(c.c_int, u64, u32, sz, vp)(lambda d, v, n, s: self.fills.append((d, v, n)) or 0),
            c.CFUNCTYPE(c.c_int, u64, u64, sz, vp)(lambda d, s_, n, s: self.copies.append((d, s_, n)) or 0),
            c.CFUNCTYPE(c.c_int, u64, vp, sz, vp)(upload),
            c.CFUNCTYPE(c.c_int, p_u64, sz)(alloc),
            c.CFUNCTYPE(c.c_int, c.POINTER(vp), sz)(alloc_host),
            c.CFUNCTYPE(c.c_int, vp, c.c_int, u32, vp, p_u64, p_u64, p_u32, p_u32, c.c_int, c.c_int, c.c_int, c.c_int)(
                encode("tiled")
            ),
            c.CFUNCTYPE(
                c.c_int,
                vp,
                c.c_int,
                u32,
                vp,
                p_u64,
                p_u64,
                p_i,
                p_i,
                u32,
                u32,
                p_u32,
                c.c_int,
                c.c_int,
                c.c_int,
                c.c_int,
            )(encode("im2col")),  # fmt: skip
            c.CFUNCTYPE(c.c_int, c.POINTER(vp), u32)(event_create),
            c.CFUNCTYPE(c.c_int, vp, vp)(event_record),
            c.CFUNCTYPE(c.c_int, vp)(lambda event: 600 if self.pending[event] else 0),
            c.CFUNCTYPE(c.c_int, vp)(event_sync),
        ]
        self.addresses = tuple(0 if f is None else c.cast(f, c.c_void_p).value for f in self._fns)


# DirectCall.native_plan's steps: a fill, a kernel with two tensor maps, a second stage, a copy
_MAPS = ((0, 0, 9, (8, 36), (16,), (8, 4), (1, 1), (), (), 0, 3, 3, 0),
         (1, 1, 9, (8, 6, 6, 2), (16, 96, 576), (8, 4), (1, 1, 1, 1), (-1, -1), (-1, -1), 0, 3, 3, 0))  # fmt: skip


def _steps(maps=_MAPS):
    return ((1, 3, 0, 64, -1, 0, 0, 4),
            (0, 0xF1, (2, 1, 1, 128, 1, 1, 4096), ((0, 0), (1, 16), (3, 0), (3, 0)), (7, 9), 3, maps),
            (0, 0xF2, (1, 1, 1, 32, 1, 1, 0), ((3, 0), (2, 0)), (), -1, ()),
            (2, 2, 0, 16, 3, 0, 0, 0))  # fmt: skip


def test_without_a_graph_for_the_memory_cxx_launches_the_schedule_itself_as_the_python_launcher_does(monkeypatch):
    # $CONVBW_TORCH_NATIVE_LAUNCH=1: DirectCall's schedule launched from C++ with the parameters CudaLauncher gives
    # (entry.DirectCall.native_plan's tuple)
    drv = _FakeDriver({0xF1: 6, 0xF2: 2})
    steps = _steps()
    kernel, call = _graphed_switch(monkeypatch)
    kernel.native_launch = lambda: (kernel.launch, 0, kernel.addresses[1], 64, (drv.addresses, steps))
    torch.testing.assert_close(call(), kernel.want)  # the miss: the Python switch whole
    for _ in range(4):
        call()
    calls = native.plain_launches()
    assert calls >= 3 and kernel.graphs == [] and len(kernel.python) <= 1  # Python once at most: the workspace
    assert len(drv.launches) == 2 * calls and len(drv.fills) == calls and len(drv.copies) == calls
    first, second = drv.launches[-2], drv.launches[-1]
    assert first[0] == 0xF1 and first[1] == (2, 1, 1, 128, 1, 1, 4096) and second[0] == 0xF2
    x_ptr, dy_ptr, ws, maps_at, *constants = first[3]
    assert constants == [7, 9] and dy_ptr - 16 != x_ptr
    ws_in, dw = second[3]
    assert ws_in == ws and drv.fills[-1] == (ws, 0, 16) and drv.copies[-1] == (dw, ws, 16)
    # the tensor maps: encoded once for this (x, dy) pair and stream, uploaded to one slot, bound on every launch
    assert [(m, a) for m, _, _, a, _ in drv.encoded] == [("tiled", x_ptr), ("im2col", dy_ptr)]
    assert drv.encoded[0][1:] == (9, 2, x_ptr, [8, 36]) and drv.encoded[1][1:] == (9, 4, dy_ptr, [8, 6, 6, 2])
    assert drv.uploads == [(maps_at, [x_ptr, dy_ptr])]
    assert all(launch[3][3] == maps_at for launch in drv.launches[::2][1:])


def test_a_failed_launch_from_cxx_is_one_error_naming_the_call_and_step_and_the_switch_works_after(monkeypatch):
    # the message is built only on failure (no string a call on the hot path): it still names the call and the step
    drv = _FakeDriver({0xF1: 6, 0xF2: 2})
    kernel, call = _graphed_switch(monkeypatch)
    kernel.native_launch = lambda: (kernel.launch, 0, kernel.addresses[1], 64, (drv.addresses, _steps()))
    for _ in range(3):
        call()
    assert native.plain_launches() > 0
    drv.rc = 700  # CUDA_ERROR_ILLEGAL_ADDRESS
    with pytest.raises(RuntimeError, match=r"cuLaunchKernel \(step 1\): CUDA error 700"):
        call()
    drv.rc = 0
    ct.disable()
    torch.testing.assert_close(call(), kernel.want)  # torch's own again


def test_a_plan_with_more_than_two_tensor_maps_a_step_is_launched_through_python_not_from_cxx(monkeypatch):
    # CudaLauncher takes at most two maps a dispatch; the C++ side keys a step's maps by at most two addresses
    drv = _FakeDriver({0xF1: 6, 0xF2: 2})
    kernel, call = _graphed_switch(monkeypatch)
    three = (*_MAPS, _MAPS[0])
    kernel.native_launch = lambda: (kernel.launch, 0, kernel.addresses[1], 64, (drv.addresses, _steps(three)))
    for _ in range(4):
        torch.testing.assert_close(call(), kernel.want)
    assert native.plain_launches() == 0 and drv.launches == [] and kernel.python == [] and len(kernel.plain) == 4


def test_cxx_tensor_map_slots_stay_bounded_over_10000_moving_address_pairs_and_wait_for_unfinished_reads(monkeypatch):
    # issue 37: C++'s launches kept a slot per new (x, dy) pair for good; now a pool of the launcher's cap, reused
    # least recently used first once the slot's event says the GPU read it (cuda_launch.MapSlots's rule)
    drv = _FakeDriver({0xF1: 6, 0xF2: 2})
    kernel, _ = _graphed_switch(monkeypatch)
    kernel.native_launch = lambda: (kernel.launch, 0, kernel.addresses[1], 64, (drv.addresses, _steps(), 4))
    n = 10_000
    xs, dys, w = torch.randn(288 + 4 * (n + 8)), torch.randn(576 + 4 * (n + 8)), torch.randn(8, 4, 3, 3)

    def call(i):  # x and dy 16 bytes further on each call: a new address pair
        x, dy = xs[4 * i : 4 * i + 288].view(2, 4, 6, 6), dys[4 * i : 4 * i + 576].view(2, 8, 6, 6)
        return aten(dy, x, w, *ARGS, [False, True, False])[1]

    slots_before = native.map_slots()[0]
    for i in range(n):
        call(i)
    assert native.plain_launches() >= n - 2 and len(drv.encoded) == 2 * native.plain_launches()
    assert native.map_slots()[0] - slots_before == 4 and drv.allocs == [4 * 256]
    assert len({dst for dst, _ in drv.uploads}) == 4 and not any(drv.overwritten_pending) and drv.waited == []
    # the GPU stops reading (events stay not ready): each new pair waits for the least recently used slot's reads
    # (the first 4 reuse slots whose reads were done before: no wait; then each slot, oldest use first)
    drv.hold = True
    for i in range(n, n + 8):
        call(i)
    taken = [(dst - 0x7000_0000) // 256 + 1 for dst, _ in drv.uploads[-8:]]  # each upload's slot, as its event
    assert drv.waited == taken[:4] and taken[4:] == taken[:4] and not any(drv.overwritten_pending)


def test_cxx_reuses_the_least_recently_used_tensor_map_slot_a_hit_counting_as_a_use(monkeypatch):
    # a pair found in the pool is a use (its slot's event recorded again, moved to most recent): the next new pair
    # takes the other slot, waiting for that slot's reads while the GPU (the fake) has not done them
    drv = _FakeDriver({0xF1: 6, 0xF2: 2})
    kernel, _ = _graphed_switch(monkeypatch)
    kernel.native_launch = lambda: (kernel.launch, 0, kernel.addresses[1], 64, (drv.addresses, _steps(), 2))
    xs, dys, w = torch.randn(288 + 4 * 8), torch.randn(576 + 4 * 8), torch.randn(8, 4, 3, 3)

    def call(i):
        x, dy = xs[4 * i : 4 * i + 288].view(2, 4, 6, 6), dys[4 * i : 4 * i + 576].view(2, 8, 6, 6)
        return aten(dy, x, w, *ARGS, [False, True, False])[1]

    call(7)  # the miss: the Python switch decides (its own launcher), C++ launches from the next call on
    drv.hold = True  # the GPU reads nothing until a wait
    for i in (0, 1, 0):  # A, B, then A again: found, nothing encoded
        call(i)
    assert len(drv.uploads) == 2 and drv.waited == []
    slot = {i: (dst - 0x7000_0000) // 256 + 1 for i, (dst, _) in zip((0, 1), drv.uploads)}
    call(2)  # C: B's slot is the least recently used (A was used after it): B's reads waited for, then rewritten
    assert drv.waited == [slot[1]] and (drv.uploads[-1][0] - 0x7000_0000) // 256 + 1 == slot[1]
    assert not any(drv.overwritten_pending)
