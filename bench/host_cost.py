"""Where the torch switch's host time goes in a whole model's training step (issue 37's ~350 us a call).

    CONVBW_ARTIFACTS=ART python3 bench/host_cost.py --model resnet50 --batch 64 --out OUT   # on the GPU
    CONVBW_ARTIFACTS=ART python3 bench/host_cost.py --native --out OUT   # ours by the C++ hot path
    CONVBW_TORCH_NATIVE_LAUNCH=1 CONVBW_ARTIFACTS=ART python3 bench/host_cost.py --native --model efficientnet_b0 ...

One process, eager, bf16 autocast, channels-last, SGD, 4 fixed batches (examples/torch_enable.py's loop): torch,
ours (``enable()``), torch again; per mode the median step time and the host's part of it (time to queue the
step). For ours, after warm-up: the host time inside each layer of the switch's hot path (the override, the
decision memo, the problem memo, the direct call, the launcher, tensor-map encoding, CUDA-graph recording) by
wrapping those functions with a clock, the counts of graphs recorded and maps encoded per step, cProfile's top
functions over 3 steps, and torch.profiler's CUDA runtime/driver calls on the host (a synchronizing call there
is a host wait). ``--model``: examples/torch_enable.py's models, else bench/models.py's (``efficientnet_b0``,
``convnext_t``: classifiers). With ``--native`` ours runs on the C++ hot path (``enable(native=True)``) and the
count of our dW's CUDA graphs it launched itself (no Python) a step is reported, and its plain launches of the
schedule (``$CONVBW_TORCH_NATIVE_LAUNCH=1``). One model trains alone here, so its memory repeats step
to step as in a user's loop (bench/train_step.py's four copies in turns move it: docs/torch.md#the-native-hot-path).
Writes OUT/host_cost.json and prints a table.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib.util
import io
import json
import os
import pstats
import statistics
import time
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
EXAMPLE = next(p for p in (HERE / "torch_enable.py", HERE.parent / "examples" / "torch_enable.py") if p.is_file())


def _example():  # noqa: ANN202
    spec = importlib.util.spec_from_file_location("torch_enable", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    return example


class Clock:
    """Host time and calls of wrapped functions (outermost call only, so recursion does not count twice)."""

    def __init__(self) -> None:
        self.total: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.on = False

    def wrap(self, owner, name: str, label: str) -> None:  # noqa: ANN001
        inner = getattr(owner, name)
        clock = self

        def timed(*a, **kw):  # noqa: ANN002, ANN003, ANN202
            if not clock.on:
                return inner(*a, **kw)
            t = time.perf_counter()
            try:
                return inner(*a, **kw)
            finally:
                clock.total[label] += time.perf_counter() - t
                clock.calls[label] += 1

        setattr(owner, name, timed)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="resnet50")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--native", action="store_true", help="ours by the C++ hot path (enable(native=True))")
    ns = p.parse_args()
    import torch
    from torch import nn

    from convbw_mlir import cuda_launch
    from convbw_mlir import torch as ct
    from convbw_mlir.torch import entry, native, switch

    ex = _example()
    device, dtype = torch.device("cuda"), torch.bfloat16
    torch.backends.cudnn.benchmark = False
    clock = Clock()
    clock.wrap(entry, "problem_memo", "entry.problem_memo")
    clock.wrap(entry.DirectCall, "__call__", "entry.DirectCall.__call__")
    clock.wrap(entry.DirectCall, "launch", "entry.DirectCall.launch (inside __call__, or from C++)")
    clock.wrap(entry.DirectCall, "_record", "entry.DirectCall._record (graph capture)")
    clock.wrap(cuda_launch.CudaLauncher, "__call__", "cuda_launch.CudaLauncher.__call__")
    clock.wrap(cuda_launch.CudaLauncher, "_maps_for", "cuda_launch._maps_for (tensor maps)")
    clock.wrap(cuda_launch._Encoder, "__call__", "cuda_launch._Encoder.__call__ (a tensor map encoded)")
    clock.wrap(switch, "_our_weight_grad", "switch._our_weight_grad")
    clock.wrap(switch, "_decide", "switch._decide (memo miss)")
    clock.wrap(entry, "conv_weight", "entry.conv_weight")
    original_override = switch._override

    def timed_override(original):  # noqa: ANN001, ANN202
        fn = original_override(original)

        def outer(keyset, *args):  # noqa: ANN001, ANN002, ANN202
            if not clock.on or not args[-1][1]:
                return fn(keyset, *args)
            t = time.perf_counter()
            try:
                return fn(keyset, *args)
            finally:
                clock.total["switch override (whole call, dx included)"] += time.perf_counter() - t
                clock.calls["switch override (whole call, dx included)"] += 1

        return outer

    switch._override = timed_override

    torch.manual_seed(0)
    if ns.model in ex.MODELS:
        model = ex.build(ns.model, 1000)
    else:  # bench/models.py's (EfficientNet-B0, ConvNeXt-T written out: no torchvision needed)
        import sys

        sys.path.insert(0, str(HERE))
        from models import MODELS

        model = MODELS[ns.model][0]()
    model = model.to(device).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(ns.batch, 3, ns.size, ns.size, generator=g).to(device, memory_format=torch.channels_last),
                torch.randint(0, 1000, (ns.batch,), generator=g).to(device)) for _ in range(4)]  # fmt: skip
    loss_fn = nn.CrossEntropyLoss()

    def step(i: int) -> tuple[float, float]:
        x, y = batches[i % 4]
        torch.cuda.synchronize()
        t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=dtype):
            loss = loss_fn(model(x).float(), y)
        loss.backward()
        opt.step()
        queued = time.perf_counter() - t
        torch.cuda.synchronize()
        return time.perf_counter() - t, queued

    def run(mode: str) -> dict:
        if mode == "ours":
            ct.enable(benchmark=False, native=ns.native)  # every dW ours: the host cost of our path
        ct.reset_stats()
        try:
            rows = [step(i) for i in range(ns.steps)]
            out = {"mode": mode, "median_step_ms": 1e3 * statistics.median(r[0] for r in rows[5:]),
                   "median_host_ms": 1e3 * statistics.median(r[1] for r in rows[5:]), "stats": ct.stats()}  # fmt: skip
            if mode == "ours":
                loaded = ct.loaded_kernels()
                clock.on = True
                ct.reset_stats()
                n = 5
                for i in range(n):
                    step(i)
                clock.on = False
                out["per_step_host_ms"] = {
                    k: 1e3 * v / n for k, v in sorted(clock.total.items(), key=lambda kv: -kv[1])
                }
                out["per_step_calls"] = {k: v / n for k, v in clock.calls.items()}
                out["calls_ours_per_step"] = ct.stats().get("ours", 0) / n
                out["native"] = native.loaded() is not None and ns.native
                out["cxx_graph_launches_per_step"] = native.graph_launches() / n
                out["cxx_plain_launches_per_step"] = native.plain_launches() / n
                out["native_launch_env"] = os.environ.get(entry.NATIVE_LAUNCH_ENV, "")
                out["loaded_before"] = loaded
                out["loaded_after"] = ct.loaded_kernels()
                prof = cProfile.Profile()
                prof.enable()
                for i in range(3):
                    step(i)
                prof.disable()
                s = io.StringIO()
                pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(35)
                out["cprofile_tottime"] = s.getvalue()
                s = io.StringIO()
                pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(45)
                out["cprofile_cumulative"] = s.getvalue()
                from torch.profiler import ProfilerActivity, profile

                with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as pr:
                    step(0)
                out["torch_profiler"] = pr.key_averages().table(sort_by="self_cpu_time_total", row_limit=40)
            return out
        finally:
            ct.disable()

    results = [run("torch"), run("ours"), run("torch")]
    ours = results[1]
    torch_host = (results[0]["median_host_ms"] + results[2]["median_host_ms"]) / 2
    per_call = 1e3 * (ours["median_host_ms"] - torch_host) / max(ours["calls_ours_per_step"], 1)
    summary = {"model": ns.model, "batch": ns.batch, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
               "native": ours["native"], "native_launch_env": ours["native_launch_env"],
               "host_us_per_call_over_torch": per_call}  # fmt: skip
    ns.out.mkdir(parents=True, exist_ok=True)
    (ns.out / "host_cost.json").write_text(json.dumps([summary, *results], indent=1, default=str))
    for r in results:
        print(f"{r['mode']:6s} step {r['median_step_ms']:.2f} ms  host {r['median_host_ms']:.2f} ms  {r['stats']}")
    print(f"our calls a step: {ours['calls_ours_per_step']}, C++ hot path: {ours['native']}, its graph launches a "
          f"step: {ours['cxx_graph_launches_per_step']}, plain launches: "
          f"{ours['cxx_plain_launches_per_step']}")  # fmt: skip
    print(f"host us a call over torch's: {per_call:.1f}")
    for k, v in ours["per_step_host_ms"].items():
        print(f"  {v:8.3f} ms/step  {ours['per_step_calls'][k]:6.1f} calls/step  {k}")
    print(ours["cprofile_tottime"][:6000])
    print(ours["torch_profiler"][:5000])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
