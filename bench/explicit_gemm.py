"""The explicit strategy's gate: our generated sm_80 GEMM against IREE's TileAndFuse matmul, the
product's current kernel and cuBLAS, side by side in one run (docs/explicit-kernels.md).

Compile here (needs the IREE compiler), run there (needs iree-base-runtime, numpy, torch):

    .venv/bin/python bench/explicit_gemm.py compile DIR
    python3 explicit_gemm.py run DIR --out OUT        # on the GPU machine, one process per contender

``compile`` writes ``DIR/<name>.vmfb`` and ``DIR/manifest.json``: ours (``compile_op`` with
``strategy=explicit``, isolated) for the 1x1 layout-4 weight gradients that are GEMMs (4096^3, 512x512x1024,
and a batched one with 2 images and 2 groups, f32 and f16 dW), IREE's own ``linalg.matmul`` 4096^3
f16 -> f32 with stock sm_80 flags (TileAndFuse), and the product's default plan for the 4096^3 problem;
the shapes the explicit kernel refuses are recorded with their PlanError.

``run`` starts one child per contender (a CUDA fault poisons a process); each checks its result against
torch's float64 matmul of the same inputs, then times the kernel by CUPTI (torch.profiler): ``single``
= median kernel time of calls separated by a pause, ``sustained`` = kernel time per call over a long
back-to-back stream (these kernels reach the power cap). Writes ``OUT/explicit_gemm.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from convbw_mlir.bench.explicit import add_report_parser, geomean, problem_fields, write_tables
from convbw_mlir.measure.cupti import kernel_events

SEED = 5
# IREE's runtime objects die badly with the interpreter (a segfault when they are freed after torch's):
# run-one keeps them here and leaves by os._exit once its JSON line is out.
_KEEP: list[Any] = []
SINGLE_REPS = 10
SUSTAINED_CALLS = 200
GATE = 2.0  # ours over TileAndFuse, same run (issue 14)
TORCH_KINDS = ("torch", "cudnn")  # contenders whose results are torch tensors
# A CPU smoke run of the plumbing (``compile --smoke`` + ``EXPLICIT_GEMM_DEVICE=cpu``): host kernels, no timing.
DEVICE = os.environ.get("EXPLICIT_GEMM_DEVICE", "cuda")


# -- compile side ------------------------------------------------------------------------------------
def _problems():
    from convbw_mlir.problem import ConvBwdWeightProblem as P

    return {
        "gemm4096_f32": P(1, 1, 4096, 4096, (64, 64), (1, 1), layout=4, dw_dtype="f32"),
        "gemm4096_f16": P(1, 1, 4096, 4096, (64, 64), (1, 1), layout=4, dw_dtype="f16"),
        "gemm512x512x1024_f32": P(1, 1, 512, 512, (16, 64), (1, 1), layout=4, dw_dtype="f32"),
        "batched_n2_g2_256x256x512_f32": P(2, 2, 256, 256, (4, 64), (1, 1), layout=4, dw_dtype="f32"),
    }


# Weight gradients as implicit GEMMs (layout 4), against cuDNN: the dense problems of the suites (G=1,
# 2-D; convbw_mlir/suites), ResNet-50's 3x3 layer of issue 14 and two of its 1x1 layers (N=256).
EXTRA_CONV = {
    "resnet50_3x3_256_n256_14": "2 1 256 256 256 3 3 14 14 1 1 1 1 1 1 1 1",
    "resnet50_1x1_1024to256_n256_14": "2 1 256 256 1024 1 1 14 14 1 1 1 1 0 0 0 0",
    "resnet50_1x1_256to64_n256_56": "2 1 256 64 256 1 1 56 56 1 1 1 1 0 0 0 0",
}
PRODUCT_TOO = ("resnet50_3x3_256_n256_14", "resnet50_1x1_1024to256_n256_14")

MATMUL = """
func.func @main(%a: tensor<{m}x{k}xf16>, %b: tensor<{k}x{n}xf16>) -> tensor<{m}x{n}xf32> {{
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<{m}x{n}xf32>
  %c = linalg.fill ins(%zero : f32) outs(%e : tensor<{m}x{n}xf32>) -> tensor<{m}x{n}xf32>
  %r = linalg.matmul ins(%a, %b : tensor<{m}x{k}xf16>, tensor<{k}x{n}xf16>) outs(%c : tensor<{m}x{n}xf32>)
    -> tensor<{m}x{n}xf32>
  return %r : tensor<{m}x{n}xf32>
}}
"""


def _conv_entry(name: str, p, kind: str, vmfb: bytes, folder: Path, plan: Any) -> dict[str, Any]:
    (folder / f"{name}.vmfb").write_bytes(vmfb)
    hw = 1
    for s in p.input_size:
        hw *= s
    return {
        "name": name,
        "kind": kind,
        "form": "conv",
        "function": "conv_bwd_weight",
        "images": p.batch,
        "groups": p.groups,
        "m": p.out_channels,
        "n": p.in_channels,
        "hw": hw,
        "input_size": list(p.input_size),
        "dw_dtype": p.dw_dtype,
        "flops": 2 * p.groups * p.out_channels * p.in_channels * p.batch * hw,
        "plan": plan.to_dict() if plan is not None else None,
    }


def _conv_problems():
    from convbw_mlir.problem import ConvBwdWeightProblem as P
    from convbw_mlir.suites import load_suite

    suites = Path(__file__).resolve().parents[1] / "convbw_mlir" / "suites"
    out = {}
    for suite in ("seeds", "models"):
        for name, p in load_suite(suites / f"{suite}.tsv"):
            if p.groups == 1:
                out[name] = p.with_(layout=4)
    out.update({name: P.from_ck(line, layout=4) for name, line in EXTRA_CONV.items()})
    return out


def _conv2d_entry(name: str, p, kind: str, vmfb: bytes | None, folder: Path, plan: Any) -> dict[str, Any]:
    if vmfb is not None:
        (folder / f"{name.replace(':', '_')}.vmfb").write_bytes(vmfb)
    return {
        "name": name,
        "vmfb": f"{name.replace(':', '_')}.vmfb",
        "kind": kind,
        "form": "conv2d",
        "function": "conv_bwd_weight",
        "problem": name.split(":", 1)[1],
        **problem_fields(p),
        "plan": plan.to_dict() if plan is not None else None,
    }


def compile_all(folder: Path, smoke: bool = False) -> None:
    """Compile every contender into ``folder`` (vmfbs and manifest.json); ``smoke``: small host kernels
    for a CPU run of the run side (ours is sm_80 only, so it is left out there)."""
    from convbw_mlir import compile_op
    from convbw_mlir.build.iree import CompileError, compile_module
    from convbw_mlir.plan import PlanError, decide
    from convbw_mlir.problem import ConvBwdWeightProblem as P

    folder.mkdir(parents=True, exist_ok=True)
    entries, refused = [], {}
    size, target = (512, "host") if smoke else (4096, "sm_80")
    for name, p in ({} if smoke else _problems()).items():
        t0 = time.time()
        op = compile_op(p, "sm_80", strategy="explicit", isolate=True, cache=False)
        entries.append(_conv_entry(f"ours_{name}", p, "ours", op.vmfb, folder, op.plan))
        print(f"ours {name}: {time.time() - t0:.1f} s", flush=True)
    if smoke:  # the conv2d plumbing on the CPU: the product's host kernel and torch's conv
        p = P.from_ck("2 1 2 8 4 3 3 6 6 1 1 1 1 1 1 1 1", layout=4)
        entries.append(_conv2d_entry("product:small", p, "product", compile_op(p, "host", cache=False).vmfb, folder,
                                     None))  # fmt: skip
        entries.append(_conv2d_entry("cudnn:small", p, "cudnn", None, folder, None))
    for name, p in ({} if smoke else _conv_problems()).items():
        t0 = time.time()
        try:
            decide(p, "sm_80", strategy="explicit")
        except PlanError as e:
            refused[name] = str(e)
            continue
        try:
            op = compile_op(p, "sm_80", strategy="explicit", isolate=True, cache=False)
        except CompileError as e:
            refused[name] = f"compile failed: {e}"
            continue
        entries.append(_conv2d_entry(f"ours:{name}", p, "ours", op.vmfb, folder, op.plan))
        entries.append(_conv2d_entry(f"cudnn:{name}", p, "cudnn", None, folder, None))
        if name in PRODUCT_TOO:
            prod = compile_op(p, "sm_80", isolate=True, cache=False)
            entries.append(_conv2d_entry(f"product:{name}", p, "product", prod.vmfb, folder, prod.plan))
        print(f"ours {name}: {time.time() - t0:.1f} s", flush=True)
    big = P(1, 1, size, size, (size // 64, 64), (1, 1), layout=4, dw_dtype="f32")
    t0 = time.time()
    try:
        op = compile_op(big, target, isolate=True, cache=False)
        entries.append(_conv_entry(f"product_default_gemm{size}_f32", big, "product", op.vmfb, folder, op.plan))
    except CompileError as e:
        refused["product_default_gemm4096_f32"] = f"compile failed: {e}"
    print(f"product default: {time.time() - t0:.1f} s", flush=True)
    t0 = time.time()
    vmfb = compile_module(MATMUL.format(m=size, n=size, k=size), target)
    (folder / f"iree_matmul{size}_f32.vmfb").write_bytes(vmfb)
    entries.append({"name": f"iree_matmul{size}_f32", "kind": "iree", "form": "matmul", "function": "main",
                    "m": size, "n": size, "k": size, "dw_dtype": "f32", "flops": 2 * size**3})  # fmt: skip
    print(f"iree matmul: {time.time() - t0:.1f} s", flush=True)
    entries.append({"name": f"torch_matmul{size}_f16", "kind": "torch", "form": "torch", "m": size, "n": size,
                    "k": size, "dw_dtype": "f16", "flops": 2 * size**3})  # fmt: skip
    manifest = {"target": target, "entries": entries, "refused": refused, "seed": SEED}
    tmp = folder / "manifest.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=1))
    tmp.replace(folder / "manifest.json")


# -- run side ----------------------------------------------------------------------------------------
def _calls(kernels: list[tuple[float, float, str]], gap_us: float = 5000.0) -> list[list[tuple[float, float, str]]]:
    """Kernels grouped into calls: the single-call reps are separated by a pause far longer than ``gap_us``."""
    calls: list[list[tuple[float, float, str]]] = []
    end = -math.inf
    for k in kernels:
        if k[0] - end > gap_us:
            calls.append([])
        calls[-1].append(k)
        end = max(end, k[0] + k[1])
    return calls


def _inputs(entry: dict, torch: Any) -> tuple[Any, Any]:
    """dy as [images, groups, m, hw] and x as [images, groups, n, hw] (f16, seeded, on the GPU); for a
    conv2d entry, dy as [N, G * K, Ho, Wo] and x as [N, G * C, H, W]."""
    g = torch.Generator(device="cpu").manual_seed(SEED)
    if entry["form"] == "conv2d":
        n, grp = entry["images"], entry["groups"]
        dy = torch.randn(n, grp * entry["out_channels"], *entry["output_size"], generator=g)
        x = torch.randn(n, grp * entry["in_channels"], *entry["input_size"], generator=g)
    elif entry["form"] == "conv":
        dy = torch.randn(entry["images"], entry["groups"], entry["m"], entry["hw"], generator=g)
        x = torch.randn(entry["images"], entry["groups"], entry["n"], entry["hw"], generator=g)
    else:
        dy = torch.randn(1, 1, entry["m"], entry["k"], generator=g)
        x = torch.randn(1, 1, entry["n"], entry["k"], generator=g)
    return dy.half().to(DEVICE), x.half().to(DEVICE)


def _conv2d_weight(entry: dict, x: Any, dy: Any, torch: Any) -> Any:
    """cuDNN's weight gradient, ``[G * K, C, Y, X]``, in the inputs' type."""
    shape = (entry["groups"] * entry["out_channels"], entry["in_channels"], *entry["filter_size"])
    return torch.nn.grad.conv2d_weight(x, shape, dy, stride=entry["stride"], padding=entry["pad"],
                                       dilation=entry["dilation"], groups=entry["groups"])  # fmt: skip


def _reference(entry: dict, dy: Any, x: Any, torch: Any) -> Any:
    """``[groups, m, n]``: float64 sums of dy * x; a conv2d entry's in f32 by cuDNN without TF32."""
    if entry["form"] == "conv2d":
        torch.backends.cudnn.allow_tf32 = False
        dw = _conv2d_weight(entry, x.float(), dy.float(), torch).double()
        return dw.reshape(entry["groups"], entry["out_channels"], -1)
    return torch.einsum("igmr,ignr->gmn", dy.double(), x.double())


