"""Every AMD form x every dense suite problem through the emulator (``make emulate-amd``), against float64.

    .venv/bin/python tests/emulate_amd.py [--targets gfx942,gfx1100,gfx1200] [--layouts 4,2]
        [--dtypes f16,bf16] [--batch 1|0] [--only NAME,...]

The problems are bench/isa_explicit.py's (the dense suite the H100 run measured), each at ``--batch``
images (default 1: the same M and N tiles, filter, stride, dilation, padding and ragged edges, a
reduction the CPU can emulate), in each of ``--layouts`` (4: NGCHW/GKCYX/NGKHW as the suite has it;
2: the same problem in NHWGC/GKYXC/NHWGK) and ``--dtypes`` (dW in the input type), with the plan the
kernel's policy decides for it. Only the corner workgroups run (first and last M and N tile, every group
and split): that is where the ragged edges are. A problem the plan refuses is counted as refused, with
its reason; the rest must match float64 (max error relative to the largest entry under 2e-3 for f16 dW,
8e-3 for bf16: its rounding is 2^-8) with each computed output stored once.
Exit code 1 if any problem is wrong or fails.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from amd_emulator import emulate

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", default="gfx942,gfx1100,gfx1200")
    ap.add_argument("--layouts", default="4,2", help="ckProfiler layout codes: 4 (NGCHW) and/or 2 (NHWGC)")
    ap.add_argument("--dtypes", default="f16,bf16", help="input (and dW) element types")
    ap.add_argument("--batch", type=int, default=1, help="images at most (0: the suite's own)")
    ap.add_argument("--only", default="", help="comma-separated problem names (default: all)")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT / "bench"))
    from isa_explicit import dense_problems

    from convbw_mlir.plan import PlanError

    problems = dense_problems()
    if args.only:
        problems = {k: v for k, v in problems.items() if k in args.only.split(",")}
    counts = {"ok": 0, "refused": 0, "wrong": 0, "failed": 0}
    tolerance = {"f16": 2e-3, "bf16": 8e-3}
    cases = [(name, layout, dtype, full) for name, full in problems.items() for layout in args.layouts.split(",")
             for dtype in args.dtypes.split(",")]  # fmt: skip
    for name, layout, dtype, full in cases:
        p = full.with_(batch=min(args.batch, full.batch)) if args.batch else full
        p = p.with_(layout=int(layout), dtype=dtype, dw_dtype=dtype)
        name = f"{name} L{layout} {dtype}"
        for target in args.targets.split(","):
            t0 = time.time()
            try:
                e = emulate(p, target, corners=True)
            except PlanError as err:
                counts["refused"] += 1
                print(f"refused {target:8} {name}: {str(err)[:150]}", flush=True)
                continue
            except Exception as err:  # noqa: BLE001 - a failure is a row of the table, the run goes on
                counts["failed"] += 1
                print(f"FAILED  {target:8} {name}: {type(err).__name__}: {str(err)[:200]}", flush=True)
                continue
            done = ~np.isnan(e.got)
            once = bool((e.counts[e.counts > 0] == 1).all())
            ok = e.error() < tolerance[dtype] and once
            counts["ok" if ok else "wrong"] += 1
            print(f"{'ok' if ok else 'WRONG':7} {target:8} {name}: error {e.error():.1e}, {int(done.sum())} of "
                  f"{done.size} entries, splits {e.shape.splits}, stored once: {once}, {time.time() - t0:.0f} s",
                  flush=True)  # fmt: skip
    print("counts: " + ", ".join(f"{k} {v}" for k, v in counts.items()), flush=True)
    return 1 if counts["wrong"] or counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
