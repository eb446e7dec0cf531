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

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import harness  # bench/harness.py, beside this script (its docstring says how)

from convbw_mlir.measure.cupti import kernel_events

SEED = 5
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
        **harness.problem_fields(p),
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
    harness.write_manifest(folder, {"target": target, "entries": entries, "refused": refused, "seed": SEED})


# -- run side ----------------------------------------------------------------------------------------
def _inputs(entry: dict, torch: Any) -> tuple[Any, Any]:
    """dy as [images, groups, m, hw] and x as [images, groups, n, hw] (f16, seeded, on the GPU); for a
    conv2d entry, dy as [N, G * K, Ho, Wo] and x as [N, G * C, H, W]."""
    if entry["form"] == "conv2d":
        return harness.nchw_inputs(entry, SEED, DEVICE, torch)
    g = torch.Generator(device="cpu").manual_seed(SEED)
    if entry["form"] == "conv":
        dy = torch.randn(entry["images"], entry["groups"], entry["m"], entry["hw"], generator=g)
        x = torch.randn(entry["images"], entry["groups"], entry["n"], entry["hw"], generator=g)
    else:
        dy = torch.randn(1, 1, entry["m"], entry["k"], generator=g)
        x = torch.randn(1, 1, entry["n"], entry["k"], generator=g)
    return dy.half().to(DEVICE), x.half().to(DEVICE)


def _reference(entry: dict, dy: Any, x: Any, torch: Any) -> Any:
    """``[groups, m, n]``: float64 sums of dy * x; a conv2d entry's in f32 by cuDNN without TF32."""
    if entry["form"] == "conv2d":
        torch.backends.cudnn.allow_tf32 = False
        dw = harness.conv2d_weight(entry, x.float(), dy.float(), torch).double()
        return dw.reshape(entry["groups"], entry["out_channels"], -1)
    return torch.einsum("igmr,ignr->gmn", dy.double(), x.double())


def _contender(entry: dict, folder: Path, dy: Any, x: Any, torch: Any):
    """A callable running the contender once on device-resident inputs, and one returning its dW as torch."""
    if entry["kind"] == "cudnn":
        torch.backends.cudnn.benchmark = True
        xc, dyc = (x, dy) if DEVICE == "cuda" else (x.float(), dy.float())  # CPU: the plumbing only

        def conv() -> Any:
            return harness.conv2d_weight(entry, xc, dyc, torch)

        return conv, lambda r: r.reshape(entry["groups"], entry["out_channels"], -1)
    if entry["kind"] == "torch":
        a, b = dy[0, 0], x[0, 0]

        if DEVICE == "cpu":  # CPU torch has no f16 GEMM everywhere: the smoke run checks the plumbing only
            a, b = a.float(), b.float()

        def call() -> Any:
            return torch.matmul(a, b.t())

        return call, lambda r: r.reshape(1, *r.shape)
    if entry["form"] == "conv2d":
        n, grp = entry["images"], entry["groups"]
        shape_x = (n, grp, entry["in_channels"], *entry["input_size"])
        shape_dy = (n, grp, entry["out_channels"], *entry["output_size"])
        args = [x.cpu().numpy().reshape(shape_x), dy.cpu().numpy().reshape(shape_dy)]
    elif entry["form"] == "conv":
        shape_x = (entry["images"], entry["groups"], entry["n"], *entry["input_size"])
        shape_dy = (entry["images"], entry["groups"], entry["m"], *entry["input_size"])
        args = [x.cpu().numpy().reshape(shape_x), dy.cpu().numpy().reshape(shape_dy)]
    else:  # linalg.matmul: A [m, k], B [k, n]
        args = [dy[0, 0].cpu().numpy(), x[0, 0].t().contiguous().cpu().numpy()]
    vmfb = folder / entry.get("vmfb", f"{entry['name']}.vmfb")
    call = harness.iree_call(vmfb, entry["function"], DEVICE, *args)

    def result(r: Any) -> Any:
        arr = torch.from_numpy(r.to_host().astype("float64"))
        m = entry.get("m", entry.get("out_channels"))
        return arr.reshape(entry.get("groups", 1), m, -1)

    return call, result


