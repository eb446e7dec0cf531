"""The torch entry point on the GPU: correctness on the suites, per-call cost vs cuDNN, training loops.

Here (IREE compiler installed), compile every kernel it needs for the GPU machine:
    python bench/torch_gpu.py compile DIR [--target sm_80]
There (torch + iree-base-runtime, no compiler), with DIR carried over:
    python bench/torch_gpu.py all DIR --out OUTDIR      (each part in its own process)
    python bench/torch_gpu.py check|time DIR --out FILE.json
``check`` runs :func:`convbw_mlir.torch.conv_weight` on every problem of the ``seeds`` and ``models`` suites
(channels-last tensors; a few contiguous ones too) and compares with a float64 torch reference under the
product's tolerance (convbw_mlir.reference.tolerance), with cuDNN's f16 error beside it. ``time`` measures
per call, for the smallest problems: queued (back to back) and single (call + wait for the result) through
IREE's Python function invoker (``Kernel``), the prepared call (``PreparedCall``), the whole entry point
and cuDNN, and the GPU time of the kernels alone (CUPTI through torch.profiler); each problem twice, in
two processes: the IREE runtime path (``CONVBW_CUDA_LAUNCH=iree``) and the direct launch on torch's stream
(``direct``: the entry point, the launcher alone, a CUDA graph of the entry point replayed).
``check`` and ``overread`` run through the path ``CONVBW_CUDA_LAUNCH`` names (``all`` sets ``direct``); a
process that dies is started again after the problem it died on (recorded as failed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CONTIGUOUS = ("resnext50_g32_c8_28", "streamk_3x3_128x128_n32_14", "mobilenetv2_dw_g144_56")
TIMED = 8  # the smallest problems by flops, where the call's overhead shows
TRAIN = {"resnext": dict(batch=32, size=56), "mobilenet": dict(batch=32, size=56)}  # noqa: C408


LIMIT: int | None = None  # --limit: the first problems of the suites only (a dry run on the CPU)
FULL = False  # --full: time's IREE process also times cuDNN, IREE's invoker, the async module, CUPTI
DEVICE = "cuda"


def suite_problems() -> list[tuple[str, object]]:
    from convbw_mlir.suites import load_suite

    return (load_suite("seeds") + load_suite("models"))[:LIMIT]


def training_problems(model: str, batch: int, size: int) -> list:
    """The problems a training step of ``examples/torch_training.py``'s model poses (f16, channels-last)."""
    import torch

    sys.path.insert(0, str(HERE.parent / "examples"))
    from torch_training import build

    from convbw_mlir.torch import problem_for

    net, channels = build(model)
    net = net.to(memory_format=torch.channels_last)
    found = []

    def hook(layer, inputs, output):  # noqa: ANN001, ANN202
        x = inputs[0].to(torch.float16)
        dy = torch.empty_like(output, dtype=torch.float16)
        p, _ = problem_for(x, layer.weight.shape, dy, layer.stride, layer.padding, layer.dilation, layer.groups)
        found.append(p)

    for m in net.modules():
        if isinstance(m, torch.nn.Conv2d):
            m.register_forward_hook(hook)
    with torch.no_grad():
        net(torch.zeros(batch, channels, size, size).contiguous(memory_format=torch.channels_last))
    return list(dict.fromkeys(found))


def compile_all(root: Path, target: str) -> None:
    """Kernels with a caller-owned output (the entry point's) and, for the timed ones, without (the
    Python invoker's), saved as ``root/<target>/<name>`` and ``root/plain-<target>/<name>``."""
    from convbw_mlir import compile_op

    problems = [p for _, p in suite_problems()]
    contiguous = [p.with_(layout=4) for n, p in suite_problems() if n in CONTIGUOUS]
    train = [p for m, kw in TRAIN.items() for p in training_problems(m, **kw)] if LIMIT is None else []
    timed = sorted(problems, key=lambda p: p.flops)[:TIMED]
    jobs = [(p, True, "") for p in dict.fromkeys(problems + contiguous + train)]
    jobs += [(p, False, "plain-") for p in timed] + [(p, True, "async-") for p in timed]
    for i, (p, out_arg, kind) in enumerate(jobs):
        folder = root / f"{kind}{target}" / p.name
        if (folder / "op.json").is_file():
            continue
        t0 = time.perf_counter()
        flags = ["--iree-execution-model=async-external"] if kind == "async-" else None
        compile_op(p, target, flags, isolate=True, output_arg=out_arg).save(folder)
        print(f"[{i + 1}/{len(jobs)}] {folder.relative_to(root)} {time.perf_counter() - t0:.1f} s", flush=True)


def _torch_inputs(p, fmt: str):  # noqa: ANN001, ANN202
    """x, weight size and dy as torch tensors for problem ``p`` (the layout ``fmt``), unit normal."""
    import torch

    device = DEVICE
    g, n, c, k = p.groups, p.batch, p.in_channels, p.out_channels
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(n, g * c, *p.input_size, device=device, generator=gen, dtype=torch.float16)
    dy = torch.randn(n, g * k, *p.output_size, device=device, generator=gen, dtype=torch.float16)
    if fmt == "channels_last":
        perm = (0, *range(2, x.dim()), 1)
        x, dy = (t.permute(perm).contiguous().permute([perm.index(i) for i in range(t.dim())]) for t in (x, dy))
    return x, (g * k, c, *p.filter_size), dy


