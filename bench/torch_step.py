"""A ResNet-50 stage's bf16 training step, torch's weight gradients against ours (issue 24's torch goal).

    CONVBW_ARTIFACTS=ART .venv/bin/python bench/torch_step.py compile --stage layer3 --batch 128   # here: the
                                                  # kernels an H100/H200 asks for (sm_90a where it takes), into ART
    CONVBW_ARTIFACTS=ART python3 bench/torch_step.py run --out OUT --stage layer3 --batch 128     # on the GPU

``run`` starts one process per part:
- ``train``: examples/torch_enable.py's training loop (autocast bf16, channels-last, SGD, 4 fixed batches, seed
  0) run four times: torch, ours (``convbw_mlir.torch.enable()``), torch again and torch with
  ``cudnn.benchmark`` (torch's own spread of losses and step times, the yardstick for ours); the profiler's
  share of ``convolution_backward`` in our dW and in cuDNN's wgrad; the kernels loaded (family, path, CUDA
  graphs recorded, tensor maps encoded: after warm-up neither may grow step by step); three steps of ours
  under ``torch.cuda.set_sync_debug_mode("warn")`` (a host wait torch can see is counted).
- ``layers``: each distinct convolution of the stage alone, ``aten.convolution_backward`` for dW only and for
  dx + dW, torch's against ours (through the switch, as in training): time per call by CUDA events (median
  of 5 blocks of 20 queued calls), kernel time by the profiler, ours against torch's dW (relative error).
Each writes a JSON file into OUT; ``table OUT`` prints the README's tables from them.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
# the example beside this script (carried to the GPU machine) or in the repository
EXAMPLE = next(p for p in (HERE / "torch_enable.py", HERE.parent / "examples" / "torch_enable.py") if p.is_file())
CALLS, BLOCKS = 20, 5


def _example():  # noqa: ANN202
    spec = importlib.util.spec_from_file_location("torch_enable", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    return example


def _args(ns: argparse.Namespace, **more: object) -> argparse.Namespace:
    """examples/torch_enable.py's arguments for this stage (bf16 autocast on the GPU, profiled)."""
    out = argparse.Namespace(model=f"resnet50_{ns.stage}", dtype="bf16", batch=ns.batch, size=ns.size,
                             steps=ns.steps, warmup=ns.warmup, lr=ns.lr, classes=10, device="cuda", compile=False,
                             min_flops=0, profile=True, precompile=None)  # fmt: skip
    for k, v in more.items():
        setattr(out, k, v)
    return out


def compile_all(ns: argparse.Namespace) -> int:
    ex = _example()
    return ex.main(["--model", f"resnet50_{ns.stage}", "--dtype", "bf16", "--batch", str(ns.batch), "--size",
                    str(ns.size), "--precompile", "sm_90a"])  # fmt: skip


def part_train(ns: argparse.Namespace) -> dict:
    import torch

    from convbw_mlir import torch as ct

    ex = _example()
    runs, kernels = {}, []
    for r in range(ns.rounds):  # torch and ours taken in turns: this host's speed drifts over a minute
        runs[f"torch_{r}"] = ex.train(_args(ns, profile=r == 0), ours=False)
        runs[f"ours_{r}"] = ex.train(_args(ns, profile=r == 0), ours=True)
        kernels.append(ct.loaded_kernels())  # graphs and maps: one per instance and model, none per step
    torch.backends.cudnn.benchmark = True
    runs["torch_benchmark"] = ex.train(_args(ns, profile=False), ours=False)
    torch.backends.cudnn.benchmark = False
    sync_warnings = _sync_check(ex, ns)

    def worst(a: list[float], b: list[float], upto: int | None = None) -> float:
        pairs = list(zip(a, b))[:upto]
        return max(abs(x - y) / max(abs(x), 1e-12) for x, y in pairs)

    t = runs["torch_0"]["loss"]
    diffs = {name: {"max_rel_all": worst(t, r["loss"]), "max_rel_first5": worst(t, r["loss"], 5),
                    "max_rel_first20": worst(t, r["loss"], 20)}
             for name, r in runs.items() if name != "torch_0"}  # fmt: skip
    return {"device": torch.cuda.get_device_name(), "capability": list(torch.cuda.get_device_capability()),
            "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(), "args": vars(_args(ns)),
            "runs": runs, "loss_differences_vs_torch": diffs, "kernels_per_round": kernels,
            "sync_warnings": sync_warnings}  # fmt: skip