def _contender(entry: dict, folder: Path, dy: Any, x: Any, torch: Any):
    """A callable running the contender once on device-resident inputs, and one returning its dW as torch."""
    if entry["kind"] == "cudnn":
        torch.backends.cudnn.benchmark = True
        xc, dyc = (x, dy) if DEVICE == "cuda" else (x.float(), dy.float())  # CPU: the plumbing only

        def conv() -> Any:
            return _conv2d_weight(entry, xc, dyc, torch)

        return conv, lambda r: r.reshape(entry["groups"], entry["out_channels"], -1)
    if entry["kind"] == "torch":
        a, b = dy[0, 0], x[0, 0]

        if DEVICE == "cpu":  # CPU torch has no f16 GEMM everywhere: the smoke run checks the plumbing only
            a, b = a.float(), b.float()

        def call() -> Any:
            return torch.matmul(a, b.t())

        return call, lambda r: r.reshape(1, *r.shape)
    import iree.runtime as rt

    device = rt.get_driver("cuda" if DEVICE == "cuda" else "local-task").create_default_device()
    config = rt.Config(device=device)
    vmfb = folder / entry.get("vmfb", f"{entry['name']}.vmfb")
    module = rt.VmModule.copy_buffer(config.vm_instance, vmfb.read_bytes())
    fn = rt.load_vm_module(module, config)[entry["function"]]
    if entry["form"] == "conv2d":
        n, grp = entry["images"], entry["groups"]
        shape_x = (n, grp, entry["in_channels"], *entry["input_size"])
        shape_dy = (n, grp, entry["out_channels"], *entry["output_size"])
        args = [rt.asdevicearray(device, x.cpu().numpy().reshape(shape_x)),
                rt.asdevicearray(device, dy.cpu().numpy().reshape(shape_dy))]  # fmt: skip
    elif entry["form"] == "conv":
        shape_x = (entry["images"], entry["groups"], entry["n"], *entry["input_size"])
        shape_dy = (entry["images"], entry["groups"], entry["m"], *entry["input_size"])
        args = [rt.asdevicearray(device, x.cpu().numpy().reshape(shape_x)),
                rt.asdevicearray(device, dy.cpu().numpy().reshape(shape_dy))]  # fmt: skip
    else:  # linalg.matmul: A [m, k], B [k, n]
        args = [rt.asdevicearray(device, dy[0, 0].cpu().numpy()),
                rt.asdevicearray(device, x[0, 0].t().contiguous().cpu().numpy())]  # fmt: skip

    def call() -> Any:
        return fn(*args)

    def result(r: Any) -> Any:
        arr = torch.from_numpy(r.to_host().astype("float64"))
        m = entry.get("m", entry.get("out_channels"))
        return arr.reshape(entry.get("groups", 1), m, -1)

    return call, result