def run_one(folder: Path, name: str) -> dict[str, Any]:
    """Check and time one contender (in this process)."""
    import torch

    entry = next(e for e in harness.load_manifest(folder)["entries"] if e["name"] == name)
    rec: dict[str, Any] = {"name": name, "kind": entry["kind"], "flops": entry["flops"]}
    dy, x = _inputs(entry, torch)
    call, result = _contender(entry, folder, dy, x, torch)
    harness.KEEP.append((call, result))
    exact = _reference(entry, dy, x, torch).cpu()
    got = result(call()).cpu().double()
    rec.update(harness.check(got, exact, entry["dw_dtype"], torch))
    del got, exact
    if entry["form"] == "conv" and entry["flops"] < 1e10 and DEVICE == "cuda":  # numerics-only checks
        return rec
    sync = torch.cuda.synchronize if DEVICE == "cuda" else (lambda: None)
    with harness.device_lock().timing():  # alone on the GPU: no other process's work beside the timed calls
        for _ in range(5):
            r = call()
        result(r) if entry["kind"] not in TORCH_KINDS else sync()
        activities = harness.activities(torch, DEVICE)
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
    per_call = [sum(d for _, d, _ in call_) for call_ in harness.calls(single, 5000.0)]
    rec["single_us"] = statistics.median(per_call) if per_call else None
    rec["sustained_us"] = sum(d for _, d, _ in sustained) / SUSTAINED_CALLS if sustained else None
    rec["sustained_wall_us"] = wall * 1e6
    for key in ("single", "sustained"):
        rec[f"{key}_tflops"] = harness.tflops(entry["flops"], rec[f"{key}_us"])
    return rec


def profile_one(folder: Path, name: str, calls: int = 3) -> None:
    """Run one contender ``calls`` times and nothing else (for Nsight Compute: ``ncu ... profile-one``)."""
    import torch

    entry = next(e for e in harness.load_manifest(folder)["entries"] if e["name"] == name)
    dy, x = _inputs(entry, torch)
    call, result = _contender(entry, folder, dy, x, torch)
    harness.KEEP.append((call, result))
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
    geo = harness.geomean(ratios)
    doc["conv_geomean_cudnn_over_ours"] = geo
    doc["conv_problems_timed"] = len(ratios)
    return [*lines, "", f"Geomean cuDNN / ours over {len(ratios)} problems: {geo}", ""]


def run_all(folder: Path, out: Path, only: list[str] | None = None) -> int:
    """Run every contender in a child of its own, one at a time; write OUT/explicit_gemm.json and .md."""
    manifest = harness.load_manifest(folder)
    entries = [e for e in manifest["entries"] if not only or any(o in e["name"] for o in only)]
    kinds = {e["name"]: e["kind"] for e in entries}
    # Our kernels each in a child (a fault poisons a process); cuDNN's, which do not fault, share one.
    batches = [[n for n, k in kinds.items() if k == "cudnn"]] + [[n] for n, k in kinds.items() if k != "cudnn"]
    rows = harness.run_batches(__file__, folder, out, [b for b in batches if b], child_limit=300,
                               lost=lambda n: {"name": n, "kind": kinds[n]}, seconds="seconds")  # fmt: skip
    return report(rows, manifest, out, harness.device_name(DEVICE))


def report(rows: list[dict], manifest: dict, out: Path, device: str, date: str | None = None) -> int:
    """Write OUT/explicit_gemm.json and .md from the rows of a run (also those of a cut-off run's rows.json)."""
    by = {r["name"]: r for r in rows}
    ours, tnf = by.get("ours_gemm4096_f32", {}), by.get("iree_matmul4096_f32", {})
    gate = None
    if ours.get("single_us") and tnf.get("single_us"):
        gate = {key: tnf[f"{key}_us"] / ours[f"{key}_us"] for key in ("single", "sustained")}
    doc = {"device": device, "date": date or harness.now(),
           "rows": rows, "refused": manifest["refused"],
           "gate_ratio_over_tileandfuse": gate, "gate": GATE}  # fmt: skip
    lines = [f"# Explicit GEMM gate: {doc['device']}, {doc['date']}", "",
             "| contender | correct | max rel err | single us | TFLOP/s | sustained us | TFLOP/s | kernels/call |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        ok = "crashed" if "crashed" in r else ("yes" if r.get("correct") else "WRONG")
        cells = harness.cells(r, "max_rel_err:.2e", "single_us", "single_tflops", "sustained_us", "sustained_tflops",
                              "kernels_per_call")  # fmt: skip
        lines.append(f"| {r['name']} | {ok} | {' | '.join(cells)} |")
    lines += ["", f"Gate (ours / TileAndFuse, >= {GATE}): {gate}", ""]
    lines += _conv_summary(rows, doc)
    lines += harness.notes(manifest)
    return harness.write_tables(out, "explicit_gemm", doc, lines)


def main(argv: list[str] | None = None) -> int:
    ap, sub, run = harness.command_line(__file__, __doc__, "small host kernels for a CPU run of the run side")
    run.add_argument("--only", nargs="*", help="run only the contenders whose name holds one of these")
    harness.add_child_parser(sub, "run-one")
    prof = sub.add_parser("profile-one")
    prof.add_argument("dir", type=Path)
    prof.add_argument("name")

    def run_one_(a: Any) -> None:
        for name in a.names:
            print(json.dumps(run_one(a.dir, name)), flush=True)

    children = {"run-one": run_one_, "profile-one": lambda a: profile_one(a.dir, a.name)}
    return harness.main(ap, argv, compile=lambda a: compile_all(a.dir, a.smoke),
                        run=lambda a: run_all(a.dir, a.out, a.only), report=report, children=children)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
