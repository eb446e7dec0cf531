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

``phases RESULTS.json...``: the rate of ``dispatch.tune --server`` runs from their results files (problems over the
summed wall of every pass's server, a minute a GPU; the steady rate; the deadline's cut, from log.txt beside) and
their steps summed (``phase_summary``), a row a file and one for all.

``pass2 RESULTS.json...``: what pass 2 changed, by the gap between pass 1's fastest two (the evidence for
``dispatch.tune.PASS2_WITHIN``): problems re-timed, winners changed, and the loss of keeping pass 1's winner.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

GOAL = 60.0  # problems a minute a GPU (issue 39)


def _compile(args: argparse.Namespace) -> int:
    import os

    from convbw_mlir.dispatch.tune import compile_candidates
    from convbw_mlir.problem import ConvBwdWeightProblem
    from convbw_mlir.suites import load_suite

    if args.cubin:  # ptxas's cubins instead of PTX (convbw_mlir/build/cubin.py); the build's children inherit it
        from convbw_mlir.build import cubin

        os.environ[cubin.PTXAS_ENV] = cubin.ptxas(cubin.requested() or "1")
    problems = []
    if args.from_manifest:  # the problems of an earlier rate folder, in its order
        entries = json.loads(Path(args.from_manifest).read_text())["problems"][: args.count]
        problems = [(e["name"], ConvBwdWeightProblem.from_dict(e["problem"]), False) for e in entries]
    for dtype in args.types.split(",") if not args.from_manifest else ():
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


# the server's steps of a problem (measure.server's ``phases``), in the order they run; the parts of one
STEPS = ("prep_wait_s", "server_start_s", "inputs_s", "reference_s", "candidates_s", "cudnn_check_s", "timing_s",
         "free_s", "bookkeeping_s")  # fmt: skip
PARTS = ("server_imports_s", "server_torch_s", "server_cupti_s", "load_s", "copies_s", "checked_call_s", "check_s",
         "timing_wall_s")  # fmt: skip


def phase_summary(served: dict[str, Any]) -> dict[str, Any]:
    """Seconds of each step over the served problems: ``sum`` and ``median`` (of the problems that had it), and the
    candidates' loads one by one (``load_each``: n, median, max); ``measure_s`` sums the parent's time a problem."""
    rows = [r["phases"] for r in served["problems"] if "phases" in r]
    out: dict[str, Any] = {"problems": len(rows)}
    for key in ("measure_s", *STEPS, *PARTS):
        xs = [r[key] for r in rows if key in r]
        if xs:
            out[key] = {"sum": sum(xs), "median": statistics.median(xs), "n": len(xs)}
    loads = [s for r in rows for s in r.get("load_each_s", {}).values()]
    if loads:
        out["load_each"] = {"n": len(loads), "median": statistics.median(loads), "max": max(loads), "sum": sum(loads)}
    return out


def steady_rate(served: dict[str, Any], wall: float) -> dict[str, Any] | None:
    """The rate once each device's server is up: ``wall`` less the longest first start (a tuning run starts its
    servers once; a restart after a fault still counts), problems a minute a GPU; None without ``phases``."""
    first: dict[Any, float] = {}
    for r in served["problems"]:
        ph = r.get("phases")
        if ph is None:
            return None
        first.setdefault(r.get("device_index"), ph.get("server_start_s", 0.0))
    start = max(first.values(), default=0.0)
    n, gpus = len(served["problems"]), served["server"]["devices"]
    if not n or wall <= start:
        return None
    return {
        "first_start_s": start,
        "wall_s": wall - start,
        "problems_per_minute_per_gpu": 60 * n / (wall - start) / gpus,
    }