def _torch_args(p) -> dict:  # noqa: ANN001
    assert p.pad_low == p.pad_high, p
    return dict(stride=p.stride, padding=p.pad_low, dilation=p.dilation, groups=p.groups)  # noqa: C408


def _error(p, got, want) -> float:  # noqa: ANN001
    """convbw_mlir.reference.assert_close's measure: max |got - want| / (|want| + rms(want))."""
    got, want = got.double(), want.double()
    scale = float(want.pow(2).mean().sqrt()) or 1.0
    return float(((got - want).abs() / (want.abs() + scale)).max())


def check(out: Path) -> None:
    """conv_weight vs a float64 reference on every suite problem; one JSON line per problem."""
    import torch

    from convbw_mlir.reference import tolerance
    from convbw_mlir.torch import conv_weight

    cases = [(n, p, "channels_last") for n, p in suite_problems()]
    cases += [(n, p.with_(layout=4), "contiguous") for n, p in suite_problems() if n in CONTIGUOUS]
    done = _done(out)
    with open(out, "a") as f:
        for name, p, fmt in cases:
            if _started(out, f"{name}/{fmt}", done):
                continue
            rec = {"name": name, "problem": p.name, "format": fmt, "key": f"{name}/{fmt}", "path": _path()}
            try:
                x, wsize, dy = _torch_inputs(p, fmt)
                kw = _torch_args(p)
                wgrad = getattr(torch.nn.grad, f"conv{p.rank}d_weight")
                want = wgrad(x.double(), wsize, dy.double(), **kw)
                got = conv_weight(x, wsize, dy, **kw)
                _sync()
                cudnn = wgrad(x, wsize, dy, **kw)
                rec.update(
                    ok=_error(p, got, want) <= tolerance(p)[0], error=_error(p, got, want),
                    tolerance=tolerance(p)[0], cudnn_error=_error(p, cudnn, want),
                    same_shape=tuple(got.shape) == tuple(wsize), dtype=str(got.dtype), device=str(got.device),
                )  # fmt: skip
            except Exception as e:  # one problem's failure is recorded, the rest still run
                rec.update(ok=False, error_message=f"{type(e).__name__}: {e}"[:500])
            print(json.dumps(rec), flush=True)
            f.write(json.dumps(rec) + "\n")


def _path() -> str:
    return os.environ.get("CONVBW_CUDA_LAUNCH", "auto")


def _done(out: Path) -> set[str]:
    """The keys of the records already in ``out`` (a resumed part skips them)."""
    if not out.is_file():
        return set()
    return {json.loads(x).get("key", json.loads(x)["name"]) for x in out.read_text().splitlines() if x.strip()}


def _started(out: Path, key: str, done: set[str]) -> bool:
    """True where ``key`` is done; else marks it started (the parent names it if this process dies)."""
    if key in done:
        return True
    out.with_suffix(".started").write_text(key)
    return False


def _resumable(cmd: list[str], out: Path, log, env: dict, limit: float) -> str:  # noqa: ANN001
    """Run a part that appends one record per problem to ``out``; where its process dies, record the problem
    it was on as failed and start it again after that one (one CUDA fault poisons a process)."""
    out.unlink(missing_ok=True)
    out.with_suffix(".started").unlink(missing_ok=True)
    start, rcs = time.perf_counter(), []
    while True:
        left = limit - (time.perf_counter() - start)
        try:
            rc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=max(left, 5)).returncode
        except subprocess.TimeoutExpired:
            rcs.append("timeout")
            return ",".join(map(str, rcs))
        rcs.append(rc)
        marker = out.with_suffix(".started")
        if rc == 0 or not marker.is_file() or marker.read_text() in _done(out) or len(rcs) > 8:
            return ",".join(map(str, rcs))
        key = marker.read_text()
        died = {"name": key.split("/")[0], "key": key, "ok": False, "error_message": f"process died: rc={rc}"}
        with open(out, "a") as f:
            f.write(json.dumps(died) + "\n")


def _sync() -> None:
    import torch

    if DEVICE.startswith("cuda"):
        torch.cuda.synchronize()


def _timed(fn, sync, n: int = 200) -> dict:  # noqa: ANN001
    """Median µs per call queued (``n`` back to back, one wait) and single (call + wait), 5 rounds each
    (on the CPU, a dry run: 2 calls and 3 singles)."""
    n, singles = (n, 50) if DEVICE.startswith("cuda") else (2, 3)
    for _ in range(3):
        fn()
    sync()
    queued, single = [], []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        queued.append((time.perf_counter() - t0) / n)
    for _ in range(singles):
        t0 = time.perf_counter()
        fn()
        sync()
        single.append(time.perf_counter() - t0)
    return {"queued_us": 1e6 * statistics.median(queued), "single_us": 1e6 * statistics.median(single)}


