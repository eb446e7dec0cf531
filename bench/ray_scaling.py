"""Build throughput of the dispatcher's compiles with 1 and 2 workers, local engine and Ray, and the N-machine estimate.

    python bench/ray_scaling.py --suite seeds --target sm_80 --out bench/results/ray_scaling_<date>
    python bench/ray_scaling.py --smoke --out /tmp/ray_smoke          # two tiny host problems (a check, not a number)

Every configuration (engine x workers) compiles the same (problem, variant) list into a fresh, empty kernel cache
(no hits), in the order declared; a local Ray of ``workers`` CPUs is started for each Ray configuration (its
start is timed apart). Then, on a local Ray of 2 CPUs, the overhead of a task that does nothing (scheduling and
result return) is timed over :data:`EMPTY_TASKS` tasks. ``OUT.json`` holds the measurements, ``OUT.md`` the table
and the estimate of :func:`estimate` for N machines (docs/dispatch.md#ray has the model).

The numbers mean something only on a machine that does nothing else: run it at a quiet moment.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CONFIGS = (("local", 1), ("local", 2), ("ray", 1), ("ray", 2))
EMPTY_TASKS = 200
SMOKE = ["2 1 2 8 8 3 3 6 6 1 1 1 1 1 1 1 1", "2 1 2 8 16 1 1 5 5 1 1 1 1 0 0 0 0"]
MACHINES = (1, 2, 4, 8, 16, 32, 64)


def _noop(i: int) -> int:
    return i


def measure(problems: list, target: str, max_plans: int, log: Any = print) -> dict[str, Any]:
    """Build the candidates of ``problems`` once per configuration of :data:`CONFIGS`; the measurements."""
    from convbw_mlir.dispatch import KernelCache, Registry

    runs = []
    for engine, workers in CONFIGS:
        with tempfile.TemporaryDirectory(prefix="convbw-ray-scaling-") as tmp:
            reg = Registry(target, KernelCache(Path(tmp) / "cache"))
            for _, p in problems:
                reg.declare_candidates(p, max_plans=max_plans)
            start = 0.0
            if engine == "ray":
                import ray

                t0 = time.perf_counter()
                ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False, configure_logging=False)
                start = time.perf_counter() - t0
            try:
                report = reg.build(max_workers=workers, progress=False, engine=engine)
            finally:
                if engine == "ray":
                    ray.shutdown()
        ok = [r for r in report.results if r.ok]
        sizes = [len(r.op.vmfb) for r in ok]
        runs.append({"engine": engine, "workers": workers, "kernels": len(report.results), "built": len(ok),
                     "wall_s": report.wall_s, "ray_start_s": start,
                     "task_s": [r.seconds for r in report.results], "vmfb_bytes": sizes,
                     "processes": len({r.worker for r in report.results})})  # fmt: skip
        log(f"{engine} x{workers}: {len(report.results)} kernels in {report.wall_s:.1f} s")
    return {"runs": runs, "ray_empty_task_s": _empty_task_overhead(), "target": target, "max_plans": max_plans,
            "problems": [n for n, _ in problems], "host": f"{platform.node()} ({os.cpu_count()} CPUs)",
            "date": str(datetime.date.today())}  # fmt: skip


def _empty_task_overhead(workers: int = 2) -> float:
    """Seconds a Ray task costs beyond its work: :data:`EMPTY_TASKS` empty tasks on ``workers`` CPUs, wall / count
    x workers (each CPU runs its share back to back)."""
    import ray

    ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        noop = ray.remote(num_cpus=1)(_noop)
        ray.get([noop.remote(i) for i in range(2 * workers)])  # the workers started
        t0 = time.perf_counter()
        ray.get([noop.remote(i) for i in range(EMPTY_TASKS)])
        return (time.perf_counter() - t0) / EMPTY_TASKS * workers
    finally:
        ray.shutdown()


def summary(data: dict[str, Any]) -> dict[str, Any]:
    """The model's inputs from the measurements: per-task compile seconds (one worker, local: uncontended),
    the speed-ups from 1 to 2 workers, Ray's start and per-task overhead, the mean artifact size."""
    runs = {(r["engine"], r["workers"]): r for r in data["runs"]}
    one = runs[("local", 1)]
    out: dict[str, Any] = {
        "task_s": statistics.mean(one["task_s"]) if one["task_s"] else math.nan,
        "ray_task_overhead_s": data["ray_empty_task_s"],
        "ray_start_s": max(r["ray_start_s"] for r in data["runs"]),
        "vmfb_bytes": statistics.mean(one["vmfb_bytes"]) if one["vmfb_bytes"] else 0.0,
        "kernels": one["kernels"],
    }
    for engine in ("local", "ray"):
        a, b = runs[(engine, 1)], runs[(engine, 2)]
        out[f"{engine}_speedup_2"] = a["wall_s"] / b["wall_s"]
        out[f"{engine}_throughput"] = {w: runs[(engine, w)]["kernels"] / runs[(engine, w)]["wall_s"] for w in (1, 2)}
    out["efficiency"] = out["ray_speedup_2"] / 2  # a second CPU's share of a first's, on one machine
    return out


