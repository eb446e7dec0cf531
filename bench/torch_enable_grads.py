"""One bf16 (autocast) training step's weight gradients, torch's and enable()'s, each against a float32 step.

    CONVBW_ARTIFACTS=.art/torch python3 bench/torch_enable_grads.py --model resnet50 --out grads.json   (GPU)

Same weights, batch and forward in both bf16 runs; dx stays torch's under enable(), so every convolution sees
the same x and dy in both and only the dW kernel differs. Per convolution weight: ||g - g32|| / ||g32||, g32
from the float32 step (TF32 off). Kernels as examples/torch_enable.py --precompile compiles them.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
from pathlib import Path

import torch

from convbw_mlir import torch as ct

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "torch_enable.py"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="resnet50")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--out")
    args = p.parse_args(argv)
    spec = importlib.util.spec_from_file_location("torch_enable", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)
    cl = torch.channels_last
    model = example.build(args.model, 10).cuda().to(memory_format=cl)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(args.batch, 3, args.size, args.size, generator=g).cuda().contiguous(memory_format=cl)
    y = torch.randint(0, 10, (args.batch,), generator=g).cuda()

    def grads(ours: bool, bf16: bool) -> dict[str, torch.Tensor]:
        model.zero_grad(set_to_none=True)
        if ours:
            ct.enable(benchmark=False)  # every dW ours, weighed or not
        try:
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
                loss = torch.nn.functional.cross_entropy(model(x).float(), y)
            loss.backward()
        finally:
            ct.disable()
        return {n: q.grad.double().clone() for n, q in model.named_parameters() if q.dim() >= 3}

    ref, theirs, ours = grads(False, False), grads(False, True), grads(True, True)

    def rel(t: torch.Tensor, r: torch.Tensor) -> float:
        return ((t - r).norm() / r.norm()).item()

    rows = {n: {"torch_bf16": rel(theirs[n], r), "ours_bf16": rel(ours[n], r), "ours_vs_torch": rel(ours[n], theirs[n])}
            for n, r in ref.items()}  # fmt: skip
    ratio = [v["ours_bf16"] / v["torch_bf16"] for v in rows.values()]
    summary = {
        "convolutions": len(rows),
        "median_rel_err_torch": statistics.median(v["torch_bf16"] for v in rows.values()),
        "median_rel_err_ours": statistics.median(v["ours_bf16"] for v in rows.values()),
        "max_rel_err_torch": max(v["torch_bf16"] for v in rows.values()),
        "max_rel_err_ours": max(v["ours_bf16"] for v in rows.values()),
        "median_ratio_ours_over_torch": statistics.median(ratio),
        "max_ratio_ours_over_torch": max(ratio),
        "stats": ct.stats(),
    }
    print(json.dumps(summary, indent=1))
    for name, v in sorted(rows.items(), key=lambda kv: -kv[1]["ours_bf16"] / kv[1]["torch_bf16"])[:8]:
        print(
            f"{name:40s} torch {v['torch_bf16']:.2e}  ours {v['ours_bf16']:.2e}  ours-vs-torch {v['ours_vs_torch']:.2e}"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "gpu": torch.cuda.get_device_name(), "summary": summary, "layers": rows}, f,
                      indent=1)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