def _kernel_us(fn, calls: int = 20) -> dict:  # noqa: ANN001
    """GPU time of the kernels one call launches (CUPTI through torch.profiler), ours and torch's apart."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    if not DEVICE.startswith("cuda"):
        return {}
    fn()
    _sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        _sync()
    total, names = 0.0, set()
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time > 0:
            total += e.device_time
            names.add(e.name[:60])
    return {"kernel_us": total / calls, "kernels": sorted(names)[:6]}


def _cudnn_call(p, x, wsize, dy, kw: dict):  # noqa: ANN001, ANN202
    """cuDNN's weight gradient of ``p`` on these tensors, as torch's autograd calls it (dW only)."""
    import torch

    w = torch.empty(wsize, device=DEVICE, dtype=x.dtype)

    def cudnn():  # noqa: ANN202
        return torch.ops.aten.convolution_backward(
            dy, x, w, None, kw["stride"], kw["padding"], kw["dilation"], False, [0] * p.rank, p.groups,
            [False, True, False],
        )  # fmt: skip

    return cudnn


def _time_one(root: Path, p) -> dict:  # noqa: ANN001
    """The IREE runtime path's per-call time on problem ``p`` (channels-last f16 tensors): the prepared call and
    the entry point; with ``--full`` also cuDNN, IREE's Python invoker, the async-fences module and CUPTI kernel
    times (the kernels are the direct path's: the same PTX)."""
    import iree.runtime as rt
    import torch

    from convbw_mlir.build.artifact import CompiledOp
    from convbw_mlir.torch import conv_weight, problem_for, target_for
    from convbw_mlir.torch.entry import kernel_for

    sync = _sync
    rec = {}
    x, wsize, dy = _torch_inputs(p, "channels_last")
    kw = _torch_args(p)
    cudnn = _cudnn_call(p, x, wsize, dy, kw)

    prof = _kernel_us if FULL else (lambda fn: {})
    if FULL:
        rec["cudnn"] = _timed(cudnn, sync) | _kernel_us(cudnn)
    target, _, index = target_for(x.device)
    perm = (0, *range(2, x.dim()), 1)
    if FULL:
        plain = CompiledOp.load(root / f"plain-{target}" / p.name).kernel(index)
        xd, dyd = (plain.device.from_dlpack_capsule(t.permute(perm).__dlpack__()) for t in (x, dy))
        xd = rt.HalBufferView(xd.get_buffer(), list(p.x_shape), rt.HalElementType.FLOAT_16)
        dyd = rt.HalBufferView(dyd.get_buffer(), list(p.dy_shape), rt.HalElementType.FLOAT_16)

        def invoker():  # noqa: ANN202 - IREE's Python function invoker; returns when done (the sync model)
            return plain._fn(xd, dyd)

        rec["invoker"] = _timed(invoker, sync) | _kernel_us(invoker)
        t_rb = []  # single call with read-back as the benchmark did it: the result copied to the host
        for _ in range(30):
            t0 = time.perf_counter()
            plain._fn(xd, dyd).to_host()
            t_rb.append(time.perf_counter() - t0)
        rec["invoker"]["single_to_host_us"] = 1e6 * statistics.median(t_rb)
    prob, _ = problem_for(x, wsize, dy, **kw)
    kernel = kernel_for(prob, x.device)
    out_t = torch.empty([wsize[i] for i in perm], device=DEVICE, dtype=x.dtype).permute(
        [perm.index(i) for i in range(x.dim())]
    )
    args = kernel.prepare(
        kernel.import_dlpack(x.permute(perm), prob.x_shape, prob.dtype),
        kernel.import_dlpack(dy.permute(perm), prob.dy_shape, prob.dtype),
        kernel.import_dlpack(out_t.permute(perm), prob.dw_shape, prob.dw_dtype),
    )

    def prepared():  # noqa: ANN202
        kernel.invoke(args)

    def entry():  # noqa: ANN202
        return conv_weight(x, wsize, dy, **kw)

    rec["prepared"] = _timed(prepared, sync) | prof(prepared)
    if FULL:
        from convbw_mlir.runtime import PreparedCall

        akernel = PreparedCall(CompiledOp.load(root / f"async-{target}" / p.name).vmfb, kernel.driver, index)
        aargs = akernel.prepare(
            akernel.import_dlpack(x.permute(perm), prob.x_shape, prob.dtype),
            akernel.import_dlpack(dy.permute(perm), prob.dy_shape, prob.dtype),
            akernel.import_dlpack(out_t.permute(perm), prob.dw_shape, prob.dw_dtype),
        )

        def queued_async():  # noqa: ANN202 - returns once queued; the timing's sync waits for all
            akernel.invoke(aargs, wait=False)

        def sync_async() -> None:
            akernel.wait()
            sync()

        rec["async"] = _timed(queued_async, sync_async) | _kernel_us(queued_async)
    rec["entry"] = _timed(entry, sync) | prof(entry)
    return rec


def _time_direct(p) -> dict:  # noqa: ANN001
    """Per-call time through the direct CUDA launch on torch's stream: the entry point, the launcher alone on
    prepared tensors, and a CUDA graph of one entry-point call replayed; cuDNN in the same process."""
    import torch

    from convbw_mlir.torch import conv_weight, problem_for
    from convbw_mlir.torch.entry import DirectCall, kernel_for

    rec = {}
    x, wsize, dy = _torch_inputs(p, "channels_last")
    kw = _torch_args(p)
    cudnn = _cudnn_call(p, x, wsize, dy, kw)

    def entry():  # noqa: ANN202
        return conv_weight(x, wsize, dy, **kw)

    got = entry()
    want = getattr(torch.nn.grad, f"conv{p.rank}d_weight")(x.double(), wsize, dy.double(), **kw)
    rec["error"] = _error(p, got, want)
    rec["cudnn"] = _timed(cudnn, _sync) | _kernel_us(cudnn)
    rec["entry"] = _timed(entry, _sync) | _kernel_us(entry)
    prob, _ = problem_for(x, wsize, dy, **kw)
    kernel = kernel_for(prob, x.device)
    rec["kernel_type"] = type(kernel).__name__
    if not isinstance(kernel, DirectCall):
        return rec
    perm = (0, *range(2, x.dim()), 1)
    out_t = torch.empty([wsize[i] for i in perm], device=DEVICE, dtype=x.dtype)

    from convbw_mlir.torch import entry as ct_entry

    kernel(x, dy, out_t)  # makes the workspace of this stream
    stream = torch.cuda.current_stream().cuda_stream
    ptrs = (x.data_ptr(), dy.data_ptr(), out_t.data_ptr(), ct_entry.workspace(kernel.index, stream).data_ptr())

    def launcher():  # noqa: ANN202 - the dispatches alone: no lookup, no allocation, no graph
        kernel.launcher(ptrs, stream)

    rec["error_graph"] = _error(p, entry(), want)  # this memory was seen: a replayed CUDA graph wrote dW
    rec["graphs_recorded"] = len(kernel._graphs)
    kernel.use_graphs = False  # the entry point issuing every dispatch (CONVBW_CUDA_GRAPHS=0)
    rec["entry_nograph"] = _timed(entry, _sync)
    kernel.use_graphs = True
    rec["launcher"] = _timed(launcher, _sync)  # the same kernels as the entry point's: no second CUPTI run
    try:  # the same launches through NVIDIA's cuda-bindings instead of ctypes: which binding costs less a call
        rec["launcher_cuda_bindings"] = _timed(_cuda_bindings_launcher(kernel, x, dy, out_t), _sync)
    except Exception as e:
        rec["launcher_cuda_bindings"] = {"error_message": f"{type(e).__name__}: {e}"[:300]}
    rec["host_us"] = _host_parts(x, wsize, dy, kw, out_t)
    side = torch.cuda.Stream()  # capture needs a warmed-up side stream (torch.cuda.graphs docs)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            entry()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got_graph = entry()
    graph.replay()
    _sync()
    rec["graph_error"] = _error(p, got_graph, want)
    rec["graph_equals_eager"] = bool(torch.equal(got_graph, got))
    rec["graph"] = _timed(graph.replay, _sync)
    return rec


def _cuda_bindings_launcher(kernel, x, dy, out_t):  # noqa: ANN001, ANN202
    """``kernel``'s launches (a ``DirectCall``) as cuda-bindings' ``driver.cuLaunchKernel`` calls, with the
    launcher's own function handles and parameter arrays."""
    import torch
    from cuda.bindings import driver

    from convbw_mlir.torch import entry as ct_entry

    launcher = kernel.launcher
    assert all(step[0] == "k" for step in launcher._plan), "transfers: not timed here"
    funcs = [driver.CUfunction(step[1]) for step in launcher._plan]
    ws = ct_entry.workspace(kernel.index, ct_entry.current_stream_handle(kernel.index))

    def launch() -> None:
        stream = driver.CUstream(torch.cuda.current_stream().cuda_stream)
        ptrs = (x.data_ptr(), dy.data_ptr(), out_t.data_ptr(), ws.data_ptr())
        for func, (_, _, dims, payload, params, binds) in zip(funcs, launcher._plan, strict=True):
            for i, (which, off) in enumerate(binds):
                payload[i] = ptrs[which] + off
            (err,) = driver.cuLaunchKernel(func, *dims, stream, params, 0)
            if err != driver.CUresult.CUDA_SUCCESS:
                raise RuntimeError(f"cuLaunchKernel: {err}")

    launch()
    _sync()
    return launch


def _host_parts(x, wsize, dy, kw: dict, out_t) -> dict:  # noqa: ANN001
    """Host µs of the direct entry point's steps (medians of 2,000 calls each, no GPU wait)."""
    import torch

    from convbw_mlir.torch import entry as ct_entry

    memo = ct_entry.problem_memo(x, wsize, dy, kw["stride"], kw["padding"], kw["dilation"], kw["groups"], False)
    kernel, layout = memo.kernel, memo.out_layout
    parts = {
        "problem_memo": lambda: ct_entry.problem_memo(x, wsize, dy, kw["stride"], kw["padding"], kw["dilation"],
                                                 kw["groups"], False),
        "empty_strided": lambda: torch.empty_strided(*layout, dtype=x.dtype, device=x.device),
        "current_stream": lambda: ct_entry.current_stream_handle(x.device.index),
        "direct_call": lambda: kernel(x, dy, out_t),  # after the second call: a graph replay
    }  # fmt: skip
    out = {}
    for name, fn in parts.items():
        fn()
        t0 = time.perf_counter()
        for _ in range(2000):
            fn()
        out[name] = 1e6 * (time.perf_counter() - t0) / 2000
        _sync()
    return out


def time_all(root: Path, out: Path) -> None:
    """Per-call time of the smallest problems through each path, each path in its own process
    (``CONVBW_CUDA_LAUNCH``: the direct launch, then IREE's runtime); one JSON line per problem in ``out``."""
    me = str(Path(__file__).resolve())
    timed = sorted(suite_problems(), key=lambda np_: np_[1].flops)[:TIMED]
    recs = {n: {"name": n, "problem": p.name, "gflop": p.flops / 1e9} for n, p in timed}
    for path in ("direct", "iree"):
        part = out.with_suffix(f".{path}.jsonl")
        part.unlink(missing_ok=True)
        env = dict(os.environ, CONVBW_CUDA_LAUNCH=path)
        cmd = [sys.executable, me, "time1", str(root), "--names", ",".join(recs), "--out", str(part),
               "--device", DEVICE, *(["--full"] if FULL else [])]  # fmt: skip
        try:
            r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=200)
            why = f"process rc={r.returncode}: {r.stderr[-600:]}"
        except subprocess.TimeoutExpired:
            why = "timeout"
        done = [json.loads(x) for x in part.read_text().splitlines()] if part.is_file() else []
        for d in done:
            recs[d.pop("name")][path] = d
        for rec in recs.values():
            rec.setdefault(path, {"error_message": why})
        out.write_text("".join(json.dumps(rec) + "\n" for rec in recs.values()))  # whatever a timeout leaves
        print(f"{path}: {len(done)} of {len(recs)} problems; {why if len(done) < len(recs) else ''}", flush=True)


