"""Issue 39's goals 2 and 3 on the held-back set: the plan a user gets on sm_90a against cuDNN and IREE's fusilli form.

    .venv/bin/python bench/heldback.py select [--types bf16,f16] [--set TSV]     # here: the rows, no compiler
    .venv/bin/python bench/heldback.py compile DIR [--types bf16,f16] [--set TSV] [--workers 2]  # here (IREE)
    python3 bench/heldback.py run DIR --out OUT                                  # GPU machine: runtime and torch
    python bench/heldback.py report OUT/rows.jsonl [--card CARD] [--command CMD] > table.md

The problems (:func:`problems`): every layer of ``bench/heldback/dense2d.tsv`` (33 dense 2-D layers of 9 models
outside every suite, chosen before any measurement; they fit nothing) or of ``--set`` (``dense2d_b.tsv``: the
second set, 25 layers of 11 more models, chosen after the first set's run to judge changes made since; not measured
yet), channels-last (the product's default
layout), every bf16 row first, then every f16 row, so that a run cut short keeps one whole type.
The contenders (:func:`contenders`): :data:`OURS`, exactly the variant ``compile_op`` gives a user with no options
(:func:`convbw_mlir.dispatch.select.select`: a shipped tuning database's exact entry, the learned selector where one
is installed, a tuned neighbour, else the heuristic's rule), the path, rule and reason recorded in the entry's
extra fields; and :data:`IREE`, IREE's fusilli form (issue 39's best correct IREE form: the best on 272 of 412 zoo
problems, ``bench/zoo_tune.py``), where IREE is not known to compute a wrong dW (every 1x1 on NVIDIA). cuDNN is
added by the runner. ``run`` is :func:`class_table.run` (the runner's server: every kernel checked against its
float64 sample with NaN after x and dy, then timed by CUPTI; cuDNN checked and timed in the same process).
``report``: per row, ours, cuDNN and IREE's time, against the issue's goals (:data:`GOALS`).
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import class_table as ct  # noqa: E402
from harness import Parser, compile_manifest, geomean  # noqa: E402

TARGET = "sm_90a"
TYPES = ("bf16", "f16")  # bf16 first: a run cut short keeps one whole type
SUITE = Path(__file__).resolve().parent / "heldback" / "dense2d.tsv"
IREE = "iree_fusilli"
OURS = "convbw[product]"  # the product's variant, whichever path chose it (the entry's ``path`` says)
# the entry's fields the rows carry (class_table.run adds them from the manifest)
FIELDS = ("path", "rule", "why", "kernel", "iree_note")
# issue 39: dense 2-D geomean of cuDNN/ours at least, every row at least; ours against the best correct IREE form
GOALS = {"geomean": 1.15, "floor": 0.8, "vs_iree": 1.0}


def known_types(text: str) -> tuple[str, ...]:
    """The types named (comma-separated), each once, in :data:`TYPES` order.

    Raises:
        ValueError: a name not in :data:`TYPES`, or none.
    """
    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in names if t not in TYPES]
    if bad or not names:
        raise ValueError(f"types: expected some of {','.join(TYPES)}, got {text!r}")
    return tuple(t for t in TYPES if t in names)


def problems(types: tuple[str, ...] = TYPES, path: Path = SUITE) -> list[tuple[str, Any]]:
    """(name, problem) of every layer of ``path`` in each type, channels-last, one type's rows after the other's."""
    from convbw_mlir.suites import load_suite

    return [(n, p.with_(layout=2)) for t in types for n, p in load_suite(path, t)]


def contenders(p: Any) -> tuple[list[Any], dict[str, Any]]:
    """The variants to time (ours first, then IREE's form where not known wrong) and the entry's extra fields."""
    from convbw_mlir.dispatch.select import select
    from convbw_mlir.dispatch.variants import Variant, known_wrong

    s = select(p, TARGET)
    d = s.variant.plan.decision if s.variant.plan is not None else None
    rule = d.rule if d is not None else s.variant.form
    if d is not None and d.then is not None:
        rule += f" > {d.then.rule}"
    plan = s.variant.plan.to_dict() if s.variant.plan is not None else None
    extra = {"path": s.path, "rule": rule, "why": s.why, "kernel": ct.kernel_of(plan), "iree_note": ""}
    ours = replace(s.variant, label="product") if s.variant.plan is not None else s.variant
    wrong = known_wrong(p, TARGET, IREE)
    if wrong is not None:
        extra["iree_note"] = f"not built: {wrong}"
        return [ours], extra
    return [ours, Variant(IREE)], extra


def compile_all(folder: Path, types: tuple[str, ...], workers: int, cache: Path | None, path: Path = SUITE) -> int:
    """Every row's contenders built for sm_90a into ``folder`` (the runner's manifest, in the measuring order)."""
    items = []
    for name, p in problems(types, path):
        vs, extra = contenders(p)
        items.append((name, p, vs, extra))
    return compile_manifest(folder, items, workers, cache, TARGET)


def run(folder: Path, out: Path) -> int:
    """:func:`class_table.run` with this table's entry fields."""
    return ct.run(folder, out, FIELDS)


