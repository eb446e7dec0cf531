"""The whole-module route on a GPU (issue 41): a ResNet-18 training step compiled whole with our passes and by IREE
alone, run through IREE's runtime, timed and checked against torch's float64 autograd.

    .venv/bin/python bench/module_gpu.py compile --out DIR [--model resnet18 --batch 8 --size 64 --target sm_80]
        # here (IREE's compiler): four vmfbs and DIR/meta.json (a few MB: parameters are inputs, no weights inside)
        #   step_ours.vmfb / step_iree.vmfb: the training step (forward, loss, backward; bench/step_export.py),
        #       compile_module (convbw-raise and our pipeline on every weight gradient) / IREE alone from input
        #   wgrad_ours.vmfb / wgrad_iree.vmfb: the step's weight gradients alone (one aten.convolution_backward dW
        #       per convolution of the model, at the step's shapes): "the weight-gradient part", timed by itself
    PYTHONPATH=/tmp/site python3 bench/module_gpu.py run DIR --out OUT [--runs 50]
        # there (iree-base-runtime, numpy, torch; not the compiler nor this project): weights from the model's seed,
        # each vmfb warmed up then timed (wall clock around a call that returns, read-back of one small output
        # included), outputs checked against torch's float64 autograd and ours against IREE's; OUT/module_gpu.{json,md}

sm_80 because IREE's runtime runs sm_80 PTX on the H100 and a whole module has no direct launch for our sm_90a
kernels (compile_module refuses them). f16 (numpy has no bf16); ResNet-18's convolutions with a 10-class head
(the head's width changes no convolution; fewer logits keep the loss's f16 gradients out of the subnormals).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

__all__ = ["build", "compile_all", "main", "run_all"]

_DRIVERS = {"host": "local-task"}  # any other target: cuda (an NVIDIA target is all IREE's runtime runs there)


class _Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x)))))
        return torch.relu(y + (x if self.down is None else self.down(x)))


class ResNet(nn.Module):
    """torchvision's ResNet-18 layers (7x7/2 stem, max pool, 2 basic blocks a stage at ``width`` x 1, 2, 4, 8)."""

    def __init__(self, width: int = 64, blocks: tuple[int, ...] = (2, 2, 2, 2), classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))  # fmt: skip
        layers, cin = [], width
        for i, n in enumerate(blocks):
            cout = width * 2**i
            layers += [_Block(cin if j == 0 else cout, cout, 2 if i and j == 0 else 1) for j in range(n)]
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.layers(self.stem(x)).mean((2, 3)))


MODELS = {"resnet18": lambda: ResNet(), "tiny": lambda: ResNet(width=4, blocks=(1, 1))}


def build(name: str, seed: int, dtype: torch.dtype) -> nn.Module:
    """Model ``name`` with the weights of ``seed`` (both machines build the same), eval mode, of ``dtype``."""
    if name not in MODELS:
        raise ValueError(f"--model: expected one of {', '.join(MODELS)}, got {name!r}")
    torch.manual_seed(seed)
    return MODELS[name]().to(dtype).eval()


def _convs(model: nn.Module, x: torch.Tensor) -> list[dict]:
    """Each convolution call of ``model(x)``: its input, output and weight shapes and arguments."""
    found = []

    def hook(m: nn.Conv2d, args: tuple, out: torch.Tensor) -> None:
        found.append({"x": list(args[0].shape), "dy": list(out.shape), "w": list(m.weight.shape),
                      "stride": list(m.stride), "pad": list(m.padding), "dilation": list(m.dilation),
                      "groups": m.groups})  # fmt: skip

    hooks = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, nn.Conv2d)]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in hooks:
            h.remove()
    return found