def run_one(folder: Path, name: str) -> dict[str, Any]:
    """Check and time one contender (in this process)."""
    import torch

    entry = next(e for e in json.loads((folder / "manifest.json").read_text())["entries"] if e["name"] == name)
    rec: dict[str, Any] = {"name": name, "kind": entry["kind"], "flops": entry["flops"]}
    dy, x = _inputs(entry, torch)
    call, result = _contender(entry, folder, dy, x, torch)
    _KEEP.append((call, result))
    exact = _reference(entry, dy, x, torch).cpu()
    got = result(call()).cpu().double()
    err = (got - exact).abs()
    scale = exact.abs().max().item()
    rec["max_rel_err"] = err.max().item() / scale
    rec["rms_rel_err"] = (err.pow(2).mean().sqrt() / exact.pow(2).mean().sqrt()).item()
    # f32 accumulation of f16 products; an f16 result adds its rounding (2^-11 of the largest entry).
    rec["tolerance"] = 1e-3 if entry["dw_dtype"] == "f32" else 2e-3
    rec["correct"] = bool(rec["max_rel_err"] <= rec["tolerance"]) and bool(torch.isfinite(got).all())
    del got, exact
    if entry["form"] == "conv" and entry["flops"] < 1e10 and DEVICE == "cuda":  # numerics-only checks
        return rec
    sync = torch.cuda.synchronize if DEVICE == "cuda" else (lambda: None)
    for _ in range(5):
        r = call()
    result(r) if entry["kind"] not in TORCH_KINDS else sync()
    activities = [torch.profiler.ProfilerActivity.CPU]
    if DEVICE == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "single.json"
        with torch.profiler.profile(activities=activities) as prof:
            for _ in range(SINGLE_REPS):
                r = call()
                r.to_host() if entry["kind"] not in TORCH_KINDS else sync()
                time.sleep(0.02)  # a pause: the clock recovers between calls
        prof.export_chrome_trace(str(trace))
        single = kernel_events(trace)
        trace = Path(tmp) / "sustained.json"
        t0 = time.perf_counter()
        with torch.profiler.profile(activities=activities) as prof:
            for _ in range(SUSTAINED_CALLS):
                r = call()
            r.to_host() if entry["kind"] not in TORCH_KINDS else sync()
        wall = (time.perf_counter() - t0) / SUSTAINED_CALLS
        prof.export_chrome_trace(str(trace))
        sustained = kernel_events(trace)
    rec["kernels"] = sorted({n for _, _, n in single})[:4]
    rec["kernels_per_call"] = len(single) / SINGLE_REPS
    # Per call: the kernels of a call are contiguous; with one kernel a call, the durations themselves.
    per_call = [sum(d for _, d, _ in call_) for call_ in _calls(single)]
    rec["single_us"] = statistics.median(per_call) if per_call else None
    rec["sustained_us"] = sum(d for _, d, _ in sustained) / SUSTAINED_CALLS if sustained else None
    rec["sustained_wall_us"] = wall * 1e6
    for key in ("single", "sustained"):
        us = rec[f"{key}_us"]
        rec[f"{key}_tflops"] = entry["flops"] / (us * 1e-6) / 1e12 if us else None
    return rec


