"""The CPU part of the switch's hot path a call, piece by piece: the memo key, its lookup, conv_weight's argument
memo, dW's allocation, the mechanism's floor (an empty Python override), enable() with the kernel stubbed, and
the pass-through disable() leaves (issue 37 item 3: where the host time a call goes; docs/torch.md#the-switch);
then the same with the C++ hot path (enable(native=True), docs/torch.md#the-native-hot-path), dW alone and dx + dW
(what a training step asks: torch's kernel computes dx, ours dW).

python bench/torch_switch_hotpath.py [--no-native]

Each line: median over 7 repeats of the mean µs a call. Run it in a fresh process: the first part times torch's
own convolution_backward before anything of ours is registered.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from convbw_mlir.torch import entry as te
from convbw_mlir.torch import switch as sw


def us(fn, n: int = 20000) -> float:  # noqa: ANN001
    fn()
    runs = []
    for _ in range(7):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        runs.append((time.perf_counter() - start) / n * 1e6)
    return statistics.median(runs)


def main() -> int:
    torch.set_num_threads(1)  # torch's own small kernels: not slowed by a busy machine's thread pool
    aten = torch.ops.aten.convolution_backward.default
    cl = torch.channels_last
    x, dy = (torch.randn(1, 8, 4, 4).contiguous(memory_format=cl) for _ in range(2))
    w = torch.randn(8, 8, 3, 3).contiguous(memory_format=cl)
    conf = ([1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    stride, padding, dilation, transposed, output_padding, groups = conf
    dw_only, dx_dw = [False, True, False], [True, True, False]
    rows = {"torch's own convolution_backward dW": us(lambda: aten(dy, x, w, None, *conf, dw_only), 2000)}
    rows["torch's own convolution_backward dx + dW"] = us(lambda: aten(dy, x, w, None, *conf, dx_dw), 1000)

    def key() -> tuple:  # the override's memo key, as switch.py builds it
        return (x.shape, x.stride(), dy.shape, dy.stride(), x.dtype, dy.dtype, w.dtype, x.device, w.shape, w.stride(),
                tuple(stride), tuple(padding), tuple(dilation), transposed, tuple(output_padding), groups,
                sw._deterministic())  # fmt: skip

    memo = {key(): sw.Decision(True)}
    rows["memo key"] = us(key)
    rows["memo key + lookup"] = us(lambda: memo.get(key()))
    rows["torch.compiler.disable's wrapper"] = us(torch.compiler.disable(lambda: None)) - us(lambda: None)
    out = te.conv_weight(x, w.shape, dy, 1, 1, 1, 1)  # compiles or loads the host kernel once
    rows["conv_weight's argument memo (problem_memo)"] = us(
        lambda: te.problem_memo(x, list(w.shape), dy, [1, 1], [1, 1], [1, 1], 1)
    )
    rows["dW's torch.empty_strided"] = us(lambda: torch.empty_strided(out.shape, out.stride(), dtype=x.dtype))
    lib = torch.library.Library("aten", "IMPL")  # the mechanism's floor: a Python kernel that computes nothing
    lib.impl("convolution_backward", lambda keyset, *a: (None, out, None), "CPU", with_keyset=True)
    rows["floor: an empty Python override"] = us(lambda: aten(dy, x, w, None, *conf, dw_only), 5000)
    lib._destroy()
    real = sw._weight_grad
    sw._weight_grad = lambda direct, x, w, go, *a: out  # the kernel stubbed: the plumbing alone
    try:
        sw.enable(benchmark=False)  # the stub is never weighed
        rows["enable(), kernel stubbed"] = us(lambda: aten(dy, x, w, None, *conf, dw_only), 5000)
        rows["enable(), kernel stubbed, dx + dW"] = us(lambda: aten(dy, x, w, None, *conf, dx_dw), 1000)
        sw.disable()
        rows["disable()d: the pass-through"] = us(lambda: aten(dy, x, w, None, *conf, dw_only), 2000)
        if "--no-native" not in sys.argv:  # after the Python rows: the C++ kernel, once registered, stays
            sw.enable(native=True)
            if sw._STATE["active"].native:
                rows["native: enable(), kernel stubbed"] = us(lambda: aten(dy, x, w, None, *conf, dw_only), 5000)
                rows["native: enable(), kernel stubbed, dx + dW"] = us(lambda: aten(dy, x, w, None, *conf, dx_dw), 1000)
                sw.disable()
                rows["native: disable()d, the pass-through"] = us(lambda: aten(dy, x, w, None, *conf, dw_only), 2000)
    finally:
        sw._weight_grad = real
        sw.disable()
    print(f"torch {torch.__version__}, CPU, µs a call (median of 7):")
    for name, value in rows.items():
        print(f"  {name:48s} {value:8.2f}")
    over = rows["enable(), kernel stubbed"] - rows["floor: an empty Python override"]
    print(f"  {'enable() over the floor':48s} {over:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
