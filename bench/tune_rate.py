"""Tuning rate on a GPU (issue 39 item 2: >= 60 problems a minute a GPU): the measuring server
(``measure.run --server``) against the child-a-problem runner, on the same card in the same call.

    # here, on the CPU machine: problems spread over a suite, each with its candidates, into an artifact folder
    .venv/bin/python bench/tune_rate.py compile --suite zoo --count 20 --target sm_90a --max-plans 2 --no-iree \\
        --out .art/rate
    # on the GPU machine (wheels installed as /work/shared/device/README.md says)
    PYTHONPATH=/tmp/site:. python3 bench/tune_rate.py run .art/rate --out OUT [--classic 3] [--cudnn]

``compile``: every (len / count)-th problem of the suite in each type, the heuristic's plan, ``--max-plans``
neighbours and (unless ``--no-iree``) IREE's own forms, as ``convbw tune --compile-only`` builds them; prints the
folder's size (keep it under the 64 MiB a call carries).

``run``: every problem through the server (one process a GPU, tuning's settings: no cuDNN unless ``--cudnn``),
then the first ``--classic`` problems through the child-a-problem runner, both timed by the wall clock from the
call to the results. Writes OUT/tune_rate.json (the rates, problems a minute a GPU; verdict counts; how the two
paths' times of the same candidates compare) and OUT/tune_rate.md, and the server's results as OUT/server.json.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

GOAL = 60.0  # problems a minute a GPU (issue 39)


def _compile(args: argparse.Namespace) -> int:
    from convbw_mlir.dispatch.tune import compile_candidates
    from convbw_mlir.suites import load_suite

    problems = []
    for dtype in args.types.split(","):
        suite = load_suite(args.suite, dtype)
        step = max(1, len(suite) // args.count)
        problems += [(name, p, False) for name, p in suite[::step][: args.count]]
    compile_candidates(problems, args.target, args.out, max_workers=args.workers, max_plans=args.max_plans,
                       iree=not args.no_iree, progress=False)  # fmt: skip
    size = sum(f.stat().st_size for f in Path(args.out).rglob("*") if f.is_file())
    print(f"{len(problems)} problems for {args.target} in {args.out}: {size / 2**20:.1f} MiB")
    return 0


def _subset(folder: Path, count: int, tmp: Path) -> Path:
    """A manifest of ``folder``'s first ``count`` problems in ``tmp``, its kernels named by absolute path."""
    manifest = json.loads((folder / "manifest.json").read_text())
    entries = []
    for e in manifest["problems"][:count]:
        cont = {
            n: r | {k: str(folder / r[k]) for k in ("vmfb", "launch") if r.get(k)} for n, r in e["contenders"].items()
        }
        entries.append(e | {"contenders": cont})
    (tmp / "manifest.json").write_text(json.dumps(manifest | {"problems": entries}))
    return tmp


def _timed(folder: Path, **kw: Any) -> tuple[dict[str, Any], float]:
    from convbw_mlir.dispatch.tune import NUMPY_MAX_FLOPS
    from convbw_mlir.measure.run import run_manifest

    t0 = time.monotonic()  # tuning's setting: numpy's whole reference where it takes about a second
    results = run_manifest(folder, devices="all", numpy_max_flops=NUMPY_MAX_FLOPS, **kw)
    return results, time.monotonic() - t0


def _counts(results: dict[str, Any]) -> dict[str, int]:
    return dict(Counter(c.get("status") for r in results["problems"] for c in r["contenders"].values()))


def _agreement(served: dict[str, Any], classic: dict[str, Any]) -> dict[str, Any]:
    """Server / runner time of each candidate both timed correct: by ``kernel_s`` where both have it, else
    ``median_s``; and the candidates whose verdicts differ."""
    by_key = {r["key"]: r for r in served["problems"]}
    ratios: dict[str, list[float]] = {"kernel_s": [], "median_s": []}
    differ = []
    for row in classic["problems"]:
        for name, c in row["contenders"].items():
            s = by_key[row["key"]]["contenders"].get(name, {})
            if s.get("status") != c.get("status"):
                differ.append(f"{row['key']} {name}: server {s.get('status')}, runner {c.get('status')}")
            elif c.get("status") == "ok" and "median_s" in c:
                metric = "kernel_s" if "kernel_s" in c and "kernel_s" in s else "median_s"
                ratios[metric].append(s[metric] / c[metric])
    out: dict[str, Any] = {"verdicts_differ": differ}
    for metric, xs in ratios.items():
        if xs:
            gm = math.exp(statistics.fmean(math.log(x) for x in xs))
            near = sum(abs(x - 1) <= 0.05 for x in xs)
            out[metric] = {"n": len(xs), "geomean": gm, "min": min(xs), "max": max(xs), "within_5pct": near}
    return out


