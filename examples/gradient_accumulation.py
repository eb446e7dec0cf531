"""Gradient accumulation over micro-batches with the fused ``accumulate`` epilogue (CPU).

Each call adds x * dy into the caller's gradient buffer in the kernel's own write (``dW += x * dy``),
instead of computing a fresh dW and adding it with one more pass over dW. Then a loss-scaled f16
step: ``scale`` folds the 1/S of loss scaling into the same write.
"""

import numpy as np

from convbw_mlir import ConvBwdWeightProblem, Epilogue, compile_op
from convbw_mlir.reference import assert_close, random_inputs, reference

layer = ConvBwdWeightProblem.from_ck("2 2 4 16 16 3 3 14 14 1 1 1 1 1 1 1 1").with_(dw_dtype="f32")

# dW += x * dy into grad (alpha = beta = 1); grad is D and receives the result.
acc_op = compile_op(layer.with_(epilogue=Epilogue("accumulate")), target="host")
grad = np.zeros(layer.dw_shape, np.float32)  # the gradient the training loop owns
want = np.zeros(layer.dw_shape)
for micro_batch in range(4):
    x, dy = random_inputs(layer, seed=micro_batch)
    acc_op.run(x, dy, out=grad)  # the result lands in grad
    want += reference(layer, x, dy)
err = assert_close(layer, grad, want)
print(f"4 micro-batches accumulated in place: max error {err:.2e}, PASS")

# Loss scaling: dy carries a factor S = 1024; unscale in the epilogue, not in a separate kernel.
scaled = layer.with_(epilogue=Epilogue("scale", 1 / 1024))
x, dy = random_inputs(layer, seed=9)
dy = (dy * 1024).astype(dy.dtype)  # the loss-scaled gradient f16 training produces
dw = compile_op(scaled, target="host").run(x, dy)
err = assert_close(scaled, dw, reference(scaled, x, dy))
print(f"unscaled in the epilogue: max error {err:.2e}, PASS")