def time_one(root: Path, names: list[str], out: Path) -> None:
    """The named problems' timings through the path ``CONVBW_CUDA_LAUNCH`` names, a JSON line each in ``out``."""
    problems = dict(suite_problems())
    for name in names:
        try:
            rec = _time_direct(problems[name]) if _path() == "direct" else _time_one(root, problems[name])
        except Exception as e:  # one problem's failure is recorded, the rest still run
            rec = {"error_message": f"{type(e).__name__}: {e}"[:500]}
        print(json.dumps({"name": name} | rec), flush=True)
        with open(out, "a") as f:
            f.write(json.dumps({"name": name} | rec) + "\n")


def smoke(out: Path) -> None:
    """The direct launch on the two smallest problems before anything else: correct dW, inputs written on the
    same stream just before the call (no host wait between), what driver bindings this python has."""
    import importlib.util

    import torch

    from convbw_mlir.reference import tolerance
    from convbw_mlir.torch import conv_weight, problem_for
    from convbw_mlir.torch.entry import kernel_for

    rec = {
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if DEVICE.startswith("cuda") else "cpu",
        "cuda_bindings": importlib.util.find_spec("cuda") is not None
        and importlib.util.find_spec("cuda.bindings") is not None,
        "path": _path(),
        "problems": [],
    }
    for name, p in sorted(suite_problems(), key=lambda np_: np_[1].flops)[:2]:
        x, wsize, dy = _torch_inputs(p, "channels_last")
        kw = _torch_args(p)
        want = getattr(torch.nn.grad, f"conv{p.rank}d_weight")(x.double(), wsize, dy.double(), **kw)
        got = conv_weight(x, wsize, dy, **kw)
        _sync()
        x2 = torch.zeros_like(x)
        x2.copy_(x * 1.0)  # queued on torch's stream; the call must run after it without a host wait
        got2 = conv_weight(x2, wsize, dy, **kw)
        _sync()
        # the same memory again: the second call records a CUDA graph, the third replays it; new data written
        # in place on the stream just before must be what it reads
        x2.mul_(2.0)
        conv_weight(x2, wsize, dy, **kw)
        got3 = conv_weight(x2, wsize, dy, **kw)
        _sync()
        kernel = type(kernel_for(problem_for(x, wsize, dy, **kw)[0], x.device)).__name__
        rec["problems"].append({"name": name, "kernel": kernel, "error": _error(p, got, want),
                                "error_stream": _error(p, got2, want), "error_graph": _error(p, got3, 2 * want),
                                "tolerance": tolerance(p)[0]})  # fmt: skip
    rec["ok"] = all(max(r["error"], r["error_stream"], r["error_graph"]) <= r["tolerance"] for r in rec["problems"])
    print(json.dumps(rec), flush=True)
    out.write_text(json.dumps(rec) + "\n")
    if not rec["ok"]:
        sys.exit(1)