def profile_one(folder: Path, name: str, calls: int = 3) -> None:
    """Run one contender ``calls`` times and nothing else (for Nsight Compute: ``ncu ... profile-one``)."""
    import torch

    entry = next(e for e in json.loads((folder / "manifest.json").read_text())["entries"] if e["name"] == name)
    dy, x = _inputs(entry, torch)
    call, result = _contender(entry, folder, dy, x, torch)
    _KEEP.append((call, result))
    for _ in range(calls):
        r = call()
        r.to_host() if entry["kind"] not in TORCH_KINDS else torch.cuda.synchronize()


def _conv_summary(rows: list[dict], doc: dict) -> list[str]:
    """Per problem: ours, cuDNN (and the product's default where run), cuDNN / ours; the geomean."""
    problems: dict[str, dict[str, dict]] = {}
    for r in rows:
        if ":" in r["name"]:
            kind, name = r["name"].split(":", 1)
            problems.setdefault(name, {})[kind] = r
    lines = [
        "| problem | ours us | ok | cuDNN us | product us | cuDNN / ours | ours TFLOP/s |",
        "|---|---|---|---|---|---|---|",
    ]
    ratios = []
    for name, by in problems.items():
        ours, cudnn, prod = by.get("ours", {}), by.get("cudnn", {}), by.get("product", {})
        ok = "-" if not ours else "crashed" if "crashed" in ours else ("yes" if ours.get("correct") else "WRONG")
        ratio = None
        if ours.get("correct") and ours.get("single_us") and cudnn.get("single_us"):
            ratio = cudnn["single_us"] / ours["single_us"]
            ratios.append(ratio)
        cells = [ours.get("single_us"), ok, cudnn.get("single_us"), prod.get("single_us"), ratio,
                 ours.get("single_tflops")]  # fmt: skip
        lines.append(f"| {name} | " + " | ".join(c if isinstance(c, str) else ("-" if c is None else f"{c:.2f}")
                                             for c in cells) + " |")  # fmt: skip
    geo = geomean(ratios)
    doc["conv_geomean_cudnn_over_ours"] = geo
    doc["conv_problems_timed"] = len(ratios)
    return [*lines, "", f"Geomean cuDNN / ours over {len(ratios)} problems: {geo}", ""]


