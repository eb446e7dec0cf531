"""Our weight gradient from PyTorch: the functional form, then a model switched over.

python examples/torch_quickstart.py   (on the GPU torch uses, else the CPU; needs torch: pip install .[torch])
Kernels are compiled on first use of a shape (or taken from $CONVBW_ARTIFACTS/<target>/<problem>).
"""

import sys

try:
    import torch
except ModuleNotFoundError:
    sys.exit("examples/torch_quickstart.py needs PyTorch: pip install .[torch]")

from convbw_mlir.torch import conv2d_weight, convert_model

device = "cuda" if torch.cuda.is_available() else "cpu"
dtype = torch.float16 if device == "cuda" else torch.float32
torch.manual_seed(0)

# A ResNeXt grouped 3x3 layer (G=32, 4 channels a group), channels-last as training on GPUs uses it.
x = torch.randn(8, 128, 28, 28, device=device, dtype=dtype).contiguous(memory_format=torch.channels_last)
w = torch.randn(128, 4, 3, 3, device=device, dtype=dtype)
dy = torch.randn(8, 128, 28, 28, device=device, dtype=dtype).contiguous(memory_format=torch.channels_last)

dw = conv2d_weight(x, w.shape, dy, padding=1, groups=32)  # same call as torch.nn.grad.conv2d_weight
want = torch.nn.grad.conv2d_weight(x.double(), w.shape, dy.double(), padding=1, groups=32)
err = ((dw.double() - want).abs() / (want.abs() + want.pow(2).mean().sqrt())).max().item()
print(f"dW {tuple(dw.shape)} {dw.dtype} on {dw.device}: max error vs float64 {err:.2e}")

# A model: its Conv2d layers now take dW from our kernel in backward (dx stays torch's).
model = torch.nn.Sequential(
    torch.nn.Conv2d(64, 128, 1, bias=False), torch.nn.ReLU(),
    torch.nn.Conv2d(128, 128, 3, padding=1, groups=32, bias=False), torch.nn.ReLU(),
).to(device=device, dtype=dtype, memory_format=torch.channels_last)  # fmt: skip
print("switched:", convert_model(model))
inp = torch.randn(8, 64, 28, 28, device=device, dtype=dtype).contiguous(memory_format=torch.channels_last)
model(inp).float().square().mean().backward()
print("grad norms:", [round(p.grad.float().norm().item(), 3) for p in model.parameters()])