def run_all(root: Path, outdir: Path, steps: int, budget: float, only: list[str]) -> None:
    """smoke, time, check, overread and both training loops, each in its own process (a CUDA fault poisons a
    process); check, overread and training through the direct launch (``CONVBW_CUDA_LAUNCH=direct``)."""
    outdir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, CONVBW_ARTIFACTS=str(root.resolve()), CONVBW_CUDA_LAUNCH="direct")
    me = str(Path(__file__).resolve())
    start = time.perf_counter()
    extra = ["--device", DEVICE] + (["--limit", str(LIMIT)] if LIMIT else [])
    train = TRAIN if DEVICE.startswith("cuda") else {m: dict(batch=2, size=8) for m in TRAIN}  # noqa: C408
    parts = [
        ("smoke", [sys.executable, me, "smoke", str(root), "--out", str(outdir / "smoke.json"), *extra], 0.05),
        ("time", [sys.executable, me, "time", str(root), "--out", str(outdir / "time.jsonl"), *extra], 0.35),
        ("check", [sys.executable, me, "check", str(root), "--out", str(outdir / "check.jsonl"), *extra], 0.20),
        ("overread", [sys.executable, me, "overread", str(root), "--out", str(outdir / "overread.jsonl"), *extra],
         0.20),
        *(
            (f"train_{m}", [sys.executable, str(HERE.parent / "examples" / "torch_training.py"), "--model", m,
                            "--steps", str(steps), "--batch", str(kw["batch"]), "--size", str(kw["size"]),
                            "--device", DEVICE, "--out", str(outdir / f"train_{m}.json")], 0.10)
            for m, kw in train.items()
        ),
    ]  # fmt: skip
    for name, cmd, share in parts:
        if name.split("_")[0] not in only:
            continue
        left = budget - (time.perf_counter() - start)
        limit = max(10.0, min(left, share * budget + 20))
        t0 = time.perf_counter()
        with open(outdir / f"{name}.log", "w") as log:
            if name in ("check", "overread"):
                rc = _resumable(cmd, outdir / f"{name}.jsonl", log, env, limit)
            else:
                try:
                    rc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=limit).returncode
                except subprocess.TimeoutExpired:
                    rc = "timeout"
        print(f"{name}: rc={rc} in {time.perf_counter() - t0:.1f} s (limit {limit:.0f} s)", flush=True)
        print((outdir / f"{name}.log").read_text()[-1500:], flush=True)
        if name == "smoke" and rc != 0:
            print("smoke failed: the direct launch is broken, nothing else is run", flush=True)
            return


