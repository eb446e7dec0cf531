"""Compile the heuristic's plan of every (or every k-th) problem of a suite for a target: counts, failures named.

    python bench/zoo_compile.py [--suite zoo] [--target sm_80] [--types f16] [--every 1] [--timeout 600] --out FILE.md

Each kernel in its own child process (the dispatcher's Registry: an IREE crash costs one problem), through
the kernel cache. Writes a markdown summary (and a .json beside it) with the problems that did not compile
and why.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--suite", default="zoo")
    ap.add_argument("--target", default="sm_80")
    ap.add_argument("--types", default="f16")
    ap.add_argument("--every", type=int, default=1, help="compile every k-th problem of the suite (default all)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds one compile may take (default 600)")
    ap.add_argument("--out", required=True, help="markdown summary; the .json lands beside it")
    args = ap.parse_args(argv)
    from convbw_mlir.dispatch.build import Registry
    from convbw_mlir.dispatch.variants import candidates
    from convbw_mlir.suites import load_suite

    reg = Registry(args.target)
    names = {}
    for dtype in args.types.split(","):
        for i, (name, p) in enumerate(load_suite(args.suite, dtype)):
            if i % args.every == 0:
                v = next(iter(candidates(p, args.target, max_plans=0)))  # the heuristic's plan comes first
                reg.declare(p, v)
                names[(p, v)] = f"{name}.{dtype}"
    t0 = time.monotonic()
    report = reg.build(max_workers=args.workers, timeout=args.timeout, progress=False)
    wall = time.monotonic() - t0
    failed = [(names[(r.problem, r.variant)], r.problem.to_ck(), r.error.splitlines()[0][:200] if r.error else "?")
              for r in report.results if not r.ok]  # fmt: skip
    kinds = Counter(f.split(":")[0] for _, _, f in failed)
    ok = len(report.results) - len(failed)
    lines = [f"# {args.suite}: the heuristic's plan compiled for {args.target} ({args.types}, every {args.every}, "
             f"at most {args.timeout:g} s a compile)",
             "", f"{ok} of {len(report.results)} compiled in {wall:.0f} s with {args.workers} workers "
             f"({sum(r.hit for r in report.results)} cache hits).", "", report.table(), ""]  # fmt: skip
    if failed:
        lines += ["| problem | ckProfiler | error |", "|---|---|---|"]
        lines += [f"| {n} | `{ck}` | {err.replace('|', '/')} |" for n, ck, err in failed]
        lines += ["", "errors by kind: " + ", ".join(f"{k}: {v}" for k, v in kinds.most_common())]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    summary = {"suite": args.suite, "target": args.target, "types": args.types, "every": args.every,
               "timeout_s": args.timeout, "kernels": len(report.results), "compiled": ok, "wall_s": wall,
               "failed": [{"name": n, "ck": ck, "error": e} for n, ck, e in failed]}  # fmt: skip
    out.with_suffix(".json").write_text(json.dumps(summary, indent=1) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