# -- report ----------------------------------------------------------------------------------------------
def summary(rows: list[dict]) -> dict[str, Any]:
    """cuDNN/ours (geomean, min, rows below the floor) by type and in all, and ours against IREE's form: rows
    where both were correct and ours at least as fast, slower, and rows with no correct IREE kernel."""
    ratios: dict[str, list[tuple[str, float]]] = {}
    vs_iree: list[tuple[str, float]] = []
    no_iree: list[str] = []
    for r in rows:
        ours, cud, iree = ct.kernel_us(r, OURS), ct.kernel_us(r, "cudnn"), ct.kernel_us(r, IREE)
        if ours and cud:
            ratios.setdefault(ct._dtype(r), []).append((r["key"], cud / ours))
        if iree is None:
            no_iree.append(r["key"])
        elif ours:
            vs_iree.append((r["key"], iree / ours))
    every = [x for xs in ratios.values() for x in xs]
    s: dict[str, Any] = {"types": {}}
    for t in [t for t in TYPES if t in ratios] + sorted(set(ratios) - set(TYPES)):
        vs = [v for _, v in ratios[t]]
        s["types"][t] = {"geomean": geomean(vs), "min": min(vs), "count": len(vs)}
    vals = [v for _, v in every]
    s["geomean"] = geomean(vals)
    s["min"] = min(vals) if vals else None
    s["count"] = len(vals)
    s["below_floor"] = sorted(k for k, v in every if v < GOALS["floor"])
    s["iree_compared"] = len(vs_iree)
    s["iree_slower"] = sorted(k for k, v in vs_iree if v < GOALS["vs_iree"])  # ours slower than IREE's form
    s["no_iree"] = no_iree
    s["wrong"] = sorted(r["key"] for r in rows if ct._said(r, OURS) == "WRONG")
    s["unmeasured"] = sorted(r["key"] for r in rows if not (ct.kernel_us(r, OURS) and ct.kernel_us(r, "cudnn")))
    g = s["geomean"]
    # IREE's goal: on every problem where IREE gave a correct time, ours has one and is at least as fast
    iree_timed = len(rows) - len(no_iree)
    beat = None if not iree_timed else not s["iree_slower"] and len(vs_iree) == iree_timed
    s["goals"] = {f"geomean >= {GOALS['geomean']}": None if g is None else g >= GOALS["geomean"],
                  f"none < {GOALS['floor']}": None if not vals else not s["below_floor"] and not s["wrong"],
                  f">= {GOALS['vs_iree']}x IREE's best correct form": beat}  # fmt: skip
    return s


def _iree_cell(r: dict) -> str:
    if IREE not in r.get("contenders", {}):
        return "no kernel (known wrong)" if r.get("iree_note") else "-"
    return ct._status(r, IREE)


