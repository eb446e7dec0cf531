"""Lowered IR of every suite problem x element type x target, written out and compared between two checkouts:
how a refactor shows it changed no decision (docs/plan.md).

    python bench/ir_identity.py dump DIR              # one .mlir per suite problem x f16/bf16/f32 x target
    python bench/ir_identity.py compare BEFORE AFTER  # byte-identical after removing `plan = {...}` entries

``compare`` strips the plan entries (they record decisions; the IR around them is what a decision
changes) and prints how many modules are identical and the first that are not; exit code 1 if any differ.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

SUITES = ("seeds", "models", "ck_test_grouped_convnd_bwd_weight")


def dump(out: Path) -> int:
    from convbw_mlir.bench.suites import load_suite
    from convbw_mlir.compiler import lowered_text
    from convbw_mlir.pipelines import for_target
    from convbw_mlir.targets import TARGETS

    out.mkdir(parents=True, exist_ok=True)
    count = 0
    for dtype in ("f16", "bf16", "f32"):
        for suite in SUITES:
            for name, problem in load_suite(suite, dtype=dtype):
                for target in TARGETS:
                    try:
                        text = lowered_text(problem, for_target(target))
                    except Exception as e:  # a failure is part of the record, compared like the IR
                        text = f"ERROR {type(e).__name__}: {e}"
                    (out / f"{suite}.{name}.{dtype}.{target}.mlir").write_text(text)
                    count += 1
    print(f"{count} modules in {out}")
    return 0


def strip_plans(text: str) -> str:
    """``text`` without its ``plan = {...}`` dictionary entries (nested braces included)."""
    out, i, key = [], 0, "plan = {"
    while (j := text.find(key, i)) >= 0:
        out.append(text[i:j])
        depth, k = 0, j + len(key) - 1
        while True:
            depth += {"{": 1, "}": -1}.get(text[k], 0)
            if depth == 0:
                break
            k += 1
        k += 1
        if text[k : k + 2] == ", ":
            k += 2
        elif out[-1].endswith(", "):
            out[-1] = out[-1][:-2]
        i = k
    return "".join(out) + text[i:]


def compare(before: Path, after: Path) -> int:
    differ = [f.name for f in sorted(before.iterdir()) if f.read_text() != strip_plans((after / f.name).read_text())]
    total = sum(1 for _ in before.iterdir())
    print(f"{total - len(differ)} identical, {len(differ)} different")
    for name in differ[:40]:
        print(f"  {name}")
    return 1 if differ else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("dump").add_argument("out", type=Path)
    cmp_ = sub.add_parser("compare")
    cmp_.add_argument("before", type=Path)
    cmp_.add_argument("after", type=Path)
    args = ap.parse_args(argv)
    return dump(args.out) if args.cmd == "dump" else compare(args.before, args.after)


if __name__ == "__main__":
    sys.exit(main())
