"""Compile one grouped conv backward-weight problem for the CPU, run it, check it, time it.

python examples/quickstart.py            (what `make run` does)
"""

import statistics

from convbw_mlir import ConvBwdWeightProblem, compile_op
from convbw_mlir.reference import assert_close, random_inputs, reference, tolerance
from convbw_mlir.runtime import time_calls

# A ResNeXt-style grouped 3x3 layer: G=4 groups of 32 channels, batch 8, 28x28, fp16, NHWGC layout.
problem = ConvBwdWeightProblem(
    groups=4, batch=8, in_channels=32, out_channels=32,
    input_size=(28, 28), filter_size=(3, 3), pad_low=1, pad_high=1, dtype="f16",
)  # fmt: skip
print(f"problem: ckProfiler args '{problem.to_ck()}' ({problem.layout}, {problem.dtype})")
print(
    f"GEMM view per group: M={problem.gemm[1]} N={problem.gemm[2]} K={problem.gemm[3]}, {problem.flops / 1e9:.2f} GFLOP"
)

op = compile_op(problem, target="host")
print(f"pipeline: {op.pipeline}")

x, dy = random_inputs(problem, seed=0)
dw = op.run(x, dy)
err = assert_close(problem, dw, reference(problem, x, dy))

kernel = op.kernel()
xd, dyd = kernel.to_device(x), kernel.to_device(dy)
seconds = statistics.median(time_calls(kernel, xd, dyd))
print(f"dW {dw.shape} {dw.dtype}: {seconds * 1e3:.2f} ms, {problem.flops / seconds / 1e12:.4f} TFLOP/s on the CPU")
print(f"max error vs float64 reference: {err:.3g} (tolerance {tolerance(problem)[0]:.3g}): PASS")