def _sync_check(ex, ns: argparse.Namespace) -> list[str]:  # noqa: ANN001
    """Three steps of ours (after warm-up) under ``set_sync_debug_mode("warn")``: the host waits torch sees."""
    import torch

    from convbw_mlir import torch as ct

    torch.manual_seed(0)
    model = ex.build(f"resnet50_{ns.stage}", 10).cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=ns.lr, momentum=0.9)
    x = torch.randn(ns.batch, ex.input_channels(f"resnet50_{ns.stage}"), ns.size, ns.size, device="cuda")
    x = x.contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (ns.batch,), device="cuda")

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x).float(), y)
        loss.backward()
        opt.step()

    ct.enable(benchmark=False)  # every dW ours: the kernels this stage's run loads
    try:
        for _ in range(5):
            step()
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                for _ in range(3):
                    step()
            finally:
                torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()
    finally:
        ct.disable()
    return [str(w.message)[:300] for w in seen if "synchroniz" in str(w.message).lower()]


def part_paired(ns: argparse.Namespace) -> dict:
    """torch's step and ours taken in turns, step by step (two models from the same seed on the same batches;
    the switch turned on and off between steps, outside the timed window, its decisions kept): the host's drift
    cancels in each pair. Then the same against ``floor`` (the switch on, every gradient passed to torch: the
    override's own cost), ``stub`` (our dW allocated, no kernel: the launch's cost by difference) and
    ``nographs`` (plain launches, no in-call CUDA graphs); and the profiler's host time by op, both runs."""
    import gc

    import torch

    from convbw_mlir import torch as ct
    from convbw_mlir.torch import entry as te
    from convbw_mlir.torch import switch as sw

    ex = _example()
    model_name = f"resnet50_{ns.stage}"
    cl = torch.channels_last
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(ns.batch, ex.input_channels(model_name), ns.size, ns.size, generator=g).cuda()
                .contiguous(memory_format=cl), torch.randint(0, 10, (ns.batch,), generator=g).cuda())
               for _ in range(4)]  # fmt: skip

    def fresh():  # noqa: ANN202
        torch.manual_seed(0)
        model = ex.build(model_name, 10).cuda().to(memory_format=cl)
        return model, torch.optim.SGD(model.parameters(), lr=ns.lr, momentum=0.9)

    saved: dict = {}  # decisions kept per kind of switch, so that no step decides anew

    def _same(mode: str) -> str:  # modes whose switch decides alike
        return mode if mode in ("floor", "subset", "bench") else "ours"

    current = [None]
    filters = {"floor": lambda sig: False, "subset": _faster_layers}

    def switch(mode: str | None) -> None:
        if mode is None:
            if current[0] is not None:
                saved.setdefault(_same(current[0]), {}).update(sw.decisions())
            ct.disable()
        else:  # "bench": enable(benchmark=True), each problem timed against cuDNN once, the faster kept
            ct.enable(layers=filters.get(mode), benchmark=mode == "bench")
            sw.decisions().update(saved.get(_same(mode), {}))
        current[0] = mode

    def step(model, opt, i: int) -> tuple[float, float, float]:  # noqa: ANN001
        x, y = batches[i % len(batches)]
        torch.cuda.synchronize()
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x).float(), y)
        loss.backward()
        opt.step()
        queued = time.perf_counter() - start
        torch.cuda.synchronize()
        return time.perf_counter() - start, queued, loss.item()

    real_weight_grad = sw._weight_grad

    def stub(direct, x, w, go, *args):  # noqa: ANN001, ANN002, ANN202
        if direct is None:
            return real_weight_grad(direct, x, w, go, *args)
        return torch.empty_strided(*direct[1], dtype=x.dtype, device=x.device)

    def paired(mode: str, steps: int) -> dict:
        (tm, topt), (om, oopt) = fresh(), fresh()
        rows = []
        gc.collect()
        for i in range(steps):
            t = step(tm, topt, i)
            switch(mode)
            if mode == "stub":
                sw._weight_grad = stub
            graphs = {k: k.use_graphs for k in te.direct_calls()}
            if mode == "nographs":
                for k in graphs:
                    k.use_graphs = False
            try:
                o = step(om, oopt, i)
            finally:
                sw._weight_grad = real_weight_grad
                for k, v in graphs.items():
                    k.use_graphs = v
                switch(None)
            rows.append((t, o))
        warm = rows[ns.warmup :]
        med = statistics.median
        return {"mode": mode, "steps": steps, "torch_step_ms": med(t[0] for t, _ in warm) * 1e3,
                "mode_step_ms": med(o[0] for _, o in warm) * 1e3,
                "torch_host_ms": med(t[1] for t, _ in warm) * 1e3, "mode_host_ms": med(o[1] for _, o in warm) * 1e3,
                "ratio_median": med(o[0] / t[0] for t, o in warm),
                "host_diff_ms_median": med((o[1] - t[1]) * 1e3 for t, o in warm),
                "torch_loss": [t[2] for t, _ in rows], "mode_loss": [o[2] for _, o in rows],
                "torch_step_s": [t[0] for t, _ in rows], "mode_step_s": [o[0] for _, o in rows],
                "torch_host_s": [t[1] for t, _ in rows], "mode_host_s": [o[1] for _, o in rows]}  # fmt: skip

    result = {"device": torch.cuda.get_device_name(), "lr": ns.lr, "batch": ns.batch, "size": ns.size}
    result["runs"] = [paired("ours", ns.steps)]
    for mode in ns.modes.split(","):
        result["runs"].append(paired(mode, 40))
    result["profile"] = {who: _host_profile(fresh, step, switch, who) for who in ("torch", "ours")}
    result["kernels"] = ct.loaded_kernels()
    return result


