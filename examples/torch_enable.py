"""One line for a training script: ``convbw_mlir.torch.enable()``; torch's own run against it, eager or compiled.

Trains the same model twice from the same seeds on the same synthetic batches: once with torch's own weight
gradients, once with ``enable()`` (on a GPU every convolution's dW ours where our kernel is faster than torch's,
weighed on first use and remembered; ``--benchmark off``: ours wherever we have a kernel). Reports the loss per
step of both, the step time (median over the steps after the first few), how many weight gradients went to us
(``convbw_mlir.torch.stats()``) and, with ``--profile``, the share of ``convolution_backward``'s time spent in
our dW (``torch.profiler``). ``--plot`` draws the two loss curves (matplotlib).

On the GPU (what docs/torch.md asks to be measured; kernels compiled on a machine with the IREE compiler and
carried in $CONVBW_ARTIFACTS: the same command with ``--precompile sm_80`` compiles exactly those, with
``--precompile sm_90a`` those an H100/H200 asks for: the sm_90a kernel where it takes a problem, sm_80 elsewhere):
  python examples/torch_enable.py --model resnet50 --dtype bf16 --compile --steps 100 --batch 32 --size 224 \\
      --device cuda --profile --out resnet50.json --plot resnet50.png
  python examples/torch_enable.py --model mobilenet_v2 ...   (mobilenet_v3_large: torchvision's)
On the CPU, seconds (a two-convolution-layer net on 8x8 images; also a test):
  python examples/torch_enable.py --model tiny --steps 2 --device cpu
One ResNet-50 stage (issue 24: layer3, batch 128 at its 28x28 input, on an H100/H200):
  python examples/torch_enable.py --model resnet50_layer3 --dtype bf16 --batch 128 --size 28 --device cuda ...
``resnet50``, ``resnet50_layer1``..``4``, ``mobilenet_v2`` and ``tiny`` are written out here; other names are
torchvision's models.
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
    sys.exit("examples/torch_enable.py needs PyTorch: pip install .[torch]")

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def conv_bn(cin: int, cout: int, k: int, stride: int = 1, groups: int = 1, act: type | None = nn.ReLU) -> list:
    layers = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    return layers + ([act(inplace=True)] if act else [])


class Bottleneck(nn.Module):
    """ResNet-50's block (torchvision's v1.5: the stride on the 3x3)."""

    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        cout = 4 * width
        self.body = nn.Sequential(
            *conv_bn(cin, width, 1), *conv_bn(width, width, 3, stride), *conv_bn(width, cout, 1, act=None)
        )
        self.down = nn.Sequential(*conv_bn(cin, cout, 1, stride, act=None)) if stride != 1 or cin != cout else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + (x if self.down is None else self.down(x)))


class InvertedResidual(nn.Module):
    """MobileNetV2's block: 1x1 expand, depthwise 3x3, 1x1 project."""

    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = cin * expand
        expand_layers = conv_bn(cin, hidden, 1, act=nn.ReLU6) if expand != 1 else []
        self.body = nn.Sequential(
            *expand_layers, *conv_bn(hidden, hidden, 3, stride, groups=hidden, act=nn.ReLU6),
            *conv_bn(hidden, cout, 1, act=None),
        )  # fmt: skip
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x) if self.residual else self.body(x)


# ResNet-50's stages: (bottleneck width, blocks, first stride, input channels); input sizes at 224x224 images:
# 56, 56, 28, 14
STAGES = {"layer1": (64, 3, 1, 64), "layer2": (128, 4, 2, 256), "layer3": (256, 6, 2, 512), "layer4": (512, 3, 2, 1024)}


def stage_blocks(name: str) -> list[nn.Module]:
    width, count, stride, cin = STAGES[name]
    return [Bottleneck(cin if i == 0 else 4 * width, width, stride if i == 0 else 1) for i in range(count)]


def resnet50(classes: int) -> nn.Module:
    blocks = [b for name in STAGES for b in stage_blocks(name)]
    return nn.Sequential(
        *conv_bn(3, 64, 7, 2), nn.MaxPool2d(3, 2, 1), *blocks,
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2048, classes),
    )  # fmt: skip


def resnet50_stage(name: str, classes: int) -> nn.Module:
    """One of ResNet-50's stages alone (its bottleneck blocks), fed ``(N, input channels, size, size)`` batches,
    with a pooled linear head for the loss."""
    cout = 4 * STAGES[name][0]
    return nn.Sequential(*stage_blocks(name), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cout, classes))


def mobilenet_v2(classes: int) -> nn.Module:
    blocks, cin = [], 32
    stages = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))
    for t, c, n, s in stages:  # expansion, channels, blocks, first stride
        for i in range(n):
            blocks.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
            cin = c
    return nn.Sequential(
        *conv_bn(3, 32, 3, 2, act=nn.ReLU6), *blocks, *conv_bn(cin, 1280, 1, act=nn.ReLU6),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(1280, classes),
    )  # fmt: skip


def tiny(classes: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, classes),
    )  # fmt: skip


