"""First layers (odd channel counts) and fused epilogues in the explicit sm_80 kernel, against cuDNN and the
plan's old choice, in one run (issue 23, items 2 and 6; docs/explicit-kernels.md "Odd channels").

    .venv/bin/python bench/first_layers.py compile DIR              # here (needs the IREE compiler)
    python3 first_layers.py run DIR --out OUT --budget 150          # there, beside explicit_conv.py, harness.py

Problems, layout 2 (channels-last), f16 (a bf16 copy of ResNet-50's conv1): first layers of published models with C
= 3 (ResNet-50's conv1 at N = 256 and 32, ViT-B/16's 16x16 stride-16 patch stem, the 3-D stem of R(2+1)D/R3D-18
video nets), YOLOv3's detection heads (K = 255 out channels, odd: dy goes by the register path), and three layers
with each fused epilogue beside the plain kernel. Kinds: ``ours`` (the plan's rule), ``t64x64``, ``t64x64_k216``,
``t64x128`` (other tilings and splits beside it on ResNet-50's conv1: checks the rule), ``old`` (the plan's choice
before this change: IREE codegen for odd channels and epilogues), ``cudnn``; the epilogue layers: ``plain``,
``scale``, ``bilinear`` (D f16), ``accumulate`` (dW += ..., in D's buffer), all ours.

The run side is explicit_conv.py's (children, GPU lock, CUPTI kernel time, float64 check on the GPU) with
inputs and D placed before 1 MiB of NaN (``runtime.Kernel.to_device_fenced``): a read past them shows.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

import explicit_conv as ec  # beside this script
import harness

from convbw_mlir.measure.cupti import kernel_events

ALPHA, BETA = 2.0, 0.5


def problems() -> dict[str, tuple[Any, list[str]]]:
    """name -> (problem, kinds of ours beside cuDNN)."""
    from convbw_mlir.problem import ConvBwdWeightProblem as P
    from convbw_mlir.problem import Epilogue

    def conv1(n: int) -> Any:
        return P(1, n, 3, 64, (224, 224), (7, 7), stride=2, pad_low=3, pad_high=3, layout=2)

    first = ["ours", "t64x64", "old"]
    out = {
        "resnet50_conv1_n256": (conv1(256), [*first, "t64x64_k216", "t64x128"]),
        "resnet50_conv1_n32": (conv1(32), first),
        "resnet50_conv1_n32_bf16": (conv1(32).with_(dtype="bf16", dw_dtype="bf16"), ["ours", "old"]),
        "vit_b16_patch_n64": (P(1, 64, 3, 768, (224, 224), (16, 16), stride=16, layout=2), ["ours", "old"]),
        "r2plus1d_stem3d_n8": (
            P(
                1,
                8,
                3,
                64,
                (16, 112, 112),
                (3, 7, 7),
                stride=(1, 2, 2),
                pad_low=(1, 3, 3),
                pad_high=(1, 3, 3),
                layout=2,
            ),
            ["ours", "old"],
        ),  # fmt: skip
        "yolov3_head_k255_c256_52_n16": (P(1, 16, 256, 255, (52, 52), (1, 1), layout=2), ["ours", "old"]),
        "yolov3_head_k255_c1024_13_n16": (P(1, 16, 1024, 255, (13, 13), (1, 1), layout=2), ["ours", "old"]),
    }
    eps = {"scale": Epilogue("scale", ALPHA), "bilinear": Epilogue("bilinear", ALPHA, BETA),
           "accumulate": Epilogue("accumulate")}  # fmt: skip
    for name, line in (("resnet50_3x3_256_n256_14", "2 1 256 256 256 3 3 14 14 1 1 1 1 1 1 1 1"),
                       ("resnet50_1x1_1024to256_n256_14", "2 1 256 256 1024 1 1 14 14 1 1 1 1 0 0 0 0"),
                       ("vgg_3x3_512_n32_7", "2 1 32 512 512 3 3 7 7 1 1 1 1 1 1 1 1")):  # fmt: skip
        p = P.from_ck(line)
        out[name] = (p, ["plain"])
        for kind, ep in eps.items():
            out[f"{name}_{kind}"] = (p.with_(epilogue=ep), [kind] + (["old"] if kind == "bilinear" else []))
    return out


def compile_all(folder: Path, only: list[str] | None = None) -> None:
    """Each problem's contenders into ``folder`` (``<kind>_<problem>.vmfb``, manifest.json), isolated."""
    from convbw_mlir import compile_op
    from convbw_mlir.build.iree import CompileError
    from convbw_mlir.plan import PlanError

    folder.mkdir(parents=True, exist_ok=True)
    entries, refused = [], {}
    t64 = {"strategy": "explicit", "tile_m": 64, "tile_n": 64, "subgroups_m": 2, "subgroups_n": 2}
    options = {"old": {"strategy": "codegen"}, "t64x64": t64, "t64x64_k216": {**t64, "k_batch": 216},
               "t64x128": {**t64, "tile_n": 128}}  # fmt: skip
    for name, (p, kinds) in problems().items():
        if only and not any(o in name for o in only):
            continue
        t0 = time.time()
        for kind in kinds:
            try:
                op = compile_op(p, "sm_80", **options.get(kind, {"strategy": "explicit"}), isolate=True, cache=False)
            except (PlanError, CompileError) as e:
                refused[f"{kind}:{name}"] = str(e)[:400]
                continue
            (folder / f"{kind}_{name}.vmfb").write_bytes(op.vmfb)
            e = ec._entry(name, kind, p, op.plan, True)
            e["epilogue"] = p.epilogue.to_dict() if p.epilogue else None
            entries.append(e)
        if p.epilogue is None:
            entries.append(ec._entry(name, "cudnn", p, None, True))
        print(f"{name}: {', '.join(kinds)} in {time.time() - t0:.1f} s", flush=True)
    harness.write_manifest(folder, {"target": "sm_80", "entries": entries, "refused": refused, "seed": ec.SEED,
                                    "layout": 2})  # fmt: skip