def diag(root: Path, names: list[str], out_path: Path) -> None:
    """Where a wrong dW comes from: our output-argument kernel into zeros and into NaNs (read at once and
    after a pause), and the Python invoker's kernel (IREE allocates dW), on the named suite problems."""
    import iree.runtime as rt
    import torch

    from convbw_mlir.build.artifact import CompiledOp
    from convbw_mlir.torch import problem_for
    from convbw_mlir.torch.entry import kernel_for

    recs = []
    for name, p in suite_problems():
        if name not in names:
            continue
        rec = {"name": name}
        try:
            x, wsize, dy = _torch_inputs(p, "channels_last")
            kw = _torch_args(p)
            want = getattr(torch.nn.grad, f"conv{p.rank}d_weight")(x.double(), wsize, dy.double(), **kw)
            perm = (0, *range(2, x.dim()), 1)
            inv = [perm.index(i) for i in range(x.dim())]
            prob, _ = problem_for(x, wsize, dy, **kw)
            kernel = kernel_for(prob, x.device)
            torch.cuda.synchronize()
            for fill, pause in (("zeros", 0.0), ("nan", 0.0), ("nan", 0.5), ("zeros", 0.5)):
                out = torch.full([wsize[i] for i in perm], 0.0 if fill == "zeros" else float("nan"),
                                 device=x.device, dtype=x.dtype)  # fmt: skip
                torch.cuda.synchronize()
                kernel(kernel.import_dlpack(x.permute(perm), prob.x_shape, prob.dtype),
                       kernel.import_dlpack(dy.permute(perm), prob.dy_shape, prob.dtype),
                       kernel.import_dlpack(out, prob.dw_shape, prob.dw_dtype))  # fmt: skip
                time.sleep(pause)
                got = out.permute(inv)
                rec[f"{fill}_{pause}"] = {
                    "error": _error(p, got.nan_to_num(0.0), want), "nan": int(got.isnan().sum()),
                    "zeros": int((got == 0).sum()), "size": got.numel(),
                }  # fmt: skip
            k = CompiledOp.load(root / "plain-sm_80" / p.name).kernel(0)
            xd = k.device.from_dlpack_capsule(x.permute(perm).__dlpack__())
            dyd = k.device.from_dlpack_capsule(dy.permute(perm).__dlpack__())
            xd = rt.HalBufferView(xd.get_buffer(), list(p.x_shape), rt.HalElementType.FLOAT_16)
            dyd = rt.HalBufferView(dyd.get_buffer(), list(p.dy_shape), rt.HalElementType.FLOAT_16)
            host = torch.from_numpy(k._fn(xd, dyd).to_host().copy()).to(x.device)
            rec["invoker_error"] = _error(p, host.reshape([wsize[i] for i in perm]).permute(inv), want)
        except Exception as e:
            rec["error_message"] = f"{type(e).__name__}: {e}"[:500]
        print(json.dumps(rec), flush=True)
        recs.append(rec)
    Path(out_path).write_text("\n".join(json.dumps(r) for r in recs) + "\n")


