"""The zoo suite tuned on sm_90a in slices (issue 39 items 3-4): build a slice here, time it on the GPU through the
measuring server with cuDNN beside each problem, then merge the slices into the shipped database and report how
the untuned choices generalize to the held-out models (bench/zoo_split.json, written before any tuning).

    # here (CPU): the next COUNT problems of the slice order, in chunks of --chunk problems (one folder each)
    .venv/bin/python bench/zoo_tune.py compile --start 0 --count 180 --out .art/zoo1 [--cubin]
    # here: the chunks as one manifest (their kernels stay in the chunks), so that one tuning run times them all
    .venv/bin/python bench/zoo_tune.py merge .art/zoo1/c* --out .art/zoo1/all
    # on the GPU machine: the slice through the server, cuDNN timed after each problem's candidates
    python3 -m convbw_mlir.dispatch.tune .art/zoo1/all --out OUT/results.json --server --cudnn --deadline S
    # here: every results.json under the folders given -> the database, the held-out report
    .venv/bin/python bench/zoo_tune.py report RESULTS_DIR... --out bench/results/<card>_<date>_zootune

The slice order: every (problem, type) of the zoo in f16 and bf16, sorted by sha256 of a seed, the name and the
type, so each slice spreads over the models, tuned and held-out alike, and the order is fixed before any timing.
Candidates: the plan's choice, its neighbours (``--max-plans``: splits +-, StreamK on/off, a tile width, the
sm_80 kernel on sm_90a), and IREE's fusilli form (the best correct IREE form on 272 of 412 problems measured
so far; the other forms are left out for size); every problem timed whole (the split, not the run, holds out).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

SEED = "zootune"
TYPES = ("f16", "bf16")
SPLIT = Path(__file__).with_name("zoo_split.json")


def slice_order(types: tuple[str, ...] = TYPES) -> list[tuple[str, Any]]:
    """(name, problem) of every zoo problem in each of ``types``, in the slice order (see the module docstring)."""
    from convbw_mlir.suites import load_suite

    every = [(n, p) for t in types for n, p in load_suite("zoo", t)]
    return sorted(every, key=lambda np_: hashlib.sha256(f"{SEED}\0{np_[0]}\0{np_[1].dtype}".encode()).hexdigest())


def _compile(args: argparse.Namespace) -> int:
    from convbw_mlir.dispatch.tune import compile_candidates

    if args.cubin:  # ptxas's cubins, not PTX (convbw_mlir/build/cubin.py): the build's children inherit the variable
        from convbw_mlir.build import cubin

        os.environ[cubin.PTXAS_ENV] = cubin.ptxas(cubin.requested() or "1")  # no ptxas: one error, nothing built
    order = slice_order()[args.start : args.start + args.count] if not args.names else _named(args.names, args.batch)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for c in range(math.ceil(len(order) / args.chunk)):
        folder = out / f"c{c:02d}"
        if folder.exists():  # built by an earlier call: chunks appear whole
            continue
        chunk = order[c * args.chunk : (c + 1) * args.chunk]
        t0 = time.monotonic()
        compile_candidates([(n, p, False) for n, p in chunk], "sm_90a", folder, max_workers=args.workers,
                           max_plans=args.max_plans, cache=args.cache, progress=False,
                           iree_forms=("iree_fusilli",), log=lambda _: None, timeout=args.build_timeout)  # fmt: skip
        size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
        total = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
        print(f"{folder}: {len(chunk)} problems in {time.monotonic() - t0:.0f} s, {size / 2**20:.1f} MiB "
              f"({total / 2**20:.1f} MiB in all)", flush=True)  # fmt: skip
        if total > args.max_mib * 2**20:
            print(f"stopped: over {args.max_mib} MiB")
            break
    return 0


def merge_chunks(chunks: list[Path], out: Path) -> int:
    """One manifest in ``out`` over the problems of ``chunks`` (``compile``'s folders, in the order given): the
    kernels stay in the chunks, named by path from ``out`` (the tree moves as a whole), the keys renumbered in
    order. Returns the problem count.

    Raises:
        ValueError: a chunk without a readable manifest, chunks of another target or IREE, a problem twice.
    """
    from convbw_mlir.files import atomic_directory
    from convbw_mlir.measure.records import ManifestEntry
    from convbw_mlir.measure.run import manifest_entries, read_manifest

    out = Path(out).absolute()
    head: dict[str, Any] = {}
    build = {"engine": "local", "workers": 0, "wall_s": 0.0, "kernels": 0}
    entries: list[dict[str, Any]] = []
    seen: dict[str, Path] = {}
    for chunk in map(Path, chunks):
        manifest = read_manifest(chunk)
        for k in ("target", "iree_version"):
            head.setdefault(k, manifest[k])
            if manifest[k] != head[k]:
                raise ValueError(f"merge: {chunk}: {k} {manifest[k]!r}, the first chunk's {head[k]!r}")
        head["date"] = max(head.get("date", ""), manifest.get("date", ""))
        b = manifest.get("build", {})
        build |= {"workers": max(build["workers"], b.get("workers", 0)), "wall_s": build["wall_s"] + b.get("wall_s", 0),
                  "kernels": build["kernels"] + b.get("kernels", 0)}  # fmt: skip
        where = chunk.absolute()
        for e in manifest_entries(manifest, chunk):
            rest = e.key.split("-", 1)[-1]  # the key less the chunk's own index
            if rest in seen:
                raise ValueError(f"merge: {rest} is in {seen[rest]} and in {chunk}")
            seen[rest] = chunk
            cont = {n: r | {k: os.path.relpath(where / r[k], out) for k in ("vmfb", "launch") if r.get(k)}
                    for n, r in e.contenders.items()}  # fmt: skip
            entries.append(ManifestEntry(e.name, f"{len(entries):03d}-{rest}", e.problem, cont, e.extra).to_dict())
    if not entries:
        raise ValueError("merge: no problem in the chunks given")
    manifest = {"target": head["target"], "date": head["date"], "iree_version": head["iree_version"], "build": build,
                "chunks": [os.path.relpath(Path(c).absolute(), out) for c in chunks], "problems": entries}  # fmt: skip
    with atomic_directory(out) as tmp:
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return len(entries)


def _named(path: str, batch: int | None) -> list[tuple[str, Any]]:
    """The zoo problems a file names (``name dtype`` a line, ``#`` comments), at ``batch`` where given."""
    every = {(n, p.dtype): p for n, p in slice_order()}
    wanted = [ln.split() for ln in Path(path).read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    unknown = [" ".join(w) for w in wanted if len(w) != 2 or tuple(w) not in every]
    if unknown:
        raise ValueError(f"--names: {path}: not a zoo problem and type: {', '.join(unknown)}")
    if batch is None:
        return [(n, every[(n, t)]) for n, t in wanted]
    return [(n.rsplit(".n", 1)[0] + f".n{batch}", every[(n, t)].with_(batch=batch)) for n, t in wanted]


# -- the report -------------------------------------------------------------------------------------------
def _gm(xs: list[float]) -> float:
    return statistics.geometric_mean(xs) if xs else float("nan")


def results_files(folders: list[str]) -> list[Path]:
    """The results.json files under ``folders``: folder by folder in the order given (each one's sorted), so a
    problem measured twice keeps the rows of the folder named first (:func:`merged_results`).

    Raises ValueError naming a folder that holds no results.json (a mistyped path must not shrink the merge)."""
    paths: list[Path] = []
    for d in folders:
        found = sorted(Path(d).rglob("results.json"))
        if not found:
            raise ValueError(f"results: {d}: no results.json found")
        paths += [p for p in found if p not in paths]
    return paths


def merged_results(paths: list[Path]) -> dict[str, Any]:
    """The rows of every results file (one device, target and IREE version), in one results object."""
    merged: dict[str, Any] | None = None
    seen = set()
    for path in paths:
        r = json.loads(path.read_text())
        if merged is None:
            merged = dict(r, problems=[], server=[])
        for k in ("target", "iree_version"):
            if r[k] != merged[k]:
                raise ValueError(f"{path}: {k} {r[k]!r}, the others' {merged[k]!r}")
        merged["device"] = merged["device"] or r["device"]
        merged["server"] += r.get("server", [])
        for row in r["problems"]:
            if row["key"].split("-", 1)[1] not in seen:  # a problem measured twice: the first file's
                seen.add(row["key"].split("-", 1)[1])
                merged["problems"].append(row)
    if merged is None:
        raise ValueError("report: no results.json found")
    return merged


def classes(problem: Any) -> str:
    """A coarse class of a problem for the cuDNN table: depthwise, grouped, 1x1, first layer, 1-D, 3-D, dense."""
    if problem.rank == 1:
        return "1-D"
    if problem.rank == 3:
        return "3-D"
    if problem.groups > 1 and problem.in_channels == 1 and problem.out_channels == 1:
        return "depthwise"
    if problem.groups > 1:
        return "grouped"
    if problem.in_channels <= 4:
        return "first layer"
    if math.prod(problem.filter_size) == 1:
        return "dense 1x1"
    return "dense kxk"


# -- where today's plan loses on the tuned models (issue 39 item 4: candidates for named rule fixes) ----------
MISRANK = 1 + 0.10  # a loss: the plan's time over the best measured variant's above this (generalize.WITHIN)
SHORT_REDUCTION = 6272  # N*Ho*Wo of a 14x14 layer at batch 32: the split-doubling pattern's bound (see misranks)
# squeeze-excite 1x1s under policies.sm90's SHORT_MIN_CHANNELS (20) at its SHORT_REDUCTION (128): the codegen rule's gap
NARROW_SE_REDUCTION, NARROW_SE_CHANNELS = 128, 20


def _kernel(plan: dict[str, Any] | None) -> str:
    """The kernel family of a plan's dict: wgmma (sm_90a), mma.sync (sm_80 kernel), codegen, depthwise, simt."""
    if plan is None:
        return "IREE form"
    intrinsic = (plan.get("tile") or {}).get("intrinsic", "")
    if plan.get("strategy") in ("codegen", "iree"):
        return "codegen"
    if "WGMMA" in intrinsic:
        return "wgmma"
    if "MMA_SYNC" in intrinsic:
        return "mma.sync"
    return "depthwise" if plan.get("depthwise") else str(plan.get("strategy"))


def _k_batch(plan: dict[str, Any]) -> int:
    return (plan.get("split") or {}).get("k_batch", 1)


def _move(plan: dict[str, Any], best: dict[str, Any]) -> str:
    """What the best variant changed against the plan (the rule fix a loss asks for)."""
    if best.get("form") != "convbw":
        return "IREE form"
    ours = best.get("plan") or {}
    if _kernel(plan) != _kernel(ours):
        return f"{_kernel(plan)} -> {_kernel(ours)}"
    if bool(plan.get("streamk")) != bool(ours.get("streamk")):
        return "StreamK off" if plan.get("streamk") else "StreamK on"
    if _k_batch(plan) != _k_batch(ours):
        return "split x2" if _k_batch(ours) == 2 * _k_batch(plan) else (
            "split up" if _k_batch(ours) > _k_batch(plan) else "split down")  # fmt: skip
    return ", ".join(sorted(k for k in plan.keys() | ours.keys() if plan.get(k) != ours.get(k))) or "same plan"


def _bucket(value: int, edges: tuple[int, ...]) -> str:
    return next((f"<= 2^{e.bit_length() - 1}" for e in edges if value <= e), f"> 2^{edges[-1].bit_length() - 1}")


def plan_rows(results: dict[str, Any], split: dict[str, Any], models: dict[str, list[str]]) -> list[dict[str, Any]]:
    """Each problem where today's plan (``plan.decide``) was among the timed candidates: its time over the best,
    the features a rule reads, what the best changed, the plan's twice-split neighbour's time over the best
    (where timed: same kernel and tile) and whether the problem's models are held out."""
    from convbw_mlir.dispatch import generalize
    from convbw_mlir.dispatch.variants import Variant
    from convbw_mlir.plan import decide
    from convbw_mlir.problem import ConvBwdWeightProblem

    out = []
    for row in results["problems"]:
        times, variants = generalize._times(row), generalize._variants(row)
        problem = ConvBwdWeightProblem.from_dict(row["problem"])
        now = generalize._name_of(Variant("convbw", decide(problem, results["target"])), variants)
        held = generalize.is_held_out(models.get(row["name"], []), split)
        if now is None or now not in times:
            out.append({"key": row["key"], "held_out": held, "measured": False})
            continue
        best = min(times, key=times.get)
        plan = row["variants"][now]["plan"]
        timed = {n: (v.get("plan") or {}) for n, v in row["variants"].items() if n in times and v.get("plan")}
        twice = [times[n] for n, v in timed.items() if plan.get("split") and not v.get("streamk")
                 and v.get("tile") == plan.get("tile") and _kernel(v) == _kernel(plan)
                 and _k_batch(v) == 2 * _k_batch(plan)]  # fmt: skip
        codegen = [times[n] for n, v in timed.items() if v.get("strategy") in ("codegen", "iree")]
        unsplit = [times[n] for n, v in timed.items() if _kernel(v) == _kernel(plan) and _k_batch(v) == 1]
        c, k = problem.in_channels, problem.out_channels
        reduction = problem.batch * math.prod(problem.output_size)  # N*Ho*Wo (the runner's reduction_length)
        short_plain = reduction <= NARROW_SE_REDUCTION and math.prod(problem.filter_size) == 1
        out.append({"key": row["key"], "held_out": held, "measured": True, "ratio": times[now] / times[best],
                    "twice": min(twice) / times[best] if twice else None,
                    "codegen": min(codegen) / times[best] if codegen else None,
                    "unsplit": min(unsplit) / times[best] if unsplit else None,
                    "narrow_se": short_plain and problem.groups == 1 and min(c, k) < NARROW_SE_CHANNELS,
                    "reduction": reduction,
                    "weights": problem.groups * k * c * math.prod(problem.filter_size),
                    "split": "StreamK" if plan.get("streamk") else "split-K" if plan.get("split") else "no split",
                    "kernel": _kernel(plan), "filter": "1x1" if math.prod(problem.filter_size) == 1 else "kxk",
                    "channels": "C or K not x16" if c % 16 or k % 16 else "C, K x16",
                    "move": _move(plan, row["variants"][best])})  # fmt: skip
    return out


FEATURES = {
    "reduction N*Ho*Wo": lambda r: _bucket(r["reduction"], (2**10, 2**13, 2**16)),
    "weights G*K*C*R*S": lambda r: _bucket(r["weights"], (2**14, 2**17, 2**20)),
    "StreamK vs split": lambda r: r["split"],
    "kernel": lambda r: r["kernel"],
    "filter": lambda r: r["filter"],
    "channels": lambda r: r["channels"],
}


def misranks(rows: list[dict[str, Any]]) -> str:
    """The plan's losses (time over the best > :data:`MISRANK`) on the tuned models' problems, by feature, with
    what the best changed; then the split-doubling pattern by kernel and reduction, fitted on the tuned models'
    rows and checked on the held-out models' rows."""
    tuned = [r for r in rows if not r["held_out"] and r["measured"]]
    lost = [r for r in tuned if r["ratio"] > MISRANK]
    left = sum(not r["held_out"] and not r["measured"] for r in rows)
    lines = [f"Tuned models' problems where today's plan was timed: {len(tuned)} ({left} not: the plan moved since "
             f"the kernels were built); the plan more than {MISRANK - 1:.0%} slower than the best on {len(lost)}.", "",
             "| feature | value | problems | losses | geomean loss of the losses | what the best changed (losses) |",
             "|---|---|---:|---:|---:|---|"]  # fmt: skip
    for feature, of in FEATURES.items():
        groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in tuned:
            groups[of(r)].append(r)
        for value in sorted(groups):
            ls = [r for r in groups[value] if r["ratio"] > MISRANK]
            moves = defaultdict(int)
            for r in ls:
                moves[r["move"]] += 1
            said = ", ".join(f"{m} {n}" for m, n in sorted(moves.items(), key=lambda mn: (-mn[1], mn[0])))
            loss = f"{_gm([r['ratio'] for r in ls]) - 1:.0%}" if ls else ""
            lines.append(f"| {feature} | {value} | {len(groups[value])} | {len(ls)} | {loss} | {said} |")
    lines += ["", f"Twice the plan's split (same kernel and tile), where the plan splits and that neighbour was timed: "
              f"choices within {MISRANK - 1:.0%} of the best, the plan's against the doubled split's "
              f"(reduction short: N*Ho*Wo <= {SHORT_REDUCTION}).", "",
              "| kernel | reduction | tuned: problems | plan within | x2 within | held out: problems | plan within "
              "| x2 within |", "|---|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for kernel in ("mma.sync", "wgmma"):
        for short in (True, False):
            cells = []
            for held in (False, True):
                rs = [r for r in rows if r["held_out"] == held and r["measured"] and r["twice"] is not None
                      and r["kernel"] == kernel and (r["reduction"] <= SHORT_REDUCTION) == short]  # fmt: skip
                cells += [len(rs), sum(r["ratio"] <= MISRANK for r in rs), sum(r["twice"] <= MISRANK for r in rs)]
            lines.append(f"| {kernel} | {'short' if short else 'longer'} | " + " | ".join(map(str, cells)) + " |")
    lines += ["", f"Narrow squeeze-excite 1x1s (N*Ho*Wo <= {NARROW_SE_REDUCTION}, one group, min(C, K) < "
              f"{NARROW_SE_CHANNELS}: short-reduction-codegen's channel floor) by the plan's kernel: choices within "
              f"{MISRANK - 1:.0%} of the best: the plan's, IREE's codegen (where timed), the same kernel unsplit.", "",
              "| kernel | tuned: problems | plan | codegen | unsplit | held out: problems | plan | codegen | unsplit |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for kernel in sorted({r["kernel"] for r in rows if r["measured"] and r["narrow_se"]}):
        cells = []
        for held in (False, True):
            rs = [
                r for r in rows if r["held_out"] == held and r["measured"] and r["narrow_se"] and r["kernel"] == kernel
            ]
            cells.append(str(len(rs)))
            for who in ("ratio", "codegen", "unsplit"):
                timed = [r[who] for r in rs if r[who] is not None]
                cells.append(f"{sum(x <= MISRANK for x in timed)} of {len(timed)}")
        lines.append(f"| {kernel} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _report(args: argparse.Namespace) -> int:
    from convbw_mlir.dispatch import generalize
    from convbw_mlir.dispatch.db import db_file_name
    from convbw_mlir.dispatch.tune import _decide, build_database, device_noise
    from convbw_mlir.problem import ConvBwdWeightProblem

    paths = results_files(args.results)
    results = merged_results(paths)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    models = generalize.read_models("zoo")
    split = generalize.read_split(SPLIT)
    for row in results["problems"]:
        row["models"] = models.get(row["name"], [])
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    db = build_database(dict(results, problems=[dict(r, held_out=False) for r in results["problems"]]))
    db.save(out / db_file_name(db.device, db.target))
    selector = generalize.train_selector(results, split, models)
    report = generalize.evaluate(results, split, selector, models)
    (out / "generalize.json").write_text(json.dumps(report, indent=1) + "\n")
    if generalize.ships(report):
        selector.save(out / f"selector.{results['target']}.json")
    level = device_noise(results)
    by_class: dict[str, list[float]] = defaultdict(list)
    heur_cls: dict[str, list[float]] = defaultdict(list)
    counts: dict[str, int] = defaultdict(int)
    for row in results["problems"]:
        d = _decide(row, level, results["target"])
        counts["problems"] += 1
        if d["winner"] is None:
            counts["none correct"] += 1
            continue
        if d["cudnn_s"]:
            cls = classes(ConvBwdWeightProblem.from_dict(row["problem"]))
            by_class[cls].append(d["cudnn_s"] / d["median_s"])
            if d["heuristic_s"]:
                heur_cls[cls].append(d["cudnn_s"] / d["heuristic_s"])
        if d["winner"] != d["heuristic"]:
            counts["heuristic beaten"] += 1
    runs = results.get("server", [])
    wall = sum(r.get("wall_s") or 0 for r in runs)
    # the runs' wall clock covers every row they timed, a problem re-measured in a later run included
    timed = sum(len(json.loads(p.read_text())["problems"]) for p in paths)
    rate = f"{60 * timed / wall:.1f}" if wall else "n/a"
    lines = [f"# The zoo tuned on {results['device']} ({results['target']}), {results['date']}", "",
             f"Tuning rate with cuDNN beside each problem: {timed} problems timed in {wall:.0f} s of "
             f"measuring-server runs ({len(runs)} runs: pass 1 and pass 2 of each group): **{rate} problems a "
             "minute** on one GPU.", "",
             f"{counts['problems']} problem-types measured ({len(paths)} results files), "
             f"{counts['none correct']} with no correct candidate; the heuristic's plan beaten by more than the "
             f"noise on {counts['heuristic beaten']}; device noise {level or 0:.1%}.", "",
             "## Tuned best and the heuristic's plan against cuDNN (kernel time, same process)", "",
             "| class | problems | cuDNN / tuned best, geomean | min | cuDNN / heuristic, geomean "
             "| below 0.8x (tuned) |",
             "|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    for cls in sorted(by_class):
        xs, hs = by_class[cls], heur_cls[cls]
        lines.append(f"| {cls} | {len(xs)} | {_gm(xs):.2f}x | {min(xs):.2f}x | {_gm(hs):.2f}x "
                     f"| {sum(x < 0.8 for x in xs)} |")  # fmt: skip
    allx = [x for xs in by_class.values() for x in xs]
    allh = [x for xs in heur_cls.values() for x in xs]
    lines += [f"| all | {len(allx)} | {_gm(allx):.2f}x | {min(allx, default=float('nan')):.2f}x | {_gm(allh):.2f}x "
              f"| {sum(x < 0.8 for x in allx)} |", "",
              "(ratio > 1: ours faster than cuDNN.)", "",
              "## Leave-model-out (bench/zoo_split.json: 9 of 44 models held out before tuning)", "",
              generalize.markdown(report), "## Where today's plan loses on the tuned models", "",
              misranks(plan_rows(results, split, models))]  # fmt: skip
    (out / "report.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compile", help="build the next slice's candidates, in chunk folders (CPU machine)")
    c.add_argument("--start", type=int, default=0, help="first position in the slice order")
    c.add_argument("--count", type=int, default=0, help="problem-types to build (from --start)")
    c.add_argument("--names", default=None, help="a file of `name dtype` lines: build these zoo problems instead")
    c.add_argument("--batch", type=int, default=None, help="with --names: at this batch (the zoo's is 32)")
    c.add_argument("--chunk", type=int, default=30, help="problems a folder (default 30)")
    c.add_argument("--max-plans", type=int, default=3, help="plan neighbours beside the heuristic's (default 3)")
    c.add_argument("--workers", type=int, default=2)
    c.add_argument("--max-mib", type=float, default=36.0, help="stop after the chunk that passes this size")
    c.add_argument("--cache", default=None, help="kernel cache folder (default the user's)")
    c.add_argument("--build-timeout", type=float, default=30.0,
                   help="seconds a candidate's compile may take (IREE's codegen of a 3-D layer: minutes)")  # fmt: skip
    c.add_argument("--cubin", action="store_true",
                   help="kernels as ptxas's cubins (CONVBW_PTXAS: 1 finds ptxas, or its path), not PTX")  # fmt: skip
    c.add_argument("--out", required=True)
    m = sub.add_parser("merge", help="the chunks' problems as one manifest, for one tuning run (CPU)")
    m.add_argument("chunks", nargs="+", help="compile's chunk folders, in the order to time them")
    m.add_argument("--out", required=True, help="the merged manifest's folder (new, or an earlier merge's)")
    r = sub.add_parser("report", help="merge the results, build the database, the held-out report (CPU)")
    r.add_argument("results", nargs="+",
                   help="folders holding results.json files (searched below); a problem measured in two keeps "
                        "the rows of the folder named first")  # fmt: skip
    r.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if args.cmd == "compile" and ((args.count < 1 and not args.names) or args.chunk < 1 or args.start < 0):
        print("error: --count (or --names) and --chunk: expected >= 1, --start >= 0", file=sys.stderr)
        return 1
    if args.cmd == "compile" and args.batch is not None and (not args.names or args.batch < 1):
        print(f"error: --batch: {args.batch} needs --names and must be >= 1", file=sys.stderr)
        return 1
    try:
        if args.cmd == "merge":
            n = merge_chunks(args.chunks, args.out)
            print(f"{args.out}/manifest.json: {n} problems of {len(args.chunks)} chunks")
            return 0
        return _compile(args) if args.cmd == "compile" else _report(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
