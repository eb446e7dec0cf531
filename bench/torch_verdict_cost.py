"""What "never slower per layer" costs a layer on first use, on the CPU build with the host kernels (issue 37 item 4;
docs/torch.md#never-slower-per-layer-issue-37-item-4): the first decision with benchmark=False (what every layer
pays once anyway), with benchmark=True and no verdict stored (timed: 2 + BENCHMARK_CALLS calls each side, and the
verdict written), with a verdict stored (a fresh switch state: read, no timing), and the verdict store's own pieces
(the key, a read, a write) apart.

python bench/torch_verdict_cost.py [--repeats 5]

Each line: the median of the repeats in ms. The kernel is compiled (or loaded from $CONVBW_ARTIFACTS) before any
row; every row starts from a fresh cache folder of its own where it must.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

from convbw_mlir import torch as ct
from convbw_mlir.dispatch.verdicts import Verdict, VerdictStore
from convbw_mlir.torch import entry as te
from convbw_mlir.torch import switch as sw


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(4, 8, 3, padding=1, bias=False)
    x = torch.randn(2, 4, 6, 6)
    y = conv(x).square().sum()

    def first_backward(benchmark: bool | None, fresh_cache: bool) -> float:
        if fresh_cache:
            os.environ["CONVBW_CACHE_DIR"] = tempfile.mkdtemp(prefix="convbw-verdicts-")
        ct.enable(benchmark=benchmark)  # a fresh switch state: the layer is decided on this call
        start = time.perf_counter()
        torch.autograd.grad(y, conv.weight, retain_graph=True)
        took = time.perf_counter() - start
        ct.disable()
        return took * 1e3

    def steady() -> float:
        ct.enable(benchmark=False)
        torch.autograd.grad(y, conv.weight, retain_graph=True)
        start = time.perf_counter()
        for _ in range(20):
            torch.autograd.grad(y, conv.weight, retain_graph=True)
        ct.disable()
        return (time.perf_counter() - start) / 20 * 1e3

    first_backward(False, True)  # the kernel compiled or loaded, the problem memo made
    rows = {}
    rows["a backward, decided before (benchmark=False)"] = [steady() for _ in range(args.repeats)]
    rows["first backward, benchmark=False"] = [first_backward(False, False) for _ in range(args.repeats)]
    rows["first backward, benchmark=True, nothing stored"] = [first_backward(True, True) for _ in range(args.repeats)]
    rows["first backward, benchmark=True, verdict stored"] = [first_backward(True, False) for _ in range(args.repeats)]

    store = VerdictStore()
    go, w = torch.randn(2, 8, 6, 6), conv.weight.detach()
    conf = ([1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    decision = sw._decide(go, x, w, conf, sw._Config(0, frozenset(te.DTYPES), None, True))

    def ms(fn, n: int = 200) -> list[float]:  # noqa: ANN001
        out = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            for _ in range(n):
                fn()
            out.append((time.perf_counter() - start) / n * 1e3)
        return out

    key = sw._verdict_key(decision, go, x, w, conf)
    rows["the verdict's key"] = ms(lambda: sw._verdict_key(decision, go, x, w, conf))
    rows["store: write a verdict (atomic, fsync)"] = ms(lambda: store.put(key, Verdict(False, 2.0, 1.0)), 50)
    rows["store: read a verdict"] = ms(lambda: store.get(key))
    print(f"torch {torch.__version__}, {sw._device_name(x.device)}, {args.repeats} repeats, ms (median, min-max)")
    for name, values in rows.items():
        print(f"  {name:52s} {statistics.median(values):8.3f}  ({min(values):.3f}-{max(values):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