def _d(e: dict, torch: Any) -> Any:
    """The epilogue's D (GKYXC, dW's type), seeded."""
    g = torch.Generator(device="cpu").manual_seed(ec.SEED + 1)
    shape = (e["groups"], e["out_channels"], *e["filter_size"], e["in_channels"])
    return torch.randn(*shape, generator=g).to({"f16": torch.float16, "bf16": torch.bfloat16}[e["dw_dtype"]])


def _measure(e: dict, folder: Path, x: Any, dy: Any, torch: Any) -> dict[str, Any]:
    """Check one contender against float64 (epilogue applied) inside NaN fences, then time it by CUPTI."""
    from convbw_mlir.runtime import Kernel

    rec: dict[str, Any] = {"name": e["name"], "kind": e["kind"], "problem": e["problem"], "flops": e["flops"]}
    exact = ec._reference(e, x, dy, folder, torch).cpu()
    if e["kind"] == "cudnn":
        call, as_torch, sync = ec._contender(e, folder, x, dy, torch)
    else:
        n, grp = e["images"], e["groups"]
        xs = ec._numpy(x, torch).reshape(n, *e["input_size"], grp, e["in_channels"])
        dys = ec._numpy(dy, torch).reshape(n, *e["output_size"], grp, e["out_channels"])
        kernel = Kernel((folder / e["vmfb"]).read_bytes(), "cuda")
        args = [kernel.to_device_fenced(a) for a in (xs, dys)]
        ep = e.get("epilogue")
        if ep and ep["kind"] != "scale":
            d = _d(e, torch)
            args.append(kernel.to_device_fenced(ec._numpy(d, torch)))
            exact = ep["alpha"] * exact + ep["beta"] * d.double()
        elif ep:
            exact = ep["alpha"] * exact
        ec.harness.KEEP.append((kernel, args))

        def call() -> Any:
            return kernel(*args)

        def as_torch(r: Any) -> Any:
            return torch.from_numpy(r.to_host().astype("float64"))

        def sync(r: Any) -> Any:
            return r.to_host()

    with harness.device_lock().timing():  # cuDNN's first call searches its algorithms by timing them
        r = call()
        sync(r)
    got = as_torch(r).cpu().double()
    rec.update(harness.check(got, exact.reshape(got.shape), e["dw_dtype"], torch, rms=False))
    del got, exact
    (kernels, rec["launch"]), wall = harness.profile_calls(
        call, sync, torch, harness.activities(torch, "cuda"), ec.SINGLE_REPS, ec.SUSTAINED_CALLS,
        lambda trace: (kernel_events(trace), ec._launch_facts(trace)))  # fmt: skip
    calls = [sum(dur for _, dur, _ in c) for c in harness.calls(kernels, 4000.0)]
    per_call, stream = calls[: ec.SINGLE_REPS], calls[ec.SINGLE_REPS :]
    rec["kernels"] = sorted({k for _, _, k in kernels})[:4]
    rec["kernels_per_call"] = len(kernels) / (ec.SINGLE_REPS + ec.SUSTAINED_CALLS)
    rec["single_us"] = statistics.median(per_call) if per_call else None
    rec["sustained_us"] = sum(stream) / ec.SUSTAINED_CALLS if stream else None
    rec["single_tflops"] = harness.tflops(e["flops"], rec["single_us"])
    return rec


