"""Compile every suite problem for every GPU target with our pipeline and with IREE's default, and
tabulate the ISA report: the acceptance matrix of the GPU code generation (no GPU needed).

    python bench/isa_matrix.py [--suite NAME ...] [--types f16,bf16] [--targets ...]
        [--jobs 2] [--out bench/results/isa_<date>]

The targets (default: every GPU entry of :data:`convbw_mlir.targets.TARGETS`) and the matrix
instructions expected of each come from that table.

Each (problem, type) is compiled in a child process (:mod:`convbw_mlir.build.isolate`), so that a compiler
crash (IREE 3.13 segfaults on some inputs) is recorded as such instead of ending the run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

__all__ = ["main", "matrix_targets", "write_tables"]


def matrix_targets(spec: str | None = None) -> list[str]:
    """The targets of the matrix: the comma-separated names in ``spec``, or every GPU target of the table.

    Raises:
        ValueError: an unknown name, or one that is not a GPU target.
    """
    from convbw_mlir.targets import TARGETS, gpu_targets

    if not spec:
        return [t.name for t in gpu_targets()]
    names = [n.strip() for n in spec.split(",") if n.strip()]
    gpus = [t.name for t in gpu_targets()]
    for n in names:
        if n not in gpus:
            why = "not a GPU target" if n in TARGETS else "unknown target"
            raise ValueError(f"targets: {n!r} is {why}; GPU targets: {', '.join(gpus)}")
    if not names:
        raise ValueError(f"targets: {spec!r} names no target")
    return names


def compile_one(ck: str, dtype: str, target: str, flavor: str) -> dict:
    """In this process: compile and report. flavor: ours (the target pipeline) or iree (plain lowering)."""
    from convbw_mlir.passes import parse_pipeline

    from convbw_mlir.build.compile import lowered_text
    from convbw_mlir.build.iree import executable_intermediates
    from convbw_mlir.build.isa import dropped_configs, report
    from convbw_mlir.pipelines import for_target
    from convbw_mlir.problem import ConvBwdWeightProblem

    problem = ConvBwdWeightProblem.from_ck(ck, dtype=dtype)
    plain = "convbw-lower-to-linalg{frontend-form=true},canonicalize,cse"  # what a frontend hands IREE
    pipeline = for_target(target) if flavor == "ours" else parse_pipeline(plain)
    try:
        text = lowered_text(problem, pipeline)
        files = executable_intermediates(text, target).files
        rep = report(files, target)
        dropped = dropped_configs(text, files)
    except Exception as e:  # a compile failure is a result here
        return {"ok": False, "error": str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__}
    main = rep.main
    k_batch = text.count("k_batch = ") and int(text.split("k_batch = ", 1)[1].split(" ", 1)[0])
    strategy = "mma" if 'strategy = "mma"' in text else ("simt" if 'strategy = "simt"' in text else "iree")
    return {
        "ok": True,
        "kernels": len(rep.kernels),
        "mma": main.mma,
        "mma_count": main.mma_count,
        "vgpr": main.vgpr,
        "agpr": main.agpr,
        "sgpr": main.sgpr,
        "lds": main.lds_bytes,
        "scratch": rep.scratch_bytes,
        "occupancy": main.occupancy,
        "occupancy_limit": main.occupancy_limit,
        "k_batch": k_batch or 1,
        "strategy": strategy if flavor == "ours" else "iree",
        "dropped": len(dropped),  # our configs IREE did not compile with (configured executables)
    }


def compile_many(ck: str, dtype: str, targets: list[str], flavors: list[str]) -> dict:
    """In this process: :func:`compile_one` for every target and flavor, keyed ``target/flavor``."""
    return {f"{t}/{f}": compile_one(ck, dtype, t, f) for t in targets for f in flavors}


def _run_job(ck: str, dtype: str, targets: list[str], flavors: list[str]) -> dict:
    from convbw_mlir.build.isolate import CompilerCrash, call

    try:
        out = call(compile_many, ck, dtype, targets, flavors, what=f"'{ck}' ({dtype}) for {','.join(targets)}")
        return json.loads(json.dumps(out))  # as the results file holds them
    except CompilerCrash as e:
        status = e.returncode
    except Exception:  # compile_one records every error; anything else ended the child with status 1
        status = 1
    if len(targets) * len(flavors) == 1:
        return {f"{targets[0]}/{flavors[0]}": {"ok": False, "error": f"compiler crashed (exit {status})"}}
    out = {}  # find the crashing compile(s): one child each
    for t in targets:
        for f in flavors:
            out |= _run_job(ck, dtype, [t], [f])
    return out


def write_tables(results: list[dict], targets: list[str], out: Path) -> str:
    from convbw_mlir.targets import TARGETS

    lines = [
        f"# ISA matrix, {datetime.date.today()} (iree-base-compiler {_iree_version()})",
        "",
        "Per problem, type and target: our pipeline's main kernel: matrix instructions in the ISA "
        "(static count; `-` = SIMT strategy, none expected), scratch bytes (spills), occupancy "
        "(waves/SIMD, AMD) and k_batch; `i` = IREE compiled its own config, not ours (our compilation_info "
        "is in no configured executable); `default` = IREE's own pipeline on the plain linalg form.",
        "",
    ]
    header = "| problem | type | " + " | ".join(targets) + " |"
    lines += [header, "|" + "---|" * (len(targets) + 2)]
    default_fail, ours_fail, spills, missing_mma, dropped = [], [], [], [], []
    for row in results:
        cells = []
        for t in targets:
            r, d = row["res"][f"{t}/ours"], row["res"][f"{t}/iree"]
            if not r["ok"]:
                ours_fail.append((row["name"], row["dtype"], t, r["error"]))
                cells.append("**FAIL**")
                continue
            if not d["ok"]:
                default_fail.append((row["name"], row["dtype"], t, d["error"]))
            if r["scratch"]:
                spills.append((row["name"], row["dtype"], t, r["scratch"]))
            has = bool(TARGETS[t].mnemonics(row["dtype"]) & r["mma"].keys())
            if r["strategy"] == "mma" and not has:
                missing_mma.append((row["name"], row["dtype"], t))
            ours = not r.get("dropped")
            if not ours:
                dropped.append((row["name"], row["dtype"], t, r["k_batch"]))
            mma = str(r["mma_count"]) if r["strategy"] != "simt" else "-"
            occ = f" o{r['occupancy']}" if r.get("occupancy") else ""
            kb = f" k{r['k_batch']}" if r["k_batch"] > 1 else ""
            sp = f" **S{r['scratch']}**" if r["scratch"] else ""
            dflt = "" if d["ok"] else " (default FAIL)"
            cells.append(f"{mma}{occ}{kb}{sp}{dflt}{'' if ours else ' i'}")
        lines.append(f"| {row['name']} | {row['dtype']} | " + " | ".join(cells) + " |")
    total = len(results) * len(targets)
    lines += [
        "",
        f"Compiles: {total} with our pipeline, {len(ours_fail)} failed; IREE default failed on {len(default_fail)}.",
        f"Kernels given the MMA strategy without the target's matrix instructions: {len(missing_mma)}.",
        f"Kernels with scratch (spills): {len(spills)}.",
        f"Kernels where IREE dropped our config and used its own: {len(dropped)} "
        f"({sum(k > 1 for *_, k in dropped)} of them split-K).",
        "",
        "## IREE's default fails, ours compiles",
        "",
    ]
    lines += [
        f"- {n} {dt} {t}: {e}"
        for n, dt, t, e in default_fail
        if (n, dt, t) not in {(a, b, c) for a, b, c, _ in ours_fail}
    ]
    lines += ["", "## Our pipeline fails", ""] + [f"- {n} {dt} {t}: {e}" for n, dt, t, e in ours_fail]
    lines += ["", "## Spills", ""] + [f"- {n} {dt} {t}: {s} B scratch" for n, dt, t, s in spills]
    lines += ["", "## MMA strategy without matrix instructions", ""] + [f"- {n} {dt} {t}" for n, dt, t in missing_mma]
    lines += ["", "## Our tile dropped by IREE", ""] + [f"- {n} {dt} {t} (k_batch {k})" for n, dt, t, k in dropped]
    text = "\n".join(lines) + "\n"
    out.with_suffix(".md").write_text(text)
    out.with_suffix(".json").write_text(json.dumps(results, indent=0) + "\n")
    return text


def _iree_version() -> str:
    from importlib.metadata import version

    return version("iree-base-compiler")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    from convbw_mlir.suites import load_suite

    ap = argparse.ArgumentParser(prog="python bench/isa_matrix.py")
    ap.add_argument("--suite", action="append", default=None)
    ap.add_argument("--types", default="f16,bf16")
    ap.add_argument("--targets", default="", help="comma-separated (default: every GPU target of the table)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--limit", type=int, default=0, help="only the first N problems of each suite")
    ap.add_argument("--out", default=f"bench/results/isa_{datetime.date.today()}")
    args = ap.parse_args(argv)
    try:
        targets = matrix_targets(args.targets)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    jobs = []
    for suite in args.suite or ["ck_test_grouped_convnd_bwd_weight", "seeds", "models"]:
        for name, p in load_suite(suite)[: args.limit or None]:
            for dtype in args.types.split(","):
                jobs.append((name, p.to_ck(), dtype))
    results: list[dict] = []
    with ThreadPoolExecutor(args.jobs) as pool:
        futures = [(j, pool.submit(_run_job, j[1], j[2], targets, ["ours", "iree"])) for j in jobs]
        for i, ((name, ck, dtype), fut) in enumerate(futures, 1):
            results.append({"name": name, "ck": ck, "dtype": dtype, "res": fut.result()})
            if sys.stderr.isatty():
                print(f"\r{i}/{len(jobs)} {name} {dtype}", end="", file=sys.stderr)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    text = write_tables(results, targets, out)
    print(text.split("\n## ")[0].splitlines()[-4:] and "\n".join(text.split("\n## ")[0].splitlines()[-4:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