def _faster_layers(sig: tuple) -> bool:
    """``enable(layers=...)``'s filter of mode ``subset``: every convolution but the stride-1 1x1s, where cuDNN's
    kernel is faster than the sm_90a kernel at these sizes (``*_layers.json``)."""
    shape, stride = sig[0], sig[1]
    return tuple(shape[2:]) != (1, 1) or tuple(stride) != (1, 1)


def _host_profile(fresh, step, switch, who: str) -> list:  # noqa: ANN001
    """The profiler's host (and device) time by op over 3 steps after 5 unprofiled ones: the 30 longest on the host."""
    from torch.profiler import ProfilerActivity, profile

    model, opt = fresh()
    if who == "ours":
        switch("ours")
    try:
        for i in range(5):
            step(model, opt, i)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for i in range(3):
                step(model, opt, i)
    finally:
        if who == "ours":
            switch(None)
    rows = [(e.key, e.count, e.cpu_time_total / 3, e.self_cpu_time_total / 3, e.device_time_total / 3)
            for e in prof.key_averages()]  # fmt: skip
    return sorted(rows, key=lambda r: -r[2])[:40]


def _signatures(ns: argparse.Namespace) -> list[dict]:
    """The stage's convolutions (as its backward asks for dW), distinct, with how many of each: one step on meta."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    ex = _example()
    seen: dict[tuple, dict] = {}

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, a=(), kw=None):  # noqa: ANN001, ANN204
            if func is torch.ops.aten.convolution_backward.default and a[-1][1]:
                go, x, w, _, stride, padding, dilation, _, _, groups, _ = a
                key = (tuple(x.shape), tuple(w.shape), tuple(go.shape), tuple(stride), tuple(padding),
                       tuple(dilation), groups)  # fmt: skip
                seen.setdefault(key, {"x": key[0], "w": key[1], "dy": key[2], "stride": key[3], "padding": key[4],
                                      "dilation": key[5], "groups": groups, "count": 0})["count"] += 1  # fmt: skip
            return func(*a, **(kw or {}))

    model = ex.build(f"resnet50_{ns.stage}", 10).to("meta", torch.bfloat16).to(memory_format=torch.channels_last)
    x = torch.empty(ns.batch, ex.input_channels(f"resnet50_{ns.stage}"), ns.size, ns.size, device="meta",
                    dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last)  # fmt: skip
    with Record():
        model(x).float().sum().backward()
    return list(seen.values())


def part_layers(ns: argparse.Namespace) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from convbw_mlir import torch as ct

    cl, bf = torch.channels_last, torch.bfloat16
    rows = []
    for sig in _signatures(ns):
        g = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(sig["x"], generator=g, device="cuda", dtype=bf).contiguous(memory_format=cl)
        dy = torch.randn(sig["dy"], generator=g, device="cuda", dtype=bf).contiguous(memory_format=cl)
        w = torch.randn(sig["w"], generator=g, device="cuda", dtype=bf).contiguous(memory_format=cl)
        conf = (list(sig["stride"]), list(sig["padding"]), list(sig["dilation"]), False, [0, 0], sig["groups"])
        row = dict(sig, problem=ct.problem_for(x, sig["w"], dy, *conf[:3], sig["groups"])[0].name)

        def call(mask: list[bool], x=x, dy=dy, w=w, conf=conf):  # noqa: ANN001, ANN202
            return torch.ops.aten.convolution_backward(dy, x, w, None, *conf, mask)

        for who in ("torch", "ours"):
            if who == "ours":
                ct.enable(benchmark=False)  # our dW on every layer, weighed or not
            try:
                for mask_name, mask in (("dw", [False, True, False]), ("dx_dw", [True, True, False])):
                    for _ in range(5):
                        call(mask)
                    torch.cuda.synchronize()
                    blocks = []
                    for _ in range(BLOCKS):
                        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        a.record()
                        for _ in range(CALLS):
                            call(mask)
                        b.record()
                        b.synchronize()
                        blocks.append(a.elapsed_time(b) * 1e3 / CALLS)
                    row[f"{who}_{mask_name}_us"] = statistics.median(blocks)
                    with profile(activities=[ProfilerActivity.CUDA]) as prof:
                        for _ in range(CALLS):
                            call(mask)
                        torch.cuda.synchronize()
                    kernels = [e for e in prof.key_averages() if e.device_time_total > 0]
                    row[f"{who}_{mask_name}_kernel_us"] = sum(e.device_time_total for e in kernels) / CALLS
                    row[f"{who}_{mask_name}_kernels"] = sorted(
                        ((e.key, e.device_time_total / CALLS) for e in kernels), key=lambda kv: -kv[1]
                    )[:6]
                row[f"{who}_dw"] = call([False, True, False])[1].float()
            finally:
                ct.disable()
        ref, got = row.pop("torch_dw"), row.pop("ours_dw")
        row["dw_rel_error_vs_torch"] = ((got - ref).norm() / ref.norm()).item()
        rows.append(row)
    return {"device": torch.cuda.get_device_name(), "layers": rows, "kernels": ct.loaded_kernels()}


def part_host(ns: argparse.Namespace) -> dict:
    """Host time a call, µs (no waits inside a block of 100 calls; median of 5 blocks), of torch's
    ``convolution_backward`` and of each piece of ours, on every distinct convolution of the stage."""

    import torch

    return {"device": torch.cuda.get_device_name(), "rows": [_host_row(sig) for sig in _signatures(ns)]}


def _host_row(sig: dict) -> dict:
    """:func:`part_host`'s times for one convolution."""
    import time

    import torch

    from convbw_mlir import torch as ct
    from convbw_mlir.torch import entry as te

    cl, bf = torch.channels_last, torch.bfloat16
    x = torch.randn(sig["x"], device="cuda", dtype=bf).contiguous(memory_format=cl)
    dy = torch.randn(sig["dy"], device="cuda", dtype=bf).contiguous(memory_format=cl)
    w = torch.randn(sig["w"], device="cuda", dtype=bf).contiguous(memory_format=cl)
    conf = (list(sig["stride"]), list(sig["padding"]), list(sig["dilation"]), False, [0, 0], sig["groups"])
    problem = ct.problem_for(x, sig["w"], dy, *conf[:3], sig["groups"])[0]
    aten = torch.ops.aten.convolution_backward

    def timed(fn) -> float:  # noqa: ANN001
        for _ in range(10):
            fn()
        blocks = []
        for _ in range(5):
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(100):
                fn()
            blocks.append((time.perf_counter() - start) * 1e4)  # µs a call
        torch.cuda.synchronize()
        return statistics.median(blocks)

    row = {"problem": problem.name, "count": sig["count"]}
    masks = {"dx_dw": [True, True, False], "dx": [True, False, False], "dw": [False, True, False]}
    for name, mask in masks.items():
        row[f"torch_{name}"] = timed(lambda mask=mask: aten(dy, x, w, None, *conf, mask))
    ct.enable(layers=lambda sig: False)  # the override's floor: Python entered, everything torch's
    row["switch_floor_dx_dw"] = timed(lambda: aten(dy, x, w, None, *conf, masks["dx_dw"]))
    ct.enable(benchmark=False)  # our dW on every layer, weighed or not
    for name in ("dx_dw", "dw"):
        row[f"ours_{name}"] = timed(lambda mask=masks[name]: aten(dy, x, w, None, *conf, mask))
    ct.disable()
    kw = {"stride": sig["stride"], "padding": sig["padding"], "dilation": sig["dilation"], "groups": sig["groups"]}
    row["conv_weight"] = timed(lambda: ct.conv_weight(x, sig["w"], dy, **kw))
    kernel = te.kernel_of(problem, x.device)
    out = ct.conv_weight(x, sig["w"], dy, **kw)
    row["empty_strided"] = timed(lambda: torch.empty_strided(out.shape, out.stride(), dtype=bf, device="cuda"))
    if type(kernel) is te.DirectCall:
        row["direct_call_graph"] = timed(lambda: kernel(x, dy, out))
        kernel.use_graphs = False
        row["direct_call_launches"] = timed(lambda: kernel(x, dy, out))
        kernel.use_graphs = True
        stream = torch.cuda.current_stream().cuda_stream
        ws = te.workspace(kernel.index, stream)
        ptrs = (x.data_ptr(), dy.data_ptr(), out.data_ptr(), ws.data_ptr())
        row["launcher_alone"] = timed(lambda: kernel.launcher(ptrs, stream))
    return row