def _run(args: argparse.Namespace) -> int:
    folder, out = Path(args.folder).resolve(), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    served, wall = _timed(folder, use_torch=args.cudnn, server=True)
    gpus = served["server"]["devices"]
    report: dict[str, Any] = {
        "device": served["device"], "target": served["target"], "date": time.strftime("%Y-%m-%d"), "gpus": gpus,
        "server": {"problems": len(served["problems"]), "wall_s": wall, "counts": _counts(served),
                   "problems_per_minute_per_gpu": 60 * len(served["problems"]) / wall / gpus,
                   "steady": steady_rate(served, wall),
                   "protocol": served["server"], "phases": phase_summary(served)},
        "env": {k: os.environ.get(k) for k in ("CUDA_CACHE_PATH", "CUDA_CACHE_DISABLE", "CUDA_CACHE_MAXSIZE")},
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
    if s["steady"]:
        st = s["steady"]
        lines.append(f"- once the server is up (its first start, {st['first_start_s']:.1f} s, is a tuning run's "
                     f"once): {st['problems_per_minute_per_gpu']:.1f} problems a minute a GPU")  # fmt: skip
    ph = s["phases"]
    if ph.get("problems"):
        parts = ", ".join(f"{k[:-2]} {ph[k]['sum']:.2f}" for k in STEPS if k in ph)
        lines.append(f"- where the server's time went (s, summed over {ph['problems']} problems): {parts}")
        if "load_each" in ph:
            le = ph["load_each"]
            lines.append(f"- candidate loads: {le['n']}, {le['sum']:.2f} s in all, median {1e3 * le['median']:.1f} ms, "
                         f"max {1e3 * le['max']:.1f} ms")  # fmt: skip
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


def _compare(args: argparse.Namespace) -> int:
    """The rates, steps and kernel times of several ``run`` outputs (the first is the base of the ratios)."""
    runs = []
    for d in args.outs:
        folder = Path(d)
        if not (folder / "tune_rate.json").is_file():
            print(f"skip {d}: no tune_rate.json (that run did not finish)")
            continue
        runs.append((folder.name, json.loads((folder / "tune_rate.json").read_text()),
                     json.loads((folder / "server.json").read_text())))  # fmt: skip
    if not runs:
        print("error: no finished run to compare", file=sys.stderr)
        return 1
    base_name, _, base = runs[0]
    times = {(r["key"], n): c for r in base["problems"] for n, c in r["contenders"].items() if c.get("status") == "ok"}
    keys = ("server_start_s", "reference_s", "candidates_s", "load_s", "timing_s", "bookkeeping_s", "prep_wait_s")
    lines = ["| run | problems | problems/min/GPU | measure s | " + " | ".join(k[:-2] for k in keys) + " |",
             "|---|---:|---:|---:|" + "---:|" * len(keys)]  # fmt: skip
    out: dict[str, Any] = {"base": base_name, "runs": {}}
    for name, report, served in runs:
        s, ph = report["server"], report["server"].get("phases", {})
        cells = [f"{ph[k]['sum']:.2f}" if k in ph else "-" for k in keys]
        measure = ph.get("measure_s", {}).get("sum", float("nan"))
        lines.append(f"| {name} | {s['problems']} | {s['problems_per_minute_per_gpu']:.1f} | {measure:.2f} | "
                     + " | ".join(cells) + " |")  # fmt: skip
        ratios = {"kernel_s": [], "median_s": []}
        for r in served["problems"]:
            for n, c in r["contenders"].items():
                b = times.get((r["key"], n))
                if b is None or c.get("status") != "ok":
                    continue
                for metric in ratios:
                    if metric in b and metric in c:
                        ratios[metric].append(c[metric] / b[metric])
        entry: dict[str, Any] = {"rate": s["problems_per_minute_per_gpu"], "phases": ph}
        for metric, xs in ratios.items():
            if xs:
                gm = math.exp(statistics.fmean(math.log(x) for x in xs))
                entry[metric] = {"n": len(xs), "geomean": gm, "min": min(xs), "max": max(xs),
                                 "within_3pct": sum(abs(x - 1) <= 0.03 for x in xs)}  # fmt: skip
        out["runs"][name] = entry
    lines.append("")
    for name, e in out["runs"].items():
        if name != base_name and "kernel_s" in e:
            k = e["kernel_s"]
            lines.append(f"- {name} / {base_name} kernel_s over {k['n']} candidates: geomean {k['geomean']:.3f}, "
                         f"{k['min']:.3f}-{k['max']:.3f}, {k['within_3pct']} within 3%")  # fmt: skip
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    Path(args.out).with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def _prep(args: argparse.Namespace) -> int:
    """Seconds of the server's CPU preparation of each problem (x, dy, float64 sample and whole reference where
    cheap: ``measure.server.prepare``), one after the other in this process: what the prep workers carry."""
    import tempfile

    from convbw_mlir.dispatch.tune import NUMPY_MAX_FLOPS
    from convbw_mlir.measure.server import prepare
    from convbw_mlir.problem import ConvBwdWeightProblem

    rows = []
    for e in json.loads((Path(args.folder) / "manifest.json").read_text())["problems"]:
        p = ConvBwdWeightProblem.from_dict(e["problem"])
        with tempfile.TemporaryDirectory() as d:
            t0 = time.perf_counter()
            prepare(e["problem"], d, NUMPY_MAX_FLOPS)
            rows.append({"key": e["key"], "prep_s": time.perf_counter() - t0, "gflop": p.flops / 1e9,
                         "whole_reference": p.flops <= NUMPY_MAX_FLOPS})  # fmt: skip
        print(
            f"{rows[-1]['prep_s']:7.2f} s {rows[-1]['gflop']:8.2f} GFLOP whole={rows[-1]['whole_reference']} {e['key']}"
        )
    out = {"cpus": os.cpu_count(), "load_average": os.getloadavg(), "numpy_max_flops": NUMPY_MAX_FLOPS,
           "problems": rows, "sum_s": sum(r["prep_s"] for r in rows)}  # fmt: skip
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(
        f"{len(rows)} problems: {out['sum_s']:.2f} s in all on {out['cpus']} CPUs (load {out['load_average'][0]:.1f})"
    )
    return 0


def _deadline_cut(results: Path) -> int:
    """Problems the tuner's ``--deadline`` left untimed: its "deadline: KEY not timed" lines in log.txt beside."""
    log = results.parent / "log.txt"
    if not log.is_file():
        return 0
    return sum(
        line.startswith("deadline: ") and line.rstrip().endswith(" not timed") for line in log.read_text().splitlines()
    )


def tuner_rate(results: dict[str, Any], cut: int = 0) -> dict[str, Any]:
    """The rate of one ``dispatch.tune --server`` results.json: its problems over the summed wall of its server
    runs (``server``: pass 1, pass 2, a phase each), problems a minute a GPU; ``steady`` leaves out each device's
    first server start (``steady_rate``; pass 2's start is not in ``phases`` and stays in); the steps summed
    (``phase_summary``: pass 1's rows, the only ones that carry ``phases``); ``cut``: left untimed by the deadline."""
    runs = results.get("server") or []
    if isinstance(runs, dict):
        runs = [runs]
    if not runs:
        raise ValueError("results: no 'server' record (not a --server tuning run)")
    gpus = max(r.get("devices", 1) for r in runs)
    wall = sum(r["wall_s"] for r in runs)
    n = len(results["problems"])
    served = {"problems": results["problems"], "server": {"devices": gpus}}
    return {
        "problems": n, "cut": cut, "gpus": gpus, "wall_s": wall, "pass_walls_s": [r["wall_s"] for r in runs],
        "problems_per_minute_per_gpu": 60 * n / wall / gpus if wall > 0 else float("nan"),
        "steady": steady_rate(served, wall), "phases": phase_summary(served),
    }  # fmt: skip


def _phases(args: argparse.Namespace) -> int:
    """The rate and where the time went of tuner results files: a row a file, then the steps summed over all."""
    rows = []
    for name in args.results:
        path = Path(name)
        try:
            rows.append((path, tuner_rate(json.loads(path.read_text()), _deadline_cut(path))))
        except (OSError, ValueError, KeyError) as e:
            print(f"error: {name}: {e}", file=sys.stderr)
            return 1
    steps = [k for k in STEPS if any(k in r["phases"] for _, r in rows)]
    lines = ["| results | problems | cut | wall s | passes s | problems/min/GPU | steady | measure s | "
             + " | ".join(k[:-2] for k in steps) + " | load |",
             "|---|---:|---:|---:|---|---:|---:|---:|" + "---:|" * (len(steps) + 1)]  # fmt: skip
    total: dict[str, float] = {}
    for path, r in rows:
        ph = r["phases"]
        label = str(path.parent)
        steady = r["steady"]["problems_per_minute_per_gpu"] if r["steady"] else float("nan")
        cells = [f"{ph[k]['sum']:.1f}" if k in ph else "-" for k in (*steps, "load_s")]
        lines.append(f"| {label} | {r['problems']} | {r['cut']} | {r['wall_s']:.1f} | "
                     f"{' + '.join(f'{w:.1f}' for w in r['pass_walls_s'])} | {r['problems_per_minute_per_gpu']:.1f} | "
                     f"{steady:.1f} | {ph.get('measure_s', {}).get('sum', float('nan')):.1f} | "
                     + " | ".join(cells) + " |")  # fmt: skip
        for k in ("measure_s", *steps, "load_s"):
            if k in ph:
                total[k] = total.get(k, 0.0) + ph[k]["sum"]
        total["wall_s"] = total.get("wall_s", 0.0) + r["wall_s"] * r["gpus"]
        total["problems"] = total.get("problems", 0.0) + r["problems"]
        total["cut"] = total.get("cut", 0.0) + r["cut"]
    if total.get("wall_s"):
        rate = 60 * total["problems"] / total["wall_s"]
        sums = " | ".join(f"{total[k]:.1f}" if k in total else "-" for k in (*steps, "load_s"))
        lines.append(f"| **all** | {total['problems']:.0f} | {total['cut']:.0f} | {total['wall_s']:.1f} | | "
                     f"**{rate:.1f}** | | {total.get('measure_s', float('nan')):.1f} | {sums} |")  # fmt: skip
        pass1 = total.get("measure_s", 0.0)
        if pass1 > 0:
            share = sorted(((total[k] / pass1, k) for k in steps if k in total), reverse=True)
            lines += ["", f"- all: {rate:.1f} problems a minute a GPU (goal {GOAL:g}); pass 1's steps, share of its "
                      "measure_s: " + ", ".join(f"{k[:-2]} {100 * f:.0f}%" for f, k in share)]  # fmt: skip
    print("\n".join(lines))
    if args.out:
        Path(args.out).write_text(json.dumps({str(p): r for p, r in rows} | {"all": total}, indent=1) + "\n")
    return 0


BANDS = (0.01, 0.02, 0.03, 0.05, 0.10, 0.25)  # upper edges of the pass-1 gap bands ``pass2`` reports


def pass2_effect(rows: list[dict[str, Any]], bands: tuple[float, ...] = BANDS) -> list[dict[str, Any]]:
    """By the gap between pass 1's fastest two (second / first - 1, in ``bands``): the problems pass 2 re-timed
    both of, how many of them changed winner (both passes' mean, as the tuner decides), and the loss of keeping
    pass 1's winner (its mean time over the new winner's, minus 1: max and mean)."""
    from convbw_mlir.dispatch.tune import _metric, _ranked

    seen: list[tuple[float, float]] = []
    for row in rows:
        p2 = {n: r for n, r in (row.get("pass2") or {}).items() if r.get("status") == "ok"}
        m = _metric(row["contenders"], p2)
        ranked = _ranked(row["contenders"], m)
        if len(ranked) < 2 or not {ranked[0][1], ranked[1][1]} <= p2.keys():
            continue
        (t1, a), (t2, b) = ranked[:2]
        mean = {n: (t + p2[n][m]) / 2 for t, n in ranked[:2]}
        seen.append((t2 / t1 - 1, mean[a] / min(mean.values()) - 1))
    out, low = [], 0.0
    for high in bands:
        band = [loss for gap, loss in seen if low <= gap < high]
        out.append({"gap": [low, high], "retimed": len(band), "changed": sum(loss > 0 for loss in band),
                    "max_loss": max(band, default=0.0),
                    "mean_loss": statistics.fmean(band) if band else 0.0})  # fmt: skip
        low = high
    return out


def _pass2(args: argparse.Namespace) -> int:
    rows = []
    for name in args.results:
        try:
            rows += json.loads(Path(name).read_text())["problems"]
        except (OSError, ValueError, KeyError) as e:
            print(f"error: {name}: {e}", file=sys.stderr)
            return 1
    bands = pass2_effect(rows)
    lines = [f"{len(rows)} problems; pass 2 re-timed both of pass 1's fastest two on "
             f"{sum(b['retimed'] for b in bands)}", "",
             "| pass-1 gap | re-timed | winner changed | max loss of pass 1's winner | mean loss |",
             "|---|---:|---:|---:|---:|"]  # fmt: skip
    for b in bands:
        lo, hi = b["gap"]
        lines.append(f"| {lo:.0%}-{hi:.0%} | {b['retimed']} | {b['changed']} | {b['max_loss']:.2%} | "
                     f"{b['mean_loss']:.3%} |")  # fmt: skip
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
    comp.add_argument("--from-manifest", default=None,
                      help="the first --count problems of this manifest.json instead of the suite's")  # fmt: skip
    comp.add_argument("--cubin", action="store_true", help="kernels as ptxas's cubins (CONVBW_PTXAS), not PTX")
    comp.add_argument("--out", required=True)
    run = sub.add_parser("run", help="time them through the server and the runner (GPU machine)")
    run.add_argument("folder")
    run.add_argument("--out", required=True)
    run.add_argument("--classic", type=int, default=3, help="problems also through the child-a-problem runner")
    run.add_argument("--cudnn", action="store_true", help="cuDNN as a contender too (tuning leaves it out)")
    cmp = sub.add_parser("compare", help="rates, steps and kernel times of several runs (the first is the base)")
    cmp.add_argument("outs", nargs="+", help="run --out folders")
    cmp.add_argument("--out", required=True, help="JSON (and .md beside it)")
    prep = sub.add_parser("prep", help="time the CPU preparation of each problem (inputs, float64 references)")
    prep.add_argument("folder")
    prep.add_argument("--out", required=True)
    phases = sub.add_parser(
        "phases", help="the rate and the steps of tuner results.json files (dispatch.tune --server)"
    )
    phases.add_argument("results", nargs="+", help="results.json files (a deadline cut counted from log.txt beside)")
    phases.add_argument("--out", default=None, help="the figures as JSON too")
    p2 = sub.add_parser("pass2", help="what pass 2 changed, by the gap between pass 1's fastest two")
    p2.add_argument("results", nargs="+", help="tuner results.json files")
    args = ap.parse_args(argv)
    if args.cmd == "pass2":
        return _pass2(args)
    if args.cmd == "phases":
        return _phases(args)
    if args.cmd == "compare":
        return _compare(args)
    if args.cmd == "prep":
        return _prep(args)
    if getattr(args, "count", 1) < 1 or getattr(args, "classic", 0) < 0:
        print("error: --count: expected >= 1 and --classic >= 0", file=sys.stderr)
        return 1
    return _compile(args) if args.cmd == "compile" else _run(args)


if __name__ == "__main__":
    sys.exit(main())