def overread(out_path: Path) -> None:
    """Does a kernel read outside its inputs? x and dy are placed in larger buffers whose other elements are
    NaN (after them, then before them); a kernel that stays in bounds gives the same finite dW."""
    import torch

    from convbw_mlir.reference import tolerance
    from convbw_mlir.torch import conv_weight

    slack = 1 << 20
    done = _done(out_path)
    with open(out_path, "a") as f:
        for name, p in suite_problems():
            if _started(out_path, name, done):
                continue
            rec = {"name": name, "key": name, "path": _path()}
            try:
                x0, wsize, dy0 = _torch_inputs(p, "channels_last")
                kw = _torch_args(p)
                want = getattr(torch.nn.grad, f"conv{p.rank}d_weight")(x0.double(), wsize, dy0.double(), **kw)
                perm = (0, *range(2, x0.dim()), 1)
                inv = [perm.index(i) for i in range(x0.dim())]
                for where in ("after", "before"):
                    views = []
                    for t in (x0, dy0):
                        dense = t.permute(perm)  # contiguous: the memory order
                        buf = torch.full((dense.numel() + slack,), float("nan"), device=t.device, dtype=t.dtype)
                        start = 0 if where == "after" else slack
                        v = buf[start : start + dense.numel()].view(dense.shape)
                        v.copy_(dense)
                        views.append(v.permute(inv))
                    got = conv_weight(views[0], wsize, views[1], **kw)
                    rec[f"nan_{where}"] = {"nan": int(got.isnan().sum()), "error": _error(p, got.nan_to_num(0), want)}
                rec["ok"] = all(rec[f"nan_{w}"]["nan"] == 0 and rec[f"nan_{w}"]["error"] <= tolerance(p)[0]
                                for w in ("after", "before"))  # fmt: skip
            except Exception as e:
                rec["error_message"] = f"{type(e).__name__}: {e}"[:300]
            print(json.dumps(rec), flush=True)
            f.write(json.dumps(rec) + "\n")