def run_all(folder: Path, out: Path, only: list[str] | None = None) -> int:
    """Run every contender in a child of its own; write OUT/explicit_gemm.json and .md."""
    manifest = json.loads((folder / "manifest.json").read_text())
    rows: list[dict] = []
    entries = [e for e in manifest["entries"] if not only or any(o in e["name"] for o in only)]
    # Our kernels each in a child (a fault poisons a process); cuDNN's, which do not fault, share one.
    batches = [[e for e in entries if e["kind"] == "cudnn"]] + [[e] for e in entries if e["kind"] != "cudnn"]
    out.mkdir(parents=True, exist_ok=True)
    for batch in filter(None, batches):
        t0 = time.time()
        proc = subprocess.run([sys.executable, __file__, "run-one", str(folder), *(e["name"] for e in batch)],
                              capture_output=True, text=True, timeout=300)  # fmt: skip
        got = {}
        for line in proc.stdout.splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict) and "name" in rec:
                got[rec["name"]] = rec
        for e in batch:
            rec = got.get(e["name"]) or {"name": e["name"], "kind": e["kind"], "crashed": proc.stderr[-2000:]}
            rec["seconds"] = round(time.time() - t0, 1)
            print(json.dumps(rec), flush=True)
            rows.append(rec)
        (out / "rows.json").write_text(json.dumps(rows, indent=1))  # what a cut-off run still returns
    import torch

    device = torch.cuda.get_device_name(0) if DEVICE == "cuda" else "cpu"
    return report(rows, manifest, out, device)


