"""What a fused epilogue costs on the GPU: plain dW, the fused epilogues, and the unfused one.

    python bench/epilogue.py compile --suite seeds --target sm_80 --out .art-epi [--filter S]
    python bench/epilogue.py run .art-epi --out results.json        (GPU machine: runtime only)
    python bench/epilogue.py report results.json [--md table.md]

Per problem (f16 unless the suite says otherwise), four kernels, each ``(x, dy[, D]) -> dW``:

  * ``plain``: our pipeline, ``dW = x * dy``.
  * ``bilinear``: the same problem with ``Epilogue("bilinear", 2, 2)`` (D of dW's type), fused where
    dW is written (docs/epilogues.md).
  * ``accumulate``: ``dW += x * dy`` into the caller's buffer (D tied to the result).
  * ``unfused``: the plain kernel, then ``2 * dW + 2 * D`` as a kernel of its own (a
    ``util.optimization_barrier`` keeps IREE from fusing it): one more read and write of dW, what a
    user pays today with a separate elementwise op.

The runner runs each (problem, kernel) in its own child process (a CUDA fault poisons a process),
checks the first result against float64 on a sample of dW entries (with the epilogue applied, the
benchmark's own tolerance, :func:`convbw_mlir.measure.run.tolerance_rms`), then times it the benchmark's
way (:func:`convbw_mlir.runtime.time_calls`, device-resident arguments).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

from convbw_mlir.files import write_atomic
from convbw_mlir.measure.children import run_child
from convbw_mlir.problem import ConvBwdWeightProblem, Epilogue

__all__ = ["KINDS", "compile_problem", "epilogue_problem", "main", "unfused_text"]

KINDS = ("plain", "bilinear", "accumulate", "unfused")
ALPHA = BETA = 2.0  # CK's bilinear test values


def epilogue_problem(p: ConvBwdWeightProblem, kind: str) -> ConvBwdWeightProblem:
    """The problem a kernel kind computes (``unfused`` computes the bilinear one, in two kernels)."""
    if kind == "plain":
        return p.plain
    if kind == "accumulate":
        return p.with_(epilogue=Epilogue("accumulate", ALPHA, BETA))
    return p.with_(epilogue=Epilogue("bilinear", ALPHA, BETA))


def unfused_text(p: ConvBwdWeightProblem, target: str) -> str:
    """``f(x, dy, D) = 2 * conv_bwd_weight(x, dy) + 2 * D`` with the elementwise part a kernel of its own."""
    from convbw_mlir.dialects import convbw

    from convbw_mlir.build.compile import run_pipeline
    from convbw_mlir.builders import PARALLEL, generic
    from convbw_mlir.ir_imports import arith_d, func_d, ir, new_context, tensor_d, util_d
    from convbw_mlir.pipelines import for_target

    plain = p.plain
    with new_context() as ctx:
        loc = convbw.problem_location(plain)
        module = ir.Module.create(loc=loc)
        with ir.InsertionPoint(module.body), loc:
            x_t, dy_t, dw_t = (convbw.tensor_type(plain, t) for t in ("x", "dy", "dw"))
            fn = func_d.FuncOp(convbw.FUNC_NAME, ir.FunctionType.get([x_t, dy_t, dw_t], [dw_t]))
            block = fn.add_entry_block()
            with ir.InsertionPoint(block):
                x, dy, d = block.arguments
                dw = convbw.build_op(plain, x, dy, loc).result
                dw = util_d.OptimizationBarrierOp([dw_t], [dw]).results[0]  # its own dispatch, as a user's op
                f32, et = ir.F32Type.get(), dw_t.element_type
                ident = ir.AffineMap.get_identity(dw_t.rank)
                empty = tensor_d.EmptyOp(list(dw_t.shape), et).result

                @generic([dw, d], [empty], [ident] * 3, [PARALLEL] * dw_t.rank)
                def axpby(a: ir.Value, b: ir.Value, _out: ir.Value) -> ir.Value:
                    if et != f32:
                        a, b = arith_d.ExtFOp(f32, a).result, arith_d.ExtFOp(f32, b).result
                    two = arith_d.ConstantOp(f32, ir.FloatAttr.get(f32, ALPHA)).result
                    s = arith_d.AddFOp(arith_d.MulFOp(two, a).result, arith_d.MulFOp(two, b).result).result
                    return s if et == f32 else arith_d.TruncFOp(et, s).result

                func_d.ReturnOp([axpby])
        # codegen's plan, as the fused kernels get (the explicit kernel has no epilogue): the same main kernel
        run_pipeline(module, for_target(target, strategy="codegen"), ctx)
        return str(module)


def compile_problem(p: ConvBwdWeightProblem, target: str, folder: Path, key: str) -> dict[str, Any]:
    """Compile the four kernels of ``p`` into ``folder``; a record per kind (vmfb file or error)."""
    from convbw_mlir.build.compile import lowered_text
    from convbw_mlir.build.iree import CompileError, compile_module
    from convbw_mlir.pipelines import for_target

    records: dict[str, Any] = {}
    for kind in KINDS:
        try:
            q = epilogue_problem(p, kind)
            text = unfused_text(p, target) if kind == "unfused" else lowered_text(q, for_target(target))
            path = f"{key}.{kind}.vmfb"
            (folder / path).write_bytes(compile_module(text, target))
            records[kind] = {"ok": True, "vmfb": path, "problem": q.to_dict()}
        except (CompileError, ValueError) as e:
            records[kind] = {"ok": False, "error": (str(e).strip().splitlines() or ["error"])[0][:400]}
    return records


def _compile(args: argparse.Namespace) -> int:
    from convbw_mlir.build.isolate import call
    from convbw_mlir.files import atomic_directory, check_output
    from convbw_mlir.suites import load_suite

    try:
        check_output(args.out)  # before compiling: a folder of the user's is refused, not replaced
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    entries = []
    with atomic_directory(args.out) as out:
        for suite in args.suite:
            for name, p in load_suite(suite, args.type):
                if args.filter and not any(f in name for f in args.filter):
                    continue
                key = f"{name}.{p.dtype}"
                records = call(compile_problem, p, args.target, out, key, what=f"{key} for {args.target}")
                entries.append({"name": name, "key": key, "problem": p.to_dict(), "kernels": records})
                print(f"compiled {key}: {', '.join(k for k, r in records.items() if r['ok'])}", file=sys.stderr)
        manifest = {"target": args.target, "problems": entries}
        (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return 0


def _child(folder: Path, entry: dict, kind: str, driver: str) -> dict[str, Any]:
    """One kernel of one problem: check its first result against float64 on a sample, then time it."""
    from convbw_mlir.epilogues import random_d
    from convbw_mlir.measure.run import error_stats, sample_indices, tolerance_rms
    from convbw_mlir.reference import random_inputs, sample_reference
    from convbw_mlir.runtime import Kernel, time_calls

    rec = entry["kernels"][kind]
    q = ConvBwdWeightProblem.from_dict(rec["problem"])
    x, dy = random_inputs(q, seed=7)
    d = random_d(q, seed=8)  # unfused: q is the bilinear problem (computed in two kernels)
    kernel = Kernel((folder / rec["vmfb"]).read_bytes(), driver)
    args = [kernel.to_device(a) for a in (x, dy, *([d] if d is not None else []))]
    got = np.asarray(kernel(*args).to_host()).astype(np.float64).ravel()
    flat = sample_indices(q)
    idx = np.stack(np.unravel_index(flat, q.dw_shape), axis=1)
    exact = sample_reference(q, x, dy, idx, d)
    stats = error_stats(got[flat], exact, q.dw_dtype)
    tol = tolerance_rms(q, q.dw_dtype, stats["peak"])
    if kind == "unfused":  # dW is rounded to its type twice: before and after the separate epilogue
        tol += tolerance_rms(q, q.dw_dtype, stats["peak"]) - tolerance_rms(q, q.dw_dtype, 0.0)
    res: dict[str, Any] = {"error_rms": stats["error_rms"], "tolerance_rms": tol}
    if not np.isfinite(got[flat]).all() or stats["error_rms"] > tol:
        return res | {"status": "WRONG"}
    samples = time_calls(kernel, *args)  # accumulate keeps adding into D's buffer: the timing is the same
    return res | {"status": "ok", "median_s": statistics.median(samples), "n": len(samples)}


def _run(args: argparse.Namespace) -> int:
    folder = Path(args.folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    results = []
    for entry in manifest["problems"]:
        row: dict[str, Any] = {"name": entry["name"], "problem": entry["problem"]}
        for kind in KINDS:
            if not entry["kernels"][kind]["ok"]:
                row[kind] = {"status": "no kernel", "error": entry["kernels"][kind]["error"]}
                continue
            cmd = [sys.executable, str(Path(__file__).resolve()), "_child", str(folder), entry["key"], kind,
                   "--driver", args.driver]  # fmt: skip
            got = run_child(cmd, args.timeout)
            if got.returncode == 0 and got.row is not None:
                row[kind] = got.row
            else:
                last = (got.stderr.strip().splitlines() or ["?"])[-1][:400]
                why = last if got.returncode is not None else f"{got.ended}: {last}"
                row[kind] = {"status": "crashed", "error": why}
            print(f"{entry['key']} {kind}: {row[kind]}", file=sys.stderr, flush=True)
        results.append(row)
        # after each problem: a run cut short still leaves what it measured
        write_atomic(args.out, json.dumps({"target": manifest["target"], "results": results}, indent=1) + "\n")
    return 0


def report(results: dict[str, Any]) -> str:
    """The markdown table: microseconds per kernel, fused and unfused cost over plain, and the medians."""
    lines = [
        "| problem | plain us | bilinear us | accumulate us | unfused us | bilinear / plain | accumulate / plain"
        " | unfused / plain |",
        "|---|---|---|---|---|---|---|---|",
    ]
    ratios: dict[str, list[float]] = {"bilinear": [], "accumulate": [], "unfused": []}
    for row in results["results"]:
        times = {k: row[k].get("median_s") if row[k].get("status") == "ok" else None for k in KINDS}
        cells = [f"{times[k] * 1e6:.1f}" if times[k] else row[k].get("status", "?") for k in KINDS]
        rel = []
        for k in ("bilinear", "accumulate", "unfused"):
            if times[k] and times["plain"]:
                ratios[k].append(times[k] / times["plain"])
                rel.append(f"{times[k] / times['plain']:.3f}")
            else:
                rel.append("-")
        lines.append(f"| {row['name']} | " + " | ".join(cells + rel) + " |")
    med = [f"{statistics.median(v):.3f}" if v else "-" for v in ratios.values()]
    lines.append("| **median** | | | | | " + " | ".join(med) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python bench/epilogue.py", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compile")
    c.add_argument("--suite", action="append", required=True)
    c.add_argument("--target", default="sm_80")
    c.add_argument("--type", default="f16")
    c.add_argument("--filter", action="append", default=[], help="keep problems whose name contains this")
    c.add_argument("--out", required=True)
    r = sub.add_parser("run")
    r.add_argument("folder")
    r.add_argument("--out", required=True)
    r.add_argument("--driver", default="cuda")
    r.add_argument("--timeout", type=float, default=300)
    ch = sub.add_parser("_child")
    ch.add_argument("folder")
    ch.add_argument("key")
    ch.add_argument("kind", choices=KINDS)
    ch.add_argument("--driver", default="cuda")
    rep = sub.add_parser("report")
    rep.add_argument("results")
    rep.add_argument("--md")
    args = parser.parse_args(argv)
    if args.command == "compile":
        return _compile(args)
    if args.command == "run":
        return _run(args)
    if args.command == "_child":
        folder = Path(args.folder)
        manifest = json.loads((folder / "manifest.json").read_text())
        entry = next(e for e in manifest["problems"] if e["key"] == args.key)
        print(json.dumps(_child(folder, entry, args.kind, args.driver)))
        return 0
    text = report(json.loads(Path(args.results).read_text()))
    if args.md:
        Path(args.md).write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