def run(ns: argparse.Namespace) -> int:
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    rc = 0
    for part in ns.parts.split(","):
        path = out / f"{ns.stage}_b{ns.batch}_{part}.json"
        cmd = [sys.executable, __file__, "part", part, "--out", str(path), "--stage", ns.stage, "--batch",
               str(ns.batch), "--size", str(ns.size), "--steps", str(ns.steps), "--warmup", str(ns.warmup), "--lr",
               str(ns.lr), "--rounds", str(ns.rounds), "--modes", ns.modes]  # fmt: skip
        print(f"== {ns.stage} batch {ns.batch}: {part}", flush=True)
        rc |= subprocess.run(cmd).returncode
    return rc


def part(ns: argparse.Namespace) -> int:
    result = {"train": part_train, "layers": part_layers, "host": part_host, "paired": part_paired}[ns.part](ns)
    Path(ns.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


def table(ns: argparse.Namespace) -> int:
    """The README's tables from ``run``'s files."""
    out = Path(ns.out)
    for f in sorted(out.glob("*_train.json")):
        r = json.loads(f.read_text())
        print(f"\n{f.name}: {r['device']}, torch {r['torch']}, cuDNN {r['cudnn']}, lr {r['args']['lr']}")
        print("| run | median step ms | median host ms (queued) | GPU kernels ms/step | conv backward ms/step | "
              "ours: our dW ms/step | dW ours |")  # fmt: skip
        print("|---|---:|---:|---:|---:|---:|---|")
        for name, run_ in r["runs"].items():
            s = run_.get("wgrad_share_ours") or {}
            prof = [f"{s[k] / 3e3:.2f}" if s else "" for k in ("kernels_us", "convolution_backward_us", "ours_us")]
            print(
                f"| {name} | {run_['median_step_s'] * 1e3:.2f} | {run_['median_queue_s'] * 1e3:.2f} | "
                f"{' | '.join(prof)} | {run_['stats'].get('ours', 0)} of {sum(run_['stats'].values())} |"
            )
        rounds = sorted({int(k.split("_")[1]) for k in r["runs"] if k.startswith("ours_")})
        ratios = [r["runs"][f"ours_{i}"]["median_step_s"] / r["runs"][f"torch_{i}"]["median_step_s"] for i in rounds]
        print("ours / torch per round:", " ".join(f"{x:.3f}" for x in ratios))
        for name, d in r["loss_differences_vs_torch"].items():
            print(f"loss vs torch_0, {name}: first 5 {d['max_rel_first5']:.1e}, first 20 {d['max_rel_first20']:.1e}, "
                  f"all {d['max_rel_all']:.1e}")  # fmt: skip
        print("sync warnings:", r["sync_warnings"])
        for i, ks in enumerate(r["kernels_per_round"]):
            print(f"round {i}:", "; ".join(f"{k['problem'][:40]} {k['family']} {k['path']} graphs {k.get('graphs')} "
                                          f"maps {k.get('maps_encoded')}" for k in ks))  # fmt: skip
    for f in sorted(out.glob("*_layers.json")):
        r = json.loads(f.read_text())
        fam = {k["problem"]: k for k in r["kernels"]}
        print(f"\n{f.name}: {r['device']}")
        print(
            "| x | w | stride | count | family | dW torch / ours us (call) | kernel | dx+dW torch / ours | "
            "dW rel. error |"
        )
        print("|---|---|---|---:|---|---|---|---|---:|")
        for row in r["layers"]:
            k = fam.get(row["problem"], {})
            fams = f"{k.get('family', 'torch')} ({k.get('path', '-')}, split {k.get('splits')})"
            print(
                f"| {row['x']} | {row['w']} | {row['stride']} | {row['count']} | {fams} | "
                f"{row['torch_dw_us']:.1f} / {row['ours_dw_us']:.1f} | "
                f"{row['torch_dw_kernel_us']:.1f} / {row['ours_dw_kernel_us']:.1f} | "
                f"{row['torch_dx_dw_us']:.1f} / {row['ours_dx_dw_us']:.1f} | {row['dw_rel_error_vs_torch']:.1e} |"
            )
    for f in sorted(out.glob("*_paired.json")):
        r = json.loads(f.read_text())
        print(f"\n{f.name}: {r['device']}, batch {r['batch']}, size {r['size']}, lr {r['lr']}; in turns")
        print("| mode | steps | torch step ms | mode step ms | median ratio | torch host ms | mode host ms | "
              "median host diff ms |")  # fmt: skip
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        for run_ in r["runs"]:
            print(f"| {run_['mode']} | {run_['steps']} | {run_['torch_step_ms']:.2f} | {run_['mode_step_ms']:.2f} | "
                  f"{run_['ratio_median']:.3f} | {run_['torch_host_ms']:.2f} | {run_['mode_host_ms']:.2f} | "
                  f"{run_['host_diff_ms_median']:.2f} |")  # fmt: skip
        first = r["runs"][0]
        rel = [abs(a - b) / abs(a) for a, b in zip(first["torch_loss"], first["mode_loss"])]
        print(f"losses: max relative difference {max(rel):.1e} (first 5: {max(rel[:5]):.1e})")
        for who, rows in r["profile"].items():
            print(f"host profile, {who} (ms a step: host total, host self, device):")
            for key, count, cpu, self_cpu, dev in rows[:22]:
                print(f"   {key[:60]:60s} x{count // 3:<4d} {cpu / 1e3:7.3f} {self_cpu / 1e3:7.3f} {dev / 1e3:7.3f}")
    cols = ["torch_dx_dw", "torch_dx", "torch_dw", "switch_floor_dx_dw", "ours_dx_dw", "ours_dw", "conv_weight",
            "direct_call_graph", "direct_call_launches", "launcher_alone", "empty_strided"]  # fmt: skip
    for f in sorted(out.glob("*_host.json")):
        r = json.loads(f.read_text())
        print(f"\n{f.name}: {r['device']}, host µs a call")
        print("| problem | count | " + " | ".join(cols) + " |")
        print("|---|---:|" + "---:|" * len(cols))
        for row in r["rows"]:
            vals = " | ".join(f"{row[c]:.1f}" if c in row else "" for c in cols)
            print(f"| {row['problem']} | {row['count']} | {vals} |")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("verb", choices=("compile", "run", "part", "table"))
    p.add_argument("part", nargs="?", choices=("train", "layers", "host", "paired"))
    p.add_argument("--out", default="torch_step_out")
    p.add_argument("--stage", default="layer3", choices=("layer1", "layer2", "layer3", "layer4"))
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--size", type=int, help="the stage's input size (default: its size at 224x224 images)")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--parts", default="paired,train,layers,host")
    p.add_argument("--rounds", type=int, default=3, help="torch and ours runs, taken in turns")
    p.add_argument("--modes", default="floor,stub,nographs,ours", help="paired: the modes after the first ours")
    ns = p.parse_args(argv)
    if ns.size is None:
        ns.size = {"layer1": 56, "layer2": 56, "layer3": 28, "layer4": 14}[ns.stage]
    return {"compile": compile_all, "run": run, "part": part, "table": table}[ns.verb](ns)


if __name__ == "__main__":
    sys.exit(main())