def report(results: Path, stem: Path) -> None:
    """``stem``.md (tables) and ``stem``.png (loss curves) from the files ``all`` wrote into ``results``."""
    device = ", ".join((results / "device.txt").read_text().split("\n")).strip(", ")
    lines = [f"# torch entry point on the GPU ({device})", ""]
    check = results / "check.jsonl"
    check_rows = [json.loads(x) for x in check.read_text().splitlines() if x.strip()] if check.is_file() else []
    ok = sum(r.get("ok", False) for r in check_rows)
    head = "| problem | format | error | tolerance | cuDNN f16 error | ok |"
    lines += [f"## conv_weight vs float64 torch: {ok} of {len(check_rows)} within tolerance", "",
              head, "|---|---|---|---|---|---|"]  # fmt: skip
    for r in check_rows:
        if "error" in r:
            lines.append(f"| {r['name']} | {r['format']} | {r['error']:.2e} | {r['tolerance']:.2e} | "
                         f"{r['cudnn_error']:.2e} | {'yes' if r['ok'] else '**no**'} |")  # fmt: skip
        else:
            lines.append(f"| {r['name']} | {r['format']} | {r.get('error_message', '')[:80]} | | | **no** |")
    if (results / "overread.jsonl").is_file():
        over = [json.loads(x) for x in (results / "overread.jsonl").read_text().splitlines() if x.strip()]
        bad = [r["name"] for r in over if not r.get("ok")]
        lines += ["", f"## Inputs between NaNs (overread): {len(over) - len(bad)} of {len(over)} kernels stay inside",
                  "", "Reading past the end of x or dy: " + (", ".join(bad) or "none")]  # fmt: skip
    if (results / "smoke.json").is_file():
        sm = json.loads((results / "smoke.json").read_text())
        head = f"Smoke (path {sm['path']}, torch {sm['torch']}, cuda.bindings importable: {sm['cuda_bindings']}): "
        lines += ["", head + ", ".join(f"{r['name']} {r['kernel']} error {r['error']:.2e} / after a same-stream "
                                       f"write {r['error_stream']:.2e} / graph replay after an in-place write "
                                       f"{r.get('error_graph', -1):.2e}" for r in sm["problems"])]  # fmt: skip
    if (results / "time.jsonl").is_file():
        lines += ["", "## µs per call: queued (back to back) / single (call + wait) / GPU kernels alone (CUPTI)", "",
                  "Each path in its own process: IREE's runtime (`CONVBW_CUDA_LAUNCH=iree`) and the direct launch "
                  "(`direct`, with cuDNN); CUPTI kernel times for cuDNN and the direct entry point (the other columns "
                  "launch the same PTX kernels: `-`).", "",
                  "| problem | GFLOP | cuDNN | IREE: entry point | IREE: prepared call | direct: entry point | "
                  "direct: entry point, no graphs | direct: launcher alone | same, cuda-bindings | "
                  "torch CUDA graph of the entry point | single direct / cuDNN |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
        host = []

        def cell(c: dict) -> str:
            if not c or "queued_us" not in c:
                return c.get("error_message", "-")[:60] if c else "-"
            kernel = f"{c['kernel_us']:.1f}" if "kernel_us" in c else "-"
            return f"{c['queued_us']:.1f} / {c['single_us']:.1f} / {kernel}"

        for x in (results / "time.jsonl").read_text().splitlines():
            r = json.loads(x)
            iree, direct = r.get("iree", {}), r.get("direct", {})
            if "error_message" in iree or "error_message" in direct:
                msg = (iree.get("error_message") or direct.get("error_message"))[:100]
                lines.append(f"| {r['name']} | {r['gflop']:.2f} | {msg} | | | | | | | | |")
                continue
            cudnn = direct.get("cudnn", iree.get("cudnn", {}))
            ratio = direct["entry"]["single_us"] / cudnn["single_us"] if cudnn else float("nan")
            cols = [cudnn, iree.get("entry"), iree.get("prepared"), *(direct.get(k) for k in (
                "entry", "entry_nograph", "launcher", "launcher_cuda_bindings", "graph"))]  # fmt: skip
            lines.append(
                f"| {r['name']} | {r['gflop']:.2f} | " + " | ".join(cell(c) for c in cols) + f" | {ratio:.2f} |"
            )
            if "host_us" in direct:
                host.append(f"| {r['name']} | " + " | ".join(f"{v:.1f}" for v in direct["host_us"].values()) + " |")
        if host:
            names = next(json.loads(x)["direct"]["host_us"] for x in (results / "time.jsonl").read_text().splitlines()
                         if "host_us" in json.loads(x).get("direct", {}))  # fmt: skip
            lines += ["", "Host µs of the direct entry point's steps (2,000 calls each, no wait):", "",
                      "| problem | " + " | ".join(names) + " |", "|---|" + "---|" * len(names), *host]  # fmt: skip
    curves = {m: json.loads((results / f"train_{m}.json").read_text()) for m in TRAIN
              if (results / f"train_{m}.json").is_file()}  # fmt: skip
    if curves:
        lines += ["", "## Training loops (same seeds and data; SGD momentum 0.9)", "",
                  "| model | steps | batch x size | max rel. loss difference | final loss torch / ours | "
                  "step ms torch / ours | layers switched |", "|---|---|---|---|---|---|---|"]  # fmt: skip
        for m, r in curves.items():
            lines.append(
                f"| {m} | {r['steps']} | {r['batch']} x {r['size']}² | {r['max_rel_loss_diff']:.2e} | "
                f"{r['torch']['losses'][-1]:.4f} / {r['ours']['losses'][-1]:.4f} | "
                f"{r['step_ms_torch']:.2f} / {r['step_ms_ours']:.2f} | {len(r['ours']['converted'])} |"
            )
        try:
            import matplotlib
        except ImportError:  # the tables still get written
            print("report: no matplotlib here, no plot", file=sys.stderr)
            curves = {}
    if curves:
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(2, len(curves), figsize=(6 * len(curves), 6), squeeze=False)
        for i, (m, r) in enumerate(curves.items()):
            axes[0][i].plot(r["torch"]["losses"], label="torch (cuDNN dW)")
            axes[0][i].plot(r["ours"]["losses"], "--", label="ours (convbw dW)")
            axes[0][i].set_title(f"{m}: loss"), axes[0][i].legend()
            axes[1][i].semilogy([max(d, 1e-12) for d in r["rel_loss_diff"]])
            axes[1][i].set_title(f"{m}: relative loss difference"), axes[1][i].set_xlabel("step")
        fig.tight_layout()
        fig.savefig(stem.with_suffix(".png"), dpi=100)
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["compile", "check", "time", "time1", "smoke", "all", "report", "diag", "overread"])
    ap.add_argument("--names", default="", help="diag: comma-separated suite names; time1: one name")
    ap.add_argument("root", type=Path, help="the artifacts folder (CONVBW_ARTIFACTS); for report: the results")
    ap.add_argument("--target", default="sm_80")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--budget", type=float, default=240.0, help="seconds for 'all'")
    ap.add_argument("--limit", type=int, help="only the first LIMIT suite problems (a dry run)")
    ap.add_argument("--device", default="cuda", help="torch device of check/time (cpu: a dry run, target host)")
    ap.add_argument("--full", action="store_true", help="time: every contender of the IREE path, with CUPTI")
    ap.add_argument("--parts", default="smoke,time,check,overread,train", help="all: the parts to run")
    a = ap.parse_args()
    global LIMIT, DEVICE, FULL
    LIMIT, DEVICE, FULL = a.limit, a.device, a.full
    os.environ.setdefault("CONVBW_ARTIFACTS", str(a.root))
    if a.what == "compile":
        compile_all(a.root, a.target)
    elif a.what == "check":
        check(a.out)
    elif a.what == "overread":
        overread(a.out)
    elif a.what == "diag":
        diag(a.root, a.names.split(","), a.out)
    elif a.what == "report":
        report(a.root, a.out)
    elif a.what == "time":
        time_all(a.root, a.out)
    elif a.what == "time1":
        time_one(a.root, a.names.split(","), a.out)
    elif a.what == "smoke":
        smoke(a.out)
    else:
        run_all(a.root, a.out, a.steps, a.budget, a.parts.split(","))


if __name__ == "__main__":
    main()
