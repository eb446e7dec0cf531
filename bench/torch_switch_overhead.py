"""What the switch costs a call: convbw_mlir.torch.enable() (a torch.library override of convolution_backward)
against a direct conv_weight call, a TorchDispatchMode doing the same routing, and the custom op.

python bench/torch_switch_overhead.py [--device cpu|cuda] [--calls 2000] [--out result.json]

Each line is the median over 7 repeats of the mean µs per call over --calls calls on one tiny problem (so the
kernel's own time is small and the same in every row). Results: docs/torch.md#the-switch.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from convbw_mlir import torch as ct
from convbw_mlir.torch import entry as ct_entry

aten = torch.ops.aten


class RoutingMode(TorchDispatchMode):
    """The alternative to the override: the same routing from a dispatch mode (sees every op while active)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        if func is aten.convolution_backward.default and args[-1][1]:
            go, x, w, _, stride, padding, dilation, _, _, groups, mask = args
            dx = db = None
            if mask[0] or mask[2]:
                dx, _, db = func(*args[:-1], [mask[0], False, mask[2]])
            return dx, ct.conv_weight(x, w.shape, go, stride, padding, dilation, groups), db
        return func(*args, **(kwargs or {}))


def per_call_us(fn, calls: int, sync) -> float:  # noqa: ANN001
    """Median over 7 repeats of the mean µs per call of ``fn``."""
    fn()
    sync()
    runs = []
    for _ in range(7):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        runs.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(runs)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--out")
    p.add_argument("--stub", action="store_true", help="conv_weight replaced by a stub: the plumbing's cost alone")
    args = p.parse_args(argv)
    dev = torch.device(args.device)
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    torch.manual_seed(0)
    fmt = torch.channels_last
    x = torch.randn(1, 8, 4, 4, device=dev).contiguous(memory_format=fmt)
    w = torch.randn(8, 8, 3, 3, device=dev)
    dy = torch.randn(1, 8, 4, 4, device=dev).contiguous(memory_format=fmt)
    conf = ([1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    t = torch.randn(64, device=dev)
    if args.stub:  # every row calls the same stub where it would run the kernel: the differences are plumbing
        real, out = ct.conv_weight, ct.conv_weight(x, w.shape, dy, 1, 1, 1, 1)
        stub = lambda *a, **k: out  # noqa: E731
        stub.__wrapped__ = real
        # the switch and the custom op call the entry module's function: stub it there, not only here
        ct.conv_weight = ct_entry.conv_weight = stub
    rows = {}
    n = args.calls
    rows["conv_weight (direct)"] = per_call_us(lambda: ct.conv_weight(x, w.shape, dy, 1, 1, 1, 1), n, sync)
    rows["torch.ops.convbw.conv_weight (custom op)"] = per_call_us(
        lambda: torch.ops.convbw.conv_weight(x, dy, [8, 8, 3, 3], [1, 1], [1, 1], [1, 1], 1), n, sync
    )
    dw_only = [False, True, False]
    rows["convolution_backward dW, torch's own"] = per_call_us(
        lambda: aten.convolution_backward.default(dy, x, w, None, *conf, dw_only), n, sync
    )
    rows["relu, nothing on"] = per_call_us(lambda: torch.relu(t), n, sync)
    out = ct.conv_weight(x, w.shape, dy, 1, 1, 1, 1)
    lib = torch.library.Library("aten", "IMPL")  # the mechanism's floor: a Python kernel that computes nothing
    lib.impl("convolution_backward", lambda keyset, *a: (None, out, None), dev.type.upper(), with_keyset=True)
    rows["convolution_backward dW, empty Python override"] = per_call_us(
        lambda: aten.convolution_backward.default(dy, x, w, None, *conf, dw_only), n, sync
    )
    lib._destroy()
    ct.enable(benchmark=False)  # the stub is never weighed
    rows["convolution_backward dW, enable() (override)"] = per_call_us(
        lambda: aten.convolution_backward.default(dy, x, w, None, *conf, dw_only), n, sync
    )
    rows["relu, enable() on"] = per_call_us(lambda: torch.relu(t), n, sync)
    ct.disable()
    with RoutingMode():
        rows["convolution_backward dW, TorchDispatchMode"] = per_call_us(
            lambda: aten.convolution_backward.default(dy, x, w, None, *conf, dw_only), n, sync
        )
        rows["relu, TorchDispatchMode on"] = per_call_us(lambda: torch.relu(t), n, sync)
    direct = rows["conv_weight (direct)"]
    what = "kernel stubbed out" if args.stub else "kernel run"
    print(f"torch {torch.__version__} on {dev}, {what}, {n} calls, µs per call (median of 7):")
    for name, us in rows.items():
        extra = f"  (+{us - direct:.1f} over direct)" if name.startswith("convolution_backward dW, ") else ""
        print(f"  {name:48s} {us:8.1f}{extra}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                {"torch": torch.__version__, "device": str(dev), "stub": args.stub, "calls": n, "us": rows}, f, indent=1
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