def report(rows: list[dict], device: str = "-", card: str = "", command: str = "") -> str:
    """The table (markdown): the summary against the goals, then every row."""
    s = summary(rows)
    lines = [f"# Held-back dense 2-D layers: the plan a user gets on {TARGET} against cuDNN and IREE "
             f"({card or device})", ""]  # fmt: skip
    if command:
        lines += [f"Command: `{command}`", ""]
    lines += ["Kernel time a call by CUPTI (µs), cuDNN in the same process; cuDNN/ours > 1 and IREE/ours > 1: ours is "
              f"faster. Goals (issue 39): dense 2-D geomean of cuDNN/ours >= {GOALS['geomean']}, none < "
              f"{GOALS['floor']}, ours >= {GOALS['vs_iree']}x the best correct IREE form ({IREE}) on every problem.",
              ""]  # fmt: skip
    head = ["rows", "cuDNN/ours geomean", "min", *(f"{t} geomean (rows)" for t in s["types"]), "below floor",
            "ours < IREE (of compared)", "no correct IREE kernel", *s["goals"]]  # fmt: skip
    cells = [str(s["count"]), ct._f(s["geomean"]), ct._f(s["min"]),
             *(f"{ct._f(v['geomean'])} ({v['count']})" for v in s["types"].values()), str(len(s["below_floor"])),
             f"{len(s['iree_slower'])} ({s['iree_compared']})", str(len(s["no_iree"])),
             *(ct._mark(g) for g in s["goals"].values())]  # fmt: skip
    lines += ["| " + " | ".join(head) + " |", "|---" * len(head) + "|", "| " + " | ".join(cells) + " |"]
    lines += ["", "| key | ours µs | cuDNN µs | cuDNN/ours | IREE fusilli µs | IREE/ours | plan's kernel "
              "| path: rule |", "|---" * 8 + "|"]  # fmt: skip
    for r in rows:
        ours, cud, iree = ct.kernel_us(r, OURS), ct.kernel_us(r, "cudnn"), ct.kernel_us(r, IREE)
        lines.append(f"| {r['key']} | {ct._status(r, OURS)} | {ct._status(r, 'cudnn')} "
                     f"| {ct._f(cud / ours if ours and cud else None)} | {_iree_cell(r)} "
                     f"| {ct._f(iree / ours if ours and iree else None)} | {r.get('kernel', '-')} "
                     f"| {r.get('path', '-')}: {r.get('rule', '-')} |")  # fmt: skip
    lines += ["", f"- below {GOALS['floor']}x cuDNN: {', '.join(s['below_floor']) or 'none'}",
              f"- slower than IREE's form: {', '.join(s['iree_slower']) or 'none'}",
              f"- no correct IREE kernel (known wrong, not built, WRONG or failed): {len(s['no_iree'])}"]  # fmt: skip
    if s["wrong"]:
        lines.append(f"- WRONG (ours): {', '.join(s['wrong'])}")
    if s["unmeasured"]:
        lines.append(f"- not compared (ours or cuDNN without a correct time): {', '.join(s['unmeasured'])}")
    return "\n".join(lines) + "\n"


def _select_table(types: tuple[str, ...], path: Path = SUITE) -> str:
    """The rows in the measuring order with the plan a user gets (no compiler, no GPU)."""
    lines = ["| key | plan's kernel | path: rule | IREE |", "|---" * 4 + "|"]
    for i, (name, p) in enumerate(problems(types, path)):
        vs, extra = contenders(p)
        lines.append(f"| {i:03d}-{name}.{p.dtype} | {extra['kernel']} | {extra['path']}: {extra['rule']} "
                     f"| {'built' if len(vs) > 1 else extra['iree_note']} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = Parser(prog="heldback.py", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("select")
    s.add_argument("--types", default=",".join(TYPES))
    s.add_argument("--set", type=Path, default=SUITE, help="the held-back set's .tsv (default dense2d.tsv)")
    c = sub.add_parser("compile")
    c.add_argument("--set", type=Path, default=SUITE, help="the held-back set's .tsv (default dense2d.tsv)")
    c.add_argument("dir", type=Path)
    c.add_argument("--types", default=",".join(TYPES), help=f"some of {','.join(TYPES)} (that order)")
    c.add_argument("--workers", type=int, default=2)
    c.add_argument("--cache", type=Path, help="the kernel cache's folder (default the user's)")
    ct.add_run_report(sub)
    args = ap.parse_args(argv)
    types = TYPES
    if args.cmd in ("select", "compile"):
        try:
            types = known_types(args.types)
        except ValueError as e:
            ap.error(f"--{e}")
    if args.cmd in ("select", "compile") and not args.set.is_file():
        ap.error(f"--set: no such file: {args.set}")
    if args.cmd == "compile" and args.workers < 1:
        ap.error(f"--workers: expected a count >= 1, got {args.workers}")
    if args.cmd == "select":
        print(_select_table(types, args.set), end="")
        return 0
    if args.cmd == "compile":
        return compile_all(args.dir, types, args.workers, args.cache, args.set)
    if args.cmd == "run":
        return run(args.dir, args.out)
    rows, device = ct.read_rows(args.results)
    print(report(rows, device, args.card, args.command), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
