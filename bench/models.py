"""Whole models for the training-step benchmark (bench/train_step.py), written out so that they build where
torchvision is not installed (the CPU machine traces them on the meta device to precompile their kernels).

Each entry: a builder, the shape of one input batch (without N), and the loss on the model's output. The layer
shapes follow the published models; heads and norms are simplified only where no convolution changes.
- ``resnet50``: examples/torch_enable.py's (torchvision's v1.5 layers).
- ``convnext_t``: ConvNeXt-T (Liu et al. 2022): 4x4/4 stem, stages (96, 192, 384, 768) x (3, 3, 9, 3) blocks of a
  7x7 depthwise conv, LayerNorm, 4x MLP as 1x1 convs; 2x2/2 downsampling.
- ``efficientnet_b0``: EfficientNet-B0 (Tan & Le 2019): MBConv blocks (expand 1x1, depthwise 3x3/5x5,
  squeeze-excite by 1x1 convs on the pooled map, project 1x1), SiLU.
- ``unet_sd``: a 2-D UNet with Stable Diffusion's widths (320/640/1280 channels at 64/32/16 of a 4-channel
  64x64 latent): two residual blocks (GroupNorm, SiLU, 3x3 convs; a 1x1 skip where widths change) a level,
  3x3/2 down, nearest-neighbour up with skip concatenation; no attention (no convolution there).
- ``r3d_18``: R3D-18 (Tran et al. 2018, torchvision's): 3x7x7 stem, 3x3x3 basic blocks, 16x112x112 clips.
- ``wav2vec2_fe``: wav2vec 2.0's feature encoder: seven 512-channel 1-D convs (10/5, then 3/2 x4, 2/2 x2), GELU,
  GroupNorm on the first; 4 s of 16 kHz audio.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

HERE = Path(__file__).resolve().parent
EXAMPLE = next(p for p in (HERE / "torch_enable.py", HERE.parent / "examples" / "torch_enable.py") if p.is_file())


def _example():  # noqa: ANN202
    spec = importlib.util.spec_from_file_location("torch_enable", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    sys.modules["torch_enable"] = example  # torch.compile's tracer imports the module of the code it traces
    spec.loader.exec_module(example)
    return example


class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of an (N, C, H, W) map (ConvNeXt's)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dw = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = LayerNorm2d(dim)
        self.mlp = nn.Sequential(nn.Conv2d(dim, 4 * dim, 1), nn.GELU(), nn.Conv2d(4 * dim, dim, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(self.dw(x)))


def convnext_t(classes: int = 1000) -> nn.Module:
    dims, depths = (96, 192, 384, 768), (3, 3, 9, 3)
    layers: list[nn.Module] = [nn.Conv2d(3, dims[0], 4, 4), LayerNorm2d(dims[0])]
    for i, (dim, depth) in enumerate(zip(dims, depths)):
        if i:
            layers += [LayerNorm2d(dims[i - 1]), nn.Conv2d(dims[i - 1], dim, 2, 2)]
        layers += [ConvNeXtBlock(dim) for _ in range(depth)]
    return nn.Sequential(
        *layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.LayerNorm(dims[-1]), nn.Linear(dims[-1], classes)
    )


class MBConv(nn.Module):
    def __init__(self, cin: int, cout: int, k: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden, squeeze = cin * expand, max(1, cin // 4)
        pre = [nn.Conv2d(cin, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.SiLU()] if expand != 1 else []
        self.pre = nn.Sequential(*pre, nn.Conv2d(hidden, hidden, k, stride, k // 2, groups=hidden, bias=False),
                                 nn.BatchNorm2d(hidden), nn.SiLU())  # fmt: skip
        self.se = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(hidden, squeeze, 1), nn.SiLU(),
                                nn.Conv2d(squeeze, hidden, 1), nn.Sigmoid())  # fmt: skip
        self.post = nn.Sequential(nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.pre(x)
        h = self.post(h * self.se(h))
        return x + h if self.residual else h


def efficientnet_b0(classes: int = 1000) -> nn.Module:
    # (expand, channels, blocks, first stride, kernel): the paper's Table 1
    stages = ((1, 16, 1, 1, 3), (6, 24, 2, 2, 3), (6, 40, 2, 2, 5), (6, 80, 3, 2, 3), (6, 112, 3, 1, 5),
              (6, 192, 4, 2, 5), (6, 320, 1, 1, 3))  # fmt: skip
    layers: list[nn.Module] = [nn.Conv2d(3, 32, 3, 2, 1, bias=False), nn.BatchNorm2d(32), nn.SiLU()]
    cin = 32
    for t, c, n, s, k in stages:
        for i in range(n):
            layers.append(MBConv(cin, c, k, s if i == 0 else 1, t))
            cin = c
    return nn.Sequential(*layers, nn.Conv2d(cin, 1280, 1, bias=False), nn.BatchNorm2d(1280), nn.SiLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(1280, classes))  # fmt: skip


class ResBlock(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.GroupNorm(32, cin), nn.SiLU(), nn.Conv2d(cin, cout, 3, padding=1),
                                  nn.GroupNorm(32, cout), nn.SiLU(), nn.Conv2d(cout, cout, 3, padding=1))  # fmt: skip
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.skip(x) + self.body(x)


class UNetSD(nn.Module):
    def __init__(self, widths: tuple[int, ...] = (320, 640, 1280, 1280)) -> None:
        super().__init__()
        self.conv_in = nn.Conv2d(4, widths[0], 3, padding=1)
        self.down, self.downsample, chans = nn.ModuleList(), nn.ModuleList(), [widths[0]]
        cin = widths[0]
        for i, w in enumerate(widths):
            self.down.append(nn.ModuleList([ResBlock(cin, w), ResBlock(w, w)]))
            cin = w
            chans += [w, w]
            if i < len(widths) - 1:
                self.downsample.append(nn.Conv2d(w, w, 3, 2, 1))
                chans.append(w)
        self.mid = nn.Sequential(ResBlock(cin, cin), ResBlock(cin, cin))
        self.up, self.upsample = nn.ModuleList(), nn.ModuleList()
        for i, w in reversed(list(enumerate(widths))):
            blocks = nn.ModuleList()
            for _ in range(3):
                blocks.append(ResBlock(cin + chans.pop(), w))
                cin = w
            self.up.append(blocks)
            if i:
                self.upsample.append(nn.Conv2d(w, w, 3, padding=1))
        self.conv_out = nn.Sequential(nn.GroupNorm(32, cin), nn.SiLU(), nn.Conv2d(cin, 4, 3, padding=1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(x)
        skips = [h]
        for i, blocks in enumerate(self.down):
            for b in blocks:
                h = b(h)
                skips.append(h)
            if i < len(self.downsample):
                h = self.downsample[i](h)
                skips.append(h)
        h = self.mid(h)
        for i, blocks in enumerate(self.up):
            for b in blocks:
                h = b(torch.cat([h, skips.pop()], dim=1))
            if i < len(self.upsample):
                h = self.upsample[i](nn.functional.interpolate(h, scale_factor=2.0, mode="nearest"))
        return self.conv_out(h)


class BasicBlock3d(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv3d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm3d(cout), nn.ReLU(True),
                                  nn.Conv3d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm3d(cout))  # fmt: skip
        down = stride != 1 or cin != cout
        self.down = nn.Sequential(nn.Conv3d(cin, cout, 1, stride, bias=False), nn.BatchNorm3d(cout)) if down else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + (x if self.down is None else self.down(x)))


def r3d_18(classes: int = 400) -> nn.Module:
    layers: list[nn.Module] = [nn.Conv3d(3, 64, (3, 7, 7), (1, 2, 2), (1, 3, 3), bias=False), nn.BatchNorm3d(64),
                               nn.ReLU(True)]  # fmt: skip
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [BasicBlock3d(cin, cout, stride), BasicBlock3d(cout, cout, 1)]
        cin = cout
    return nn.Sequential(*layers, nn.AdaptiveAvgPool3d(1), nn.Flatten(), nn.Linear(512, classes))


def wav2vec2_fe() -> nn.Module:
    layers: list[nn.Module] = [nn.Conv1d(1, 512, 10, 5, bias=False), nn.GroupNorm(512, 512), nn.GELU()]
    for k in (3, 3, 3, 3, 2, 2):
        layers += [nn.Conv1d(512, 512, k, 2, bias=False), nn.GELU()]
    return nn.Sequential(*layers)


def _classify(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(out.float(), target)


def _regress(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(out.float(), target.float())


# name -> (builder, input shape without N, memory format, loss, target of one batch: (batch, generator) -> tensor)
MODELS: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...], torch.memory_format, Callable, Callable]] = {
    "resnet50": (lambda: _example().resnet50(1000), (3, 224, 224), torch.channels_last, _classify,
                 lambda n, g: torch.randint(0, 1000, (n,), generator=g)),
    "convnext_t": (convnext_t, (3, 224, 224), torch.channels_last, _classify,
                   lambda n, g: torch.randint(0, 1000, (n,), generator=g)),
    "efficientnet_b0": (efficientnet_b0, (3, 224, 224), torch.channels_last, _classify,
                        lambda n, g: torch.randint(0, 1000, (n,), generator=g)),
    "unet_sd": (UNetSD, (4, 64, 64), torch.channels_last, _regress,
                lambda n, g: torch.randn(n, 4, 64, 64, generator=g)),
    "r3d_18": (r3d_18, (3, 16, 112, 112), torch.channels_last_3d, _classify,
               lambda n, g: torch.randint(0, 400, (n,), generator=g)),
    "wav2vec2_fe": (wav2vec2_fe, (1, 64000), torch.contiguous_format, _regress,
                    lambda n, g: torch.randn(n, 512, 199, generator=g)),
}  # fmt: skip
