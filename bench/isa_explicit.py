"""The explicit strategy's ISA matrix on AMD: every dense suite problem (the set bench/explicit_gemm.py
measures on the H100) compiled for gfx942 (MFMA), gfx1100 (RDNA 3 WMMA) and gfx1200 (RDNA 4 WMMA), each
in a child process; the table says whether it compiled, the matrix instructions, registers, LDS,
scratch, and the occupancy the ISA report computes next to the one the plan expects.

    .venv/bin/python bench/isa_explicit.py [--targets gfx942,gfx1100,gfx1200] [--jobs 2] [--out PATH.md]

No AMD GPU exists here: this is the whole evidence for those targets (docs/explicit-kernels.md).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

BENCH = Path(__file__).resolve().parent
TARGETS = ("gfx942", "gfx1100", "gfx1200")


def dense_problems() -> dict:
    """Name -> layout-4 problem: the G = 1 problems of the seeds and models suites, and ResNet-50's layers."""
    sys.path.insert(0, str(BENCH))
    from explicit_gemm import _conv_problems  # the H100 run's set, so the tables line up

    return _conv_problems()


def compile_one(name: str, problem, target: str) -> dict:
    """Plan, compile in a child and report one problem on one target (errors recorded, never raised)."""
    from convbw_mlir import compile_op
    from convbw_mlir.build.iree import CompileError
    from convbw_mlir.plan import PlanError, decide, explicit_tiling
    from convbw_mlir.targets import get_target

    row: dict = {"problem": name, "target": target, "ck": problem.to_ck() if hasattr(problem, "to_ck") else ""}
    try:
        plan = decide(problem, target, strategy="explicit")
    except PlanError as e:
        return row | {"status": "refused", "error": str(e)}
    t, tgt = explicit_tiling(plan), get_target(target)
    row |= {"intrinsic": plan.tile.intrinsic, "splits": plan.k_batch, "tile": f"{t.bm}x{t.bn}x{t.bk}",
            "planned_occupancy": t.planned_occupancy(tgt), "register_budget": t.register_budget(tgt)}  # fmt: skip
    try:
        op = compile_op(problem, target, plan=plan, isolate=True, cache=False)
    except CompileError as e:
        return row | {"status": "failed", "error": (str(e).strip().splitlines() or ["?"])[0][:200]}
    report = op.isa_report()
    k = report.main
    return row | {"status": "ok", "mma": k.mma, "vgpr": k.vgpr, "agpr": k.agpr, "lds": k.lds_bytes,
                  "scratch": report.scratch_bytes, "occupancy": k.occupancy, "limit": k.occupancy_limit,
                  "kernels": len(report.kernels)}  # fmt: skip


def table(rows: list[dict], targets: list[str]) -> str:
    lines = ["| problem | target | plan | compiles | matrix instructions (static) | VGPR+AGPR (budget) | LDS B "
             "| scratch B | occupancy: ISA / plan |", "|---|---|---|---|---|---:|---:|---:|---|"]  # fmt: skip
    for r in rows:
        plan = f"{r['tile']} {r['intrinsic']} split {r['splits']}" if "tile" in r else "-"
        if r["status"] != "ok":
            lines.append(f"| {r['problem']} | {r['target']} | {plan} | **{r['status']}**: {r['error']} | | | | | |")
            continue
        mma = ", ".join(f"{n} x{c}" for n, c in sorted(r["mma"].items())) or "**none**"
        regs = (r["vgpr"] or 0) + (r["agpr"] or 0)
        occ = f"{r['occupancy']} ({r['limit']}) / {r['planned_occupancy']}"
        mark = "" if r["occupancy"] == r["planned_occupancy"] else " **differs**"
        lines.append(f"| {r['problem']} | {r['target']} | {plan} | yes | {mma} | {regs} ({r['register_budget']}) "
                     f"| {r['lds']} | {r['scratch']} | {occ}{mark} |")  # fmt: skip
    summary = []
    for t in targets:
        mine = [r for r in rows if r["target"] == t]
        ok = [r for r in mine if r["status"] == "ok"]
        summary.append(
            f"- {t}: {len(ok)} of {len(mine)} compile; matrix instructions in {sum(bool(r['mma']) for r in ok)}; "
            f"scratch in {sum(r['scratch'] > 0 for r in ok)}; occupancy as planned in "
            f"{sum(r['occupancy'] == r['planned_occupancy'] for r in ok)}; "
            f"occupancy {sorted({r['occupancy'] for r in ok})}, VGPR+AGPR "
            f"{min(((r['vgpr'] or 0) + (r['agpr'] or 0) for r in ok), default=0)}-"
            f"{max(((r['vgpr'] or 0) + (r['agpr'] or 0) for r in ok), default=0)}"
        )
    return "\n".join(summary) + "\n\n" + "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", default=",".join(TARGETS))
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--only", nargs="*", default=None, help="problem names (default: all)")
    ap.add_argument("--out", default=f"bench/results/isa_explicit_{datetime.date.today().isoformat()}.md")
    ap.add_argument("--from-json", default=None, help="re-render the rows of an earlier run's .json")
    args = ap.parse_args(argv)
    targets = [t for t in args.targets.split(",") if t]
    if args.from_json:
        rows = json.loads(Path(args.from_json).read_text())
    else:
        problems = dense_problems()
        if args.only:
            problems = {n: p for n, p in problems.items() if n in args.only}
        jobs = [(n, p, t) for n, p in problems.items() for t in targets]
        with ThreadPoolExecutor(args.jobs) as pool:  # each compile is its own child: threads only wait
            rows = list(pool.map(lambda j: compile_one(*j), jobs))
    import iree.compiler

    version = getattr(iree.compiler, "__version__", "") or "3.13"
    head = (f"# Explicit strategy: AMD ISA matrix, {datetime.date.today().isoformat()}\n\n"
            f"`python bench/isa_explicit.py` (iree-base-compiler {version}); every problem compiled in its own "
            "child with `compile_op(strategy=explicit, isolate=True)`. No AMD GPU exists here: compiled, "
            "never run. Occupancy in waves a SIMD: the ISA report's (its limit) / the plan's "
            "(`CdnaTiling.planned_occupancy`: the LDS bound of two buffers and the wave slots; the budget is "
            "the most VGPR+AGPR that keep it).\n\n")  # fmt: skip
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    text = head + table(rows, targets)
    tmp = out.with_suffix(".md.tmp")
    tmp.write_text(text)
    tmp.replace(out)  # nothing half-written is left behind
    out.with_suffix(".json").write_text(json.dumps(rows, indent=1, default=str))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