class _WGrads(nn.Module):
    """Every weight gradient of a model's step alone: ``(dy, x, w)`` per convolution in, each dW out."""

    def __init__(self, convs: list[dict]) -> None:
        super().__init__()
        self.convs = convs

    def forward(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = []
        for i, c in enumerate(self.convs):
            dy, x, w = tensors[3 * i : 3 * i + 3]
            args = (c["stride"], c["pad"], c["dilation"], False, [0, 0], c["groups"], [False, True, False])
            out.append(torch.ops.aten.convolution_backward(dy, x, w, None, *args)[1])
        return tuple(out)


def _wgrad_inputs(convs: list[dict], dtype: torch.dtype, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(c[k], generator=g).to(dtype) for c in convs for k in ("dy", "x", "w")]


def compile_all(out: Path, model_name: str, batch: int, size: int, target: str, seed: int = 0) -> dict:
    """Compile the step and the weight gradients alone, ours and IREE's; write the vmfbs and meta.json."""
    from step_export import export_step

    from convbw_mlir.build.iree import compile_module as iree_compile
    from convbw_mlir.build.isolate import call
    from convbw_mlir.dispatch.module import compile_module, input_phase
    from convbw_mlir.targets import resolve

    dtype = torch.float16
    model = build(model_name, seed, dtype)
    x = torch.randn(batch, 3, size, size).to(dtype)
    convs = _convs(build(model_name, seed, torch.float32), x.float())
    programs = {"step": export_step(model, x),
                "wgrad": torch.export.export(_WGrads(convs), tuple(_wgrad_inputs(convs, dtype, seed)))}  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    meta: dict[str, Any] = {"model": model_name, "batch": batch, "size": size, "target": target, "seed": seed,
                            "dtype": "f16", "driver": _DRIVERS.get(target, "cuda"), "convs": convs,
                            "params": [n for n, _ in model.named_parameters()],
                            "compile_s": {}, "raised": {}}  # fmt: skip
    tgt = resolve(target)
    for kind, program in programs.items():
        start = time.perf_counter()
        ours = compile_module(program, tgt, isolate=True)
        meta["compile_s"][f"{kind}_ours"] = round(time.perf_counter() - start, 1)
        meta["raised"][kind] = [r.problem.name for r in ours.raised]
        meta["not_raised_" + kind] = list(ours.not_raised)
        (out / f"{kind}_ours.vmfb").write_bytes(ours.vmfb)
        start = time.perf_counter()
        linalg = input_phase(program, tgt, isolate=True)
        theirs = call(iree_compile, linalg, tgt, ["--compile-from=input"], what=f"{kind} by IREE alone")
        meta["compile_s"][f"{kind}_iree"] = round(time.perf_counter() - start, 1)
        (out / f"{kind}_iree.vmfb").write_bytes(theirs)
        print(f"{kind}: raised {len(ours.raised)} of {len(convs)} convolutions; compiled in {meta['compile_s']}")
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    return meta


# ----------------------------------------------------------------------------------------------------------
# run (the GPU machine: iree.runtime, numpy, torch)


def _reference_step(meta: dict) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(the step's inputs: parameters then x, as f16 arrays; torch's float64 loss and gradients)."""
    dtype = torch.float16
    model = build(meta["model"], meta["seed"], dtype)
    names = [n for n, _ in model.named_parameters()]
    if [f"model.{n}" for n in names] != meta["params"] and names != meta["params"]:
        raise ValueError(f"meta.json params: the model built here has other parameters ({names[:3]}...)")
    x = torch.randn(meta["batch"], 3, meta["size"], meta["size"]).to(dtype)  # the same draw as compile's
    step_export = __import__("step_export")
    model64 = build(meta["model"], meta["seed"], torch.float64)
    model64.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
    loss = step_export.loss_of(model64(x.double()))
    grads = torch.autograd.grad(loss, list(model64.parameters()))
    inputs = [p.detach().numpy() for p in model.parameters()] + [x.numpy()]
    return inputs, [loss.detach().numpy(), *(g.numpy() for g in grads)]


def _reference_wgrad(meta: dict) -> tuple[list[np.ndarray], list[np.ndarray]]:
    tensors = _wgrad_inputs(meta["convs"], torch.float16, meta["seed"])
    want = _WGrads(meta["convs"])(*(t.double() for t in tensors))
    return [t.numpy() for t in tensors], [w.numpy() for w in want]


def _timed(vmfb: bytes, driver: str, inputs: list[np.ndarray], runs: int, warmup: int = 3) -> tuple[list, list]:
    """(outputs as arrays, wall seconds of each timed call): inputs put on the device once; each call waits for its
    results (IREE's synchronous ABI) and the smallest output is read back."""
    import iree.runtime as rt

    config = rt.Config(driver)
    context = rt.SystemContext(config=config)
    context.add_vm_module(rt.VmModule.copy_buffer(context.instance, vmfb))
    main = context.modules.module["main"]
    args = [rt.asdevicearray(config.device, a) for a in inputs]

    def once() -> list:
        result = main(*args)
        result = list(result) if isinstance(result, (list, tuple)) else [result]
        # the call has finished once its (smallest) result is on the host
        min(result, key=lambda r: int(np.prod(r.shape))).to_host()
        return result

    for _ in range(warmup):
        result = once()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        once()
        times.append(time.perf_counter() - start)
    return [np.asarray(r.to_host()) for r in result], times


def _error(got: np.ndarray, want: np.ndarray) -> float:
    """Largest difference relative to the largest value of ``want``."""
    want = np.asarray(want, np.float64)
    return float(np.abs(np.asarray(got, np.float64) - want).max() / max(np.abs(want).max(), 1e-30))


def run_all(folder: Path, out: Path, runs: int = 50, tolerance: float = 3e-2) -> dict:
    """Run the four vmfbs of ``folder``; write OUT/module_gpu.json and .md; return the json's dict."""
    meta = json.loads((folder / "meta.json").read_text())
    report: dict[str, Any] = {"meta": {k: v for k, v in meta.items() if k != "convs"}, "results": {}}
    try:
        import iree.runtime as rt

        report["device"] = str(rt.get_driver(meta["driver"]).query_available_devices())[:300]
    except Exception as e:  # noqa: BLE001 - only a description for the report
        report["device"] = f"unknown ({e})"
    for kind, reference in (("step", _reference_step), ("wgrad", _reference_wgrad)):
        inputs, want = reference(meta)
        got = {}
        for who in ("ours", "iree"):
            outputs, times = _timed((folder / f"{kind}_{who}.vmfb").read_bytes(), meta["driver"], inputs, runs)
            got[who] = outputs
            errors = [_error(g, w) for g, w in zip(outputs, want)]
            report["results"][f"{kind}_{who}"] = {
                "median_ms": 1e3 * float(np.median(times)), "min_ms": 1e3 * float(np.min(times)), "runs": runs,
                "worst_error": max(errors), "errors": errors,
            }  # fmt: skip
        between = max(_error(a, b) for a, b in zip(got["ours"], got["iree"]))
        ours, theirs = report["results"][f"{kind}_ours"], report["results"][f"{kind}_iree"]
        report["results"][kind] = {
            "speedup": theirs["median_ms"] / ours["median_ms"], "ours_vs_iree": between,
            "correct": ours["worst_error"] < tolerance and theirs["worst_error"] < tolerance,
        }  # fmt: skip
    _write(report, out, tolerance)
    return report


def _write(report: dict, out: Path, tolerance: float) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "module_gpu.json").write_text(json.dumps(report, indent=1) + "\n")
    m, r = report["meta"], report["results"]
    lines = [
        f"# The whole-module route on {m['driver']} ({m['target']}): {m['model']}, batch {m['batch']}, "
        f"{m['size']}x{m['size']}, {m['dtype']}", "",
        f"Device: {report['device']}. Wall clock of one call that returns (read-back of its smallest output "
        f"included), median of {r['step_ours']['runs']} after 3 warm-up calls; errors: the largest difference from "
        f"torch's float64 autograd relative to each output's largest value (tolerance {tolerance}).", "",
        "| module | ours ms | IREE alone ms | IREE / ours | ours' worst error | IREE's worst error | ours vs IREE |",
        "|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for kind, what in (("step", "training step (whole)"), ("wgrad", "weight gradients alone")):
        o, t, k = r[f"{kind}_ours"], r[f"{kind}_iree"], r[kind]
        lines.append(f"| {what} | {o['median_ms']:.3f} | {t['median_ms']:.3f} | {k['speedup']:.2f}x | "
                     f"{o['worst_error']:.2e} | {t['worst_error']:.2e} | {k['ours_vs_iree']:.2e} |")  # fmt: skip
    raised = {k: len(v) for k, v in m["raised"].items()}
    lines += ["", f"Raised: {raised} weight gradients; compile seconds: {m['compile_s']}."]
    (out / "module_gpu.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="verb", required=True)
    c = sub.add_parser("compile", help="here: the four vmfbs and meta.json")
    c.add_argument("--out", type=Path, required=True)
    c.add_argument("--model", default="resnet18", choices=sorted(MODELS))
    c.add_argument("--batch", type=int, default=8)
    c.add_argument("--size", type=int, default=64)
    c.add_argument("--target", default="sm_80")
    c.add_argument("--seed", type=int, default=0)
    r = sub.add_parser("run", help="there: run, time and check the vmfbs of DIR")
    r.add_argument("dir", type=Path)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--runs", type=int, default=50)
    args = p.parse_args(argv)
    if args.verb == "compile":
        compile_all(args.out, args.model, args.batch, args.size, args.target, args.seed)
        return 0
    if args.runs < 1:
        p.error(f"--runs: must be >= 1, got {args.runs}")
    report = run_all(args.dir, args.out, args.runs)
    print((args.out / "module_gpu.md").read_text())
    return 0 if all(report["results"][k]["correct"] for k in ("step", "wgrad")) else 1


if __name__ == "__main__":
    sys.exit(main())