def run_children(folder: Path, names: list[str]) -> None:
    ec._measure = _measure  # explicit_conv's child loop with this script's measurement
    ec.run_children(folder, names)


def run_all(folder: Path, out: Path, budget: float, jobs: int, only: list[str] | None = None) -> int:
    """cuDNN's contenders in one child, each other contender in its own, ``jobs`` at once, within ``budget`` s."""
    start = time.time()
    manifest = harness.load_manifest(folder)
    entries = [e for e in manifest["entries"] if not only or any(o in e["name"] for o in only)]
    batches = [[e["name"] for e in entries if e["kind"] == "cudnn"]]
    batches += [[e["name"]] for e in entries if e["kind"] != "cudnn"]
    rows = harness.run_batches(__file__, folder, out, [b for b in batches if b], budget, jobs, start)
    return report(rows, manifest, out, harness.device_name("cuda"), wall=time.time() - start)


def report(rows: list[dict], manifest: dict, out: Path, device: str, date: str | None = None,
           wall: float | None = None) -> int:  # fmt: skip
    """OUT/first_layers.json and .md: per problem each contender's kernel time, correctness, and the ratios."""
    by, plans = harness.rows_by_problem(rows), harness.manifest_plans(manifest)
    f = harness.cell
    lines = [f"# First layers and fused epilogues, explicit sm_80 kernel: {device}, {date or harness.now()}", "",
             "Kernel time a call by CUPTI (median of single calls 10 ms apart); inputs and D before 1 MiB of NaN; "
             "every result checked against float64.", "",
             "| problem | kind | plan (tile, split) | us | ok (max rel err) | vs cuDNN | vs plain |",
             "|---|---|---|---:|---|---:|---:|"]  # fmt: skip
    for name in by:
        base = name
        for kind in ("_scale", "_bilinear", "_accumulate"):
            base = base.removesuffix(kind)
        cudnn = by.get(base, {}).get("cudnn", {}).get("single_us")
        plain = by.get(base, {}).get("plain", {}).get("single_us")
        for kind, r in by[name].items():
            plan = plans.get((name, kind))
            tile = "-"
            if plan and plan.tile:
                tile = f"{plan.strategy.value} {harness.tile_split(plan)}"
            elif plan:
                tile = plan.strategy.value
            status = next((k for k in ("crashed", "skipped", "error") if k in r), None)
            ok = status or ("yes" if r.get("correct") else "WRONG")
            if r.get("max_rel_err") is not None:
                ok += f" ({r['max_rel_err']:.1e})"
            us = r.get("single_us") if r.get("correct") else None
            vs_c = cudnn / us if us and cudnn and kind != "cudnn" else None
            vs_p = us / plain if us and plain and kind not in ("plain", "cudnn") and name != base else None
            lines.append(f"| {name} | {kind} | {tile} | {f(r.get('single_us'))} | {ok} | {f(vs_c, '{:.2f}')} | "
                         f"{f(vs_p, '{:.3f}')} |")  # fmt: skip
    doc = {"device": device, "date": date or harness.now(), "wall_s": wall, "rows": rows,
           "refused": manifest["refused"]}  # fmt: skip
    lines += ["", "vs cuDNN: cuDNN's time / ours (above 1: ours faster); vs plain: ours with the epilogue / "
              "ours without.", ""] + harness.notes(manifest, rows, wall)  # fmt: skip
    return harness.write_tables(out, "first_layers", doc, lines)


def main(argv: list[str] | None = None) -> int:
    ap, sub, run = harness.command_line(__file__, __doc__, "unused", only=True)
    harness.add_batch_options(run, budget=150.0)
    run.add_argument("--only", nargs="*", help="only the contenders whose name holds one of these")
    harness.add_child_parser(sub, "run-one")
    return harness.main(ap, argv, compile=lambda a: compile_all(a.dir, a.only),
                        run=lambda a: run_all(a.dir, a.out, a.budget, a.jobs, a.only), report=report,
                        children={"run-one": lambda a: run_children(a.dir, a.names)})  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
