"""A training loop with our weight gradient vs torch's: same model, seeds and data; loss curves and step time.

Two blocks from real networks, channels-last f16 on the GPU (f32 on the CPU):
- ``resnext``: a ResNeXt-50 (32x4d) conv2 stage: 3 bottlenecks 256 -> 128 (3x3, G=32) -> 256, 56x56;
- ``mobilenet``: 2 MobileNetV2 inverted residuals 24 -> 144 (depthwise 3x3) -> 24, 56x56;
then global pooling and a linear classifier, trained with SGD on a few fixed synthetic batches.

python examples/torch_training.py --model resnext --steps 200 --device cuda --out resnext.json
python examples/torch_training.py --model mobilenet --batch 4 --size 14 --steps 20 --device cpu
With no arguments: the first on a GPU; on the CPU a small run that takes seconds (mobilenet, batch 2,
14x14, 6 steps; the first run also compiles its 3 kernels, cached after).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

try:
    import torch
    from torch import nn
except ModuleNotFoundError:
    sys.exit("examples/torch_training.py needs PyTorch: pip install .[torch]")

# Defaults per device: the GPU's run measures, the CPU's shows the loop works in seconds.
DEFAULTS = {
    "cuda": {"model": "resnext", "steps": 200, "batch": 32, "size": 56},
    "cpu": {"model": "mobilenet", "steps": 6, "batch": 2, "size": 14},
}


class Bottleneck(nn.Module):
    """ResNeXt bottleneck: 1x1 reduce, grouped 3x3, 1x1 expand, identity shortcut."""

    def __init__(self, channels: int = 256, width: int = 128, groups: int = 32) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(channels, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.Conv2d(width, width, 3, padding=1, groups=groups, bias=False), nn.BatchNorm2d(width),
            nn.ReLU(inplace=True), nn.Conv2d(width, channels, 1, bias=False), nn.BatchNorm2d(channels),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.body(x))


class InvertedResidual(nn.Module):
    """MobileNetV2 block: 1x1 expand, depthwise 3x3, 1x1 project, identity shortcut."""

    def __init__(self, channels: int = 24, expand: int = 6) -> None:
        super().__init__()
        hidden = channels * expand
        self.body = nn.Sequential(
            nn.Conv2d(channels, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6(inplace=True),
            nn.Conv2d(hidden, hidden, 3, padding=1, groups=hidden, bias=False), nn.BatchNorm2d(hidden),
            nn.ReLU6(inplace=True), nn.Conv2d(hidden, channels, 1, bias=False), nn.BatchNorm2d(channels),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


MODELS = {
    "resnext": (lambda: [Bottleneck() for _ in range(3)], 256),
    "mobilenet": (lambda: [InvertedResidual() for _ in range(2)], 24),
}


def build(model: str, classes: int = 10) -> tuple[nn.Module, int]:
    """The model and its input channel count."""
    make, channels = MODELS[model]
    return nn.Sequential(*make(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, classes)), channels


def train(model_name: str, ours: bool, steps: int, batch: int, size: int, device: str, dtype: torch.dtype,
          lr: float = 0.02, batches: int = 4, seed: int = 0) -> dict:  # fmt: skip
    """Train from seed ``seed``; returns the loss per step and the time per step (seconds)."""
    torch.manual_seed(seed)
    model, channels = build(model_name)
    model = model.to(device=device, dtype=dtype, memory_format=torch.channels_last)
    converted = []
    if ours:
        from convbw_mlir.torch import convert_model

        converted = convert_model(model)
    gen = torch.Generator().manual_seed(seed + 1)
    data = [
        (
            torch.randn(batch, channels, size, size, generator=gen)
            .to(device=device, dtype=dtype)
            .contiguous(memory_format=torch.channels_last),
            torch.randint(0, 10, (batch,), generator=gen).to(device),
        )
        for _ in range(batches)
    ]
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    losses, times = [], []
    for step in range(steps):
        x, y = data[step % batches]
        sync()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x).float(), y)
        loss.backward()
        opt.step()
        sync()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    return {"losses": losses, "step_s": times, "converted": converted}


def compare(model: str, steps: int, batch: int, size: int, device: str) -> dict:
    """Torch's run, then ours, from the same seeds; the per-step relative loss difference."""
    dtype = torch.float16 if device.startswith("cuda") else torch.float32
    ref = train(model, False, steps, batch, size, device, dtype)
    got = train(model, True, steps, batch, size, device, dtype)
    rel = [abs(a - b) / max(abs(a), 1e-12) for a, b in zip(ref["losses"], got["losses"])]
    warm = max(1, steps // 10)  # the first steps include compiles and cuDNN's autotuning
    return {
        "model": model, "steps": steps, "batch": batch, "size": size, "device": device, "dtype": str(dtype),
        "torch": ref, "ours": got, "max_rel_loss_diff": max(rel), "rel_loss_diff": rel,
        "step_ms_torch": 1e3 * statistics.median(ref["step_s"][warm:]),
        "step_ms_ours": 1e3 * statistics.median(got["step_s"][warm:]),
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=sorted(MODELS), help="default: resnext on a GPU, mobilenet on the CPU")
    ap.add_argument("--steps", type=int, help="default 200 on a GPU, 6 on the CPU")
    ap.add_argument("--batch", type=int, help="default 32 on a GPU, 2 on the CPU")
    ap.add_argument("--size", type=int, help="default 56 on a GPU, 14 on the CPU")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", help="write the result JSON here")
    a = ap.parse_args()
    for name, value in DEFAULTS["cpu" if a.device == "cpu" else "cuda"].items():
        if getattr(a, name) is None:
            setattr(a, name, value)
    r = compare(a.model, a.steps, a.batch, a.size, a.device)
    print(
        f"{a.model}: {a.steps} steps, max relative loss difference {r['max_rel_loss_diff']:.3g}; "
        f"step {r['step_ms_torch']:.2f} ms (torch) vs {r['step_ms_ours']:.2f} ms (ours); "
        f"final loss {r['torch']['losses'][-1]:.4f} vs {r['ours']['losses'][-1]:.4f}"
    )
    if a.out:
        with open(a.out, "w") as f:
            json.dump(r, f)


if __name__ == "__main__":
    main()