# written out here (the same layers as torchvision's) so that --precompile runs where torchvision is not installed
MODELS = {"tiny": tiny, "resnet50": resnet50, "mobilenet_v2": mobilenet_v2}
MODELS |= {f"resnet50_{name}": (lambda classes, name=name: resnet50_stage(name, classes)) for name in STAGES}


def input_channels(name: str) -> int:
    """The channels of the model's input batches: images, or a ResNet-50 stage's input."""
    stage = name.removeprefix("resnet50_")
    return STAGES[stage][3] if name.startswith("resnet50_") and stage in STAGES else 3


def build(name: str, classes: int) -> nn.Module:
    if name in MODELS:
        return MODELS[name](classes)
    try:
        import torchvision
    except ModuleNotFoundError:
        sys.exit(f"--model {name} needs torchvision (pip install torchvision); {', '.join(MODELS)} do not")
    if not callable(getattr(torchvision.models, name, None)):
        sys.exit(f"--model: expected {', '.join(MODELS)} or a torchvision model name, got {name!r}")
    return getattr(torchvision.models, name)(num_classes=classes)


def train(args: argparse.Namespace, ours: bool) -> dict:
    """One run from seed 0; returns losses, step times (s) and the switch's counters."""
    from convbw_mlir import torch as ct

    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    torch.manual_seed(0)
    model = build(args.model, args.classes).to(device).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    batches = [
        (
            torch.randn(args.batch, input_channels(args.model), args.size, args.size, generator=g).to(
                device, memory_format=torch.channels_last
            ),
            torch.randint(0, args.classes, (args.batch,), generator=g).to(device),
        )
        for _ in range(4)
    ]
    loss_fn = nn.CrossEntropyLoss()

    def forward(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        # autocast for bf16/f16: parameters stay f32, the convolutions run (and their dW arrive) in `dtype`
        with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
            return loss_fn(model(x).float(), y)

    step_fn = torch.compile(forward) if args.compile else forward
    ct.reset_stats()
    if ours:
        ct.enable(min_flops=args.min_flops, benchmark={"auto": None, "on": True, "off": False}[args.benchmark])
    losses, times, queued = [], [], []
    try:
        for i in range(args.steps):
            x, y = batches[i % len(batches)]
            sync(device)
            start = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss = step_fn(x, y)
            loss.backward()
            opt.step()
            queued.append(time.perf_counter() - start)  # the host's part: near the step time means a host wait
            sync(device)
            times.append(time.perf_counter() - start)
            losses.append(loss.item())
        ours_names = {k for row in ct.loaded_kernels() for k in row.get("kernels", ())}
        share = profile_share(step_fn, opt, batches[0], device, ours_names) if args.profile else None
        stats = ct.stats()
    finally:
        ct.disable()
    first = min(args.warmup, len(times) - 1)
    return {"loss": losses, "step_s": times, "median_step_s": statistics.median(times[first:]), "queue_s": queued,
            "median_queue_s": statistics.median(queued[first:]), "stats": stats, "wgrad_share_ours": share}  # fmt: skip


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def profile_share(step_fn, opt, batch, device, ours: set[str] = frozenset()) -> dict:  # noqa: ANN001
    """Over 3 profiled steps: the time inside ``convbw::conv_weight`` (the range our override opens around our
    dW) against all of ``aten::convolution_backward`` (dx, dW and the bias gradient, ours and torch's), on the
    device where there is one (CPU time otherwise), the 20 longest device kernels by name, and device time by
    kind of kernel: ours (names in ``ours``), cuDNN's weight and data gradients (``wgrad``/``dgrad`` in the name)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            step_fn(*batch).backward()
        sync(device)
    events = {e.key: e for e in prof.key_averages()}

    def spent(key: str) -> float:
        e = events.get(key)
        return 0.0 if e is None else (e.device_time_total if cuda else e.cpu_time_total)

    ours_us, backward = spent("convbw::conv_weight"), spent("aten::convolution_backward")
    # kernels: device time and no host time (our range shows on the device too, as a user annotation: left out)
    on_device = [e for e in events.values() if cuda and e.device_time_total > 0 and e.cpu_time_total == 0
                 and e.key != "convbw::conv_weight"]  # fmt: skip
    kernels = sorted(((e.key, e.device_time_total) for e in on_device), key=lambda kv: -kv[1])
    kinds: dict[str, float] = {}
    for name, us in kernels:
        kind = "ours" if name in ours else next((k for k in ("wgrad", "dgrad") if k in name.lower()), "other")
        kinds[kind] = kinds.get(kind, 0.0) + us
    return {"clock": "device" if cuda else "cpu", "ours_us": ours_us, "convolution_backward_us": backward,
            "share": ours_us / backward if backward else None, "kernels": kernels[:20], "by_kind_us": kinds,
            "kernels_us": sum(us for _, us in kernels), "steps": 3}  # fmt: skip


def precompile(args: argparse.Namespace) -> int:
    """Compile the kernels a run of these arguments needs for ``--precompile TARGET`` into ``$CONVBW_ARTIFACTS``
    (the GPU machine has no IREE compiler): the model runs one step on meta tensors (no data, no time) with
    its convolutions in ``--dtype``, every ``convolution_backward`` that asks for dW is recorded, and each
    distinct problem is compiled as the entry point would compile it there."""
    import os

    from torch.utils._python_dispatch import TorchDispatchMode

    from convbw_mlir import compile_op
    from convbw_mlir import torch as ct

    if not os.environ.get(ct.ARTIFACTS_ENV):
        sys.exit(f"--precompile: set ${ct.ARTIFACTS_ENV} to the folder the GPU run will read")
    seen = {}

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, a=(), kw=None):  # noqa: ANN001, ANN204
            if func is torch.ops.aten.convolution_backward.default and a[-1][1] and not a[7]:
                go, x, w, _, stride, padding, dilation, _, _, groups, _ = a
                cl = torch.channels_last  # the run's x is; the switch copies a dy of another format into x's
                x, go = x.contiguous(memory_format=cl), go.contiguous(memory_format=cl)
                problem, _ = ct.problem_for(x, w.shape, go, stride, padding, dilation, groups)
                seen[problem.name] = problem
            return func(*a, **(kw or {}))

    dtype = DTYPES[args.dtype]  # autocast's casts, done here by hand: autocast does not act on meta tensors
    model = build(args.model, args.classes).to("meta", dtype).to(memory_format=torch.channels_last)
    x = torch.empty(args.batch, input_channels(args.model), args.size, args.size, device="meta", dtype=dtype)
    with Record():
        model(x.contiguous(memory_format=torch.channels_last)).float().sum().backward()
    for i, problem in enumerate(sorted(seen.values(), key=lambda p: p.name)):
        target = precompile_target(args.precompile, problem)
        folder = ct.artifact_dir(problem, target)
        print(f"[{i + 1}/{len(seen)}] {problem.name} for {target}", flush=True)
        if not (folder / "op.json").is_file():
            compile_op(problem, target, isolate=True, output_arg=True).save(folder)
    return 0


def precompile_target(target: str, problem) -> str:  # noqa: ANN001
    """The target a GPU of ``--precompile TARGET`` asks ``problem`` for: ``sm_90a`` means a compute-capability 9.0
    GPU (H100, H200), which runs the sm_90a kernel where it takes the problem and sm_80 code elsewhere
    (``convbw_mlir.torch.cuda_target``); any other target is taken as it is."""
    from convbw_mlir import torch as ct

    return ct.cuda_target((9, 0), problem) if target == "sm_90a" else target


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--model",
        default="tiny",
        help="tiny, resnet50, resnet50_layer1..4 (one stage, --size its input "
        "size: 56, 56, 28, 14 at 224x224), mobilenet_v2, or a torchvision model name",
    )
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--size", type=int, default=8)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="f32")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--compile", action="store_true", help="torch.compile the forward (inductor)")
    p.add_argument("--min-flops", type=int, default=0)
    p.add_argument(
        "--benchmark",
        choices=["auto", "on", "off"],
        default="auto",
        help="enable(benchmark=): auto (the default: on a GPU, dW ours only where our kernel is faster than "
        "torch's, weighed once and remembered), on, or off (every dW ours where we have a kernel)",
    )
    p.add_argument("--warmup", type=int, default=3, help="steps left out of the median step time")
    p.add_argument("--profile", action="store_true", help="the share of weight-gradient kernel time that was ours")
    p.add_argument("--out", help="write both runs as JSON here")
    p.add_argument("--plot", help="draw the two loss curves into this image (needs matplotlib)")
    p.add_argument(
        "--precompile",
        metavar="TARGET",
        help="only compile the run's kernels for TARGET (e.g. sm_80; "
        "sm_90a: for an H100/H200, sm_90a where that kernel takes a problem, sm_80 elsewhere)",
    )
    args = p.parse_args(argv)
    for name in ("steps", "batch", "size", "classes"):
        if getattr(args, name) < 1:
            sys.exit(f"--{name}: expected >= 1, got {getattr(args, name)}")
    if args.precompile:
        return precompile(args)
    result = {"args": vars(args), "torch": train(args, ours=False), "ours": train(args, ours=True)}
    worst = max(abs(a - b) / max(abs(a), 1e-12) for a, b in zip(result["torch"]["loss"], result["ours"]["loss"]))
    result["max_relative_loss_difference"] = worst
    t, o = result["torch"]["median_step_s"], result["ours"]["median_step_s"]
    print(f"{args.model} {args.dtype} {'compiled' if args.compile else 'eager'} on {args.device}: step "
          f"torch {t * 1e3:.2f} ms / ours {o * 1e3:.2f} ms; max relative loss difference {worst:.2e}; "
          f"weight gradients {result['ours']['stats']}")  # fmt: skip
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot(result["torch"]["loss"], label=f"torch ({t * 1e3:.1f} ms/step)")
        ax.plot(result["ours"]["loss"], "--", label=f"enable() ({o * 1e3:.1f} ms/step)")
        ax.set(xlabel="step", ylabel="loss", title=f"{args.model} {args.dtype}{' compiled' if args.compile else ''}")
        ax.legend()
        fig.savefig(args.plot, dpi=120, bbox_inches="tight")
    return 0


if __name__ == "__main__":
    sys.exit(main())