def report(rows: list[dict], manifest: dict, out: Path, device: str, date: str | None = None) -> int:
    """Write OUT/explicit_gemm.json and .md from the rows of a run (also those of a cut-off run's rows.json)."""
    by = {r["name"]: r for r in rows}
    ours, tnf = by.get("ours_gemm4096_f32", {}), by.get("iree_matmul4096_f32", {})
    gate = None
    if ours.get("single_us") and tnf.get("single_us"):
        gate = {key: tnf[f"{key}_us"] / ours[f"{key}_us"] for key in ("single", "sustained")}
    doc = {"device": device, "date": date or time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "rows": rows, "refused": manifest["refused"],
           "gate_ratio_over_tileandfuse": gate, "gate": GATE}  # fmt: skip
    lines = [f"# Explicit GEMM gate: {doc['device']}, {doc['date']}", "",
             "| contender | correct | max rel err | single us | TFLOP/s | sustained us | TFLOP/s | kernels/call |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:

        def f(k: str, fmt: str = "{:.1f}", r: dict = r) -> str:
            return fmt.format(r[k]) if r.get(k) is not None else "-"

        ok = "crashed" if "crashed" in r else ("yes" if r.get("correct") else "WRONG")
        cells = [f("max_rel_err", "{:.2e}"), f("single_us"), f("single_tflops"), f("sustained_us"),
                 f("sustained_tflops"), f("kernels_per_call")]  # fmt: skip
        lines.append(f"| {r['name']} | {ok} | {' | '.join(cells)} |")
    lines += ["", f"Gate (ours / TileAndFuse, >= {GATE}): {gate}", ""]
    lines += _conv_summary(rows, doc)
    lines += [f"- refused `{k}`: {v}" for k, v in manifest["refused"].items()]
    return write_tables(out, "explicit_gemm", doc, lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compile")
    c.add_argument("dir", type=Path)
    c.add_argument("--smoke", action="store_true", help="small host kernels for a CPU run of the run side")
    r = sub.add_parser("run")
    r.add_argument("dir", type=Path)
    r.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    r.add_argument("--only", nargs="*", help="run only the contenders whose name holds one of these")
    one = sub.add_parser("run-one")
    one.add_argument("dir", type=Path)
    one.add_argument("names", nargs="+")
    add_report_parser(sub)
    prof = sub.add_parser("profile-one")
    prof.add_argument("dir", type=Path)
    prof.add_argument("name")
    a = ap.parse_args(argv)
    if a.cmd == "compile":
        compile_all(a.dir, a.smoke)
        return 0
    if a.cmd == "report":
        manifest = json.loads((a.dir / "manifest.json").read_text())
        return report(json.loads(a.rows.read_text()), manifest, a.out, a.device, a.date)
    if a.cmd == "run":
        return run_all(a.dir, a.out, a.only)
    if a.cmd == "profile-one":
        profile_one(a.dir, a.name)
    else:
        for name in a.names:
            print(json.dumps(run_one(a.dir, name)), flush=True)
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