def _run(args: argparse.Namespace) -> int:
    folder, out = Path(args.folder).resolve(), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    served, wall = _timed(folder, use_torch=args.cudnn, server=True)
    gpus = served["server"]["devices"]
    report: dict[str, Any] = {
        "device": served["device"], "target": served["target"], "date": time.strftime("%Y-%m-%d"), "gpus": gpus,
        "server": {"problems": len(served["problems"]), "wall_s": wall, "counts": _counts(served),
                   "problems_per_minute_per_gpu": 60 * len(served["problems"]) / wall / gpus,
                   "protocol": served["server"]},
    }  # fmt: skip
    (out / "server.json").write_text(json.dumps(served, indent=1) + "\n")
    if args.classic:
        with tempfile.TemporaryDirectory(prefix="tune-rate-") as tmp:
            classic, cwall = _timed(_subset(folder, args.classic, Path(tmp)), use_torch=args.cudnn)
        n = len(classic["problems"])
        report["runner"] = {"problems": n, "wall_s": cwall, "counts": _counts(classic),
                            "problems_per_minute_per_gpu": 60 * n / cwall / gpus}  # fmt: skip
        report["agreement"] = _agreement(served, classic)
    (out / "tune_rate.json").write_text(json.dumps(report, indent=1) + "\n")
    s = report["server"]
    lines = [f"# Tuning rate: {report['device']}, {report['target']}, {report['date']}", "",
             f"- server: {s['problems']} problems in {s['wall_s']:.1f} s on {gpus} GPU(s): "
             f"**{s['problems_per_minute_per_gpu']:.1f} problems a minute a GPU** (goal {GOAL:g}); "
             f"verdicts {s['counts']}"]  # fmt: skip
    if "runner" in report:
        r, a = report["runner"], report["agreement"]
        lines.append(f"- child-a-problem runner: {r['problems']} problems in {r['wall_s']:.1f} s: "
                     f"{r['problems_per_minute_per_gpu']:.1f} a minute a GPU; verdicts {r['counts']}")  # fmt: skip
        for metric in ("kernel_s", "median_s"):
            if metric in a:
                m = a[metric]
                lines.append(f"- server / runner {metric} over {m['n']} candidates: geomean {m['geomean']:.3f}, "
                             f"{m['min']:.3f}-{m['max']:.3f}, {m['within_5pct']} within 5%")  # fmt: skip
        lines += [f"- verdicts differ: {d}" for d in a["verdicts_differ"]]
    (out / "tune_rate.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    comp = sub.add_parser("compile", help="build the candidates of problems spread over a suite (CPU machine)")
    comp.add_argument("--suite", default="zoo")
    comp.add_argument("--count", type=int, default=20, help="problems a type (default 20)")
    comp.add_argument("--types", default="f16")
    comp.add_argument("--target", default="sm_90a")
    comp.add_argument("--max-plans", type=int, default=2, help="plan neighbours beside the heuristic's (default 2)")
    comp.add_argument("--no-iree", action="store_true", help="leave IREE's own forms out")
    comp.add_argument("--workers", type=int, default=2)
    comp.add_argument("--out", required=True)
    run = sub.add_parser("run", help="time them through the server and the runner (GPU machine)")
    run.add_argument("folder")
    run.add_argument("--out", required=True)
    run.add_argument("--classic", type=int, default=3, help="problems also through the child-a-problem runner")
    run.add_argument("--cudnn", action="store_true", help="cuDNN as a contender too (tuning leaves it out)")
    args = ap.parse_args(argv)
    if getattr(args, "count", 1) < 1 or getattr(args, "classic", 0) < 0:
        print("error: --count: expected >= 1 and --classic >= 0", file=sys.stderr)
        return 1
    return _compile(args) if args.cmd == "compile" else _run(args)


if __name__ == "__main__":
    sys.exit(main())