def estimate(kernels: int, task_s: float, overhead_s: float, start_s: float, vmfb_bytes: float, machines: int,
             cpus: int, efficiency: float = 1.0, bandwidth: float = 1.25e9) -> float:  # fmt: skip
    """Wall seconds to build ``kernels`` on ``machines`` of ``cpus`` CPUs each (docs/dispatch.md#ray):

        T(N) = start + max(K * (t + o) / (N * c * e), K * s / B)

    compute (each task ``t`` plus Ray's overhead ``o``, spread over N*c CPUs at efficiency ``e``) against the
    artifacts' transfer to the driver (``s`` bytes each through its link of ``B`` bytes/s; 10 Gbit/s default),
    whichever bounds; ``start`` is Ray's start (or joining the cluster).
    """
    compute = kernels * (task_s + overhead_s) / (machines * cpus * efficiency)
    transfer = kernels * vmfb_bytes / bandwidth
    return start_s + max(compute, transfer)


def report(data: dict[str, Any], cpus: int | None = None, bandwidth: float = 1.25e9) -> str:
    """Markdown: the measured table, the model's inputs, and the estimate for N machines of ``cpus`` CPUs."""
    s = summary(data)
    cpus = cpus or int(data["host"].rsplit("(", 1)[1].split()[0])
    lines = [f"# Build throughput: local engine and Ray ({data['host']}, {data['date']})", "",
             f"{s['kernels']} kernels ({len(data['problems'])} problems x their candidates, max_plans "
             f"{data['max_plans']}) for {data['target']}, each configuration into an empty cache.", "",
             "| engine | workers | kernels | built | wall s | kernels/s | speed-up 1 -> 2 | processes |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in data["runs"]:
        up = f"{s[r['engine'] + '_speedup_2']:.2f}x" if r["workers"] == 2 else ""
        lines.append(f"| {r['engine']} | {r['workers']} | {r['kernels']} | {r['built']} | {r['wall_s']:.1f} "
                     f"| {r['kernels'] / r['wall_s']:.3f} | {up} | {r['processes']} |")  # fmt: skip
    lines += ["", "Model inputs (docs/dispatch.md#ray):", "",
              f"- t, a task's compile (local, 1 worker, mean): {s['task_s']:.2f} s",
              f"- o, Ray's overhead a task (empty tasks): {s['ray_task_overhead_s'] * 1e3:.2f} ms",
              f"- Ray's start: {s['ray_start_s']:.1f} s",
              f"- s, an artifact (mean vmfb): {s['vmfb_bytes'] / 1e3:.1f} kB; B, the driver's link: "
              f"{bandwidth * 8 / 1e9:.0f} Gbit/s (assumed)",
              f"- e, efficiency of a machine's CPUs (Ray's speed-up 1 -> 2 / 2): {s['efficiency']:.2f}", "",
              f"| machines ({cpus} CPUs each) | est. wall s, {s['kernels']} kernels | est. wall s, 10,000 kernels "
              "| speed-up over 1 machine |", "|---:|---:|---:|---:|"]  # fmt: skip
    args = (s["task_s"], s["ray_task_overhead_s"], s["ray_start_s"], s["vmfb_bytes"])
    base = estimate(10_000, *args, 1, cpus, s["efficiency"], bandwidth)
    for n in MACHINES:
        here = estimate(s["kernels"], *args, n, cpus, s["efficiency"], bandwidth)
        big = estimate(10_000, *args, n, cpus, s["efficiency"], bandwidth)
        lines.append(f"| {n} | {here:.1f} | {big:.0f} | {base / big:.1f}x |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="ray_scaling.py", description=__doc__.splitlines()[0])
    ap.add_argument("--suite", action="append", help="shipped suite name or .tsv (default: seeds)")
    ap.add_argument("--target", default="sm_80")
    ap.add_argument("--filter", default="", help="only problems whose name contains this")
    ap.add_argument("--limit", type=int, default=None, help="the first N problems only")
    ap.add_argument("--max-plans", type=int, default=2, help="plan variants per problem beside the heuristic's")
    ap.add_argument("--cpus", type=int, default=None, help="CPUs a machine in the estimate (default: this one's)")
    ap.add_argument("--smoke", action="store_true", help="two tiny host problems, one plan each: a check of the script")
    ap.add_argument("--out", type=Path, required=True, help="OUT.json and OUT.md are written")
    args = ap.parse_args(argv)
    from convbw_mlir.problem import ConvBwdWeightProblem
    from convbw_mlir.suites import load_suite

    if args.smoke:
        problems = [(f"smoke{i}", ConvBwdWeightProblem.from_ck(ck)) for i, ck in enumerate(SMOKE)]
        target, max_plans = "host", 1
    else:
        problems = [(n, p) for s in args.suite or ["seeds"] for n, p in load_suite(s) if args.filter in n]
        target, max_plans = args.target, args.max_plans
    problems = problems[: args.limit]
    if not problems:
        print("ray_scaling.py: error: no problems", file=sys.stderr)
        return 1
    data = measure(problems, target, max_plans, log=lambda m: print(m, file=sys.stderr))
    data["summary"] = summary(data)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(data, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(report(data, args.cpus))
    print(f"wrote {args.out.with_suffix('.json')} and {args.out.with_suffix('.md')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
