"""What a refactor of the plan must not change, cheaply (docs/plan.md#rules): for every suite problem (seeds,
models, ck_test_grouped_convnd_bwd_weight, classes and every tenth zoo problem) x f16/bf16 x every target,
``decide``'s plan (its plain data, workspace and determinism) and ``select``'s choice (variant, path, why,
plan); besides, the same problems of the small suites in every layout, as fp8, and with the options that
take the plan's other rules (strategy, layout4, k-batch, merge-groups); and the lowered IR (the target's
pipeline, no IREE compile) of a sample across targets.

    python bench/plan_identity.py dump DIR [--ir 50] [--vmfb 12]  # DIR/plans.jsonl, DIR/ir/<stem>.mlir, .vmfb.sha256
    python bench/plan_identity.py compare BEFORE AFTER  # counts; exit code 1 if anything differs

``select`` reads no user tuning folder (``$CONVBW_CACHE_DIR`` is pointed at an empty one), only the shipped
databases, so a run is the same on every machine. :mod:`bench.ir_identity` compiles everything (``.vmfb``
included) and takes hours on two cores; this takes minutes.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

SUITES = ("seeds", "models", "ck_test_grouped_convnd_bwd_weight", "classes", "zoo")
SMALL = ("seeds", "models", "classes")  # the suites the extra layouts, types and options run over
DTYPES = ("f16", "bf16")
ZOO_EVERY = 10  # every tenth zoo problem: the 10% sample
OPTIONS: tuple[dict[str, Any], ...] = (
    {"strategy": "explicit"},
    {"strategy": "codegen"},
    {"k_batch": 4},
    {"k_batch": "rows"},
    {"strategy": "explicit", "merge_groups": 1},
    {"strategy": "explicit", "k_batch": 2},
    {"layout4": "relayout"},
    {"layout4": "gather"},
    {"layout4": "fold"},
)


def problems() -> list[tuple[str, Any, dict[str, Any]]]:
    """(stem, problem, options) of every case, in a fixed order."""
    from convbw_mlir.problem import LAYOUTS
    from convbw_mlir.suites import load_suite

    out = []
    for dtype in DTYPES:
        for suite in SUITES:
            rows = load_suite(suite, dtype=dtype)
            if suite == "zoo":
                rows = rows[::ZOO_EVERY]
            out += [(f"{suite}.{name}.{dtype}", p, {}) for name, p in rows]
    for suite in SMALL:
        rows = load_suite(suite, dtype="f16")
        for name, p in rows:
            for layout in LAYOUTS:
                if layout != p.layout_family.name and (p.groups == 1 or LAYOUTS[layout].grouped):
                    lay = layout.replace("/", "-")
                    out.append((f"{suite}.{name}.f16.{lay}", p.with_(layout=layout), {}))
            if p.groups == 1:
                out.append((f"{suite}.{name}.e4m3", p.with_(dtype="e4m3", dw_dtype="f32"), {}))
            for opts in OPTIONS:
                tag = ",".join(f"{k}={v}" for k, v in opts.items())
                four = p.with_(layout="NGCHW/GKCYX/NGKHW") if "layout4" in opts else p
                out.append((f"{suite}.{name}.f16.{tag}", four, opts))
    return out


def _or_error(fn: Any) -> Any:
    try:
        return fn()
    except Exception as e:  # a refusal is part of the record, compared like a plan
        return f"ERROR {type(e).__name__}: {e}"


def _plan_record(plan: Any) -> Any:
    if plan is None or isinstance(plan, str):
        return plan
    return {"plan": plan.to_dict(), "workspace": plan.workspace_bytes, "deterministic": plan.deterministic}


def _selected(problem: Any, target: str) -> Any:
    from convbw_mlir.dispatch import select

    sel = select(problem, target)
    return {"variant": sel.variant.name, "path": sel.path, "why": sel.why, "plan": _plan_record(sel.variant.plan)}


def _lowered(problem: Any, target: str) -> str:
    from convbw_mlir.build.compile import lowered_text
    from convbw_mlir.pipelines import for_target

    return lowered_text(problem, for_target(target))


def _vmfb_digest(problem: Any, target: str) -> str:
    import hashlib

    from convbw_mlir import compile_op

    return hashlib.sha256(compile_op(problem, target, cache=False).vmfb).hexdigest()


def dump(out: Path, ir: int, vmfb: int = 0) -> int:
    from convbw_mlir.plan import decide
    from convbw_mlir.targets import TARGETS

    out.mkdir(parents=True, exist_ok=True)
    (out / "ir").mkdir(exist_ok=True)
    cases = problems()
    plain = [c for c in cases if not c[2]]
    sample = {stem for stem, _, _ in plain[:: max(1, len(plain) // max(ir, 1))][:ir]} if ir else set()
    count = 0
    with open(out / "plans.jsonl", "w") as f:
        for stem, problem, opts in cases:
            for i, target in enumerate(TARGETS):
                row: dict[str, Any] = {"case": f"{stem}.{target}"}
                row["decide"] = _plan_record(_or_error(functools.partial(decide, problem, target, **opts)))
                if not opts:
                    row["select"] = _or_error(functools.partial(_selected, problem, target))
                f.write(json.dumps(row, sort_keys=True) + "\n")
                count += 1
                # the IR sample: each sampled problem on one target, the targets in turn
                if stem in sample and i == hash_index(stem, len(TARGETS)):
                    text = _or_error(functools.partial(_lowered, problem, target))
                    (out / "ir" / f"{stem}.{target}.mlir").write_text(text)
                    if target != "host" and len(list((out / "ir").glob("*.vmfb.sha256"))) < vmfb:
                        digest = _or_error(functools.partial(_vmfb_digest, problem, target))
                        (out / "ir" / f"{stem}.{target}.vmfb.sha256").write_text(digest)
    print(f"{count} cases x targets, {len(list((out / 'ir').iterdir()))} lowered IR files in {out}")
    return 0


def hash_index(stem: str, n: int) -> int:
    """A stable index in [0, n) for ``stem`` (Python's hash() varies by process)."""
    return sum(stem.encode()) % n


def compare(before: Path, after: Path) -> int:
    old = [json.loads(line) for line in (before / "plans.jsonl").read_text().splitlines()]
    new = {r["case"]: r for r in (json.loads(line) for line in (after / "plans.jsonl").read_text().splitlines())}
    bad = 0
    for kind in ("decide", "select"):
        rows = [r for r in old if kind in r]
        differ = [r["case"] for r in rows if new.get(r["case"], {}).get(kind) != r[kind]]
        errors = sum(1 for r in rows if isinstance(r[kind], str))
        print(f"{kind:>7}: {len(rows) - len(differ)} of {len(rows)} identical ({errors} refusals among them)")
        for case in differ[:20]:
            print(f"  differs: {kind} {case}")
        bad += len(differ)
    files = sorted((before / "ir").iterdir())  # the lowered IR and the sampled programs' digests
    differ_ir = [f.name for f in files if not (after / "ir" / f.name).exists()
                 or (after / "ir" / f.name).read_text() != f.read_text()]  # fmt: skip
    for kind in (".mlir", ".sha256"):
        n = sum(1 for f in files if f.name.endswith(kind))
        bad = sum(1 for name in differ_ir if name.endswith(kind))
        print(f"{'ir' if kind == '.mlir' else 'vmfb':>7}: {n - bad} of {n} identical")
    for name in differ_ir[:20]:
        print(f"  differs: ir {name}")
    extra = sorted(set(new) - {r["case"] for r in old})
    for case in extra[:10]:
        print(f"  only after: {case}")
    return 1 if bad or differ_ir or extra else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump")
    d.add_argument("out", type=Path)
    d.add_argument("--ir", type=int, default=50, help="lowered IR of this many problems (0: none)")
    d.add_argument("--vmfb", type=int, default=0, help="and the .vmfb (its sha256) of this many of them on GPU "
                   "targets (IREE compiles: seconds each)")  # fmt: skip
    cmp_ = sub.add_parser("compare")
    cmp_.add_argument("before", type=Path)
    cmp_.add_argument("after", type=Path)
    args = ap.parse_args(argv)
    if args.cmd == "dump":
        with tempfile.TemporaryDirectory() as empty:
            os.environ["CONVBW_CACHE_DIR"] = empty  # no user database: the shipped ones only
            return dump(args.out, args.ir, args.vmfb)
    return compare(args.before, args.after)


if __name__ == "__main__":
    sys.exit(main())
