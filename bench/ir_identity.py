"""What a refactor must not change, written out and compared between two checkouts (docs/plan.md): for every
suite problem x element type x target, the lowered IR and the ``.vmfb`` program of ``compile_op`` (no cache),
and what ``select`` chooses.

    python bench/ir_identity.py dump DIR [--jobs 2]   # DIR/<suite>.<name>.<dtype>.<target>.{mlir,vmfb,select}
    python bench/ir_identity.py compare BEFORE AFTER  # byte-identical, bytes IREE itself varies masked

IREE's host (llvm-cpu) program is not reproducible run to run: its embedded ELF carries a few bytes of
uninitialized memory (a pointer's value; the zip entry's CRC follows them). ``dump`` compiles each host
problem twice and records the byte offsets where the two differ (``.unstable``); ``compare`` ignores the
aligned 8-byte words holding those offsets (two compiles can agree on a pointer's high byte by chance) and
nothing else. ``compare`` also strips ``plan = {...}`` entries from the IR when ``--strip-plans``
is given (the refactor that added them). Exit code 1 if anything differs.
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

SUITES = ("seeds", "models", "ck_test_grouped_convnd_bwd_weight")
DTYPES = ("f16", "bf16", "f32")


def _jobs() -> list[tuple[str, str, str, str]]:
    from convbw_mlir.suites import load_suite
    from convbw_mlir.targets import TARGETS

    return [(suite, name, dtype, target) for dtype in DTYPES for suite in SUITES
            for name, _ in load_suite(suite, dtype=dtype) for target in TARGETS]  # fmt: skip


def _compile(problem, target: str) -> tuple[str, bytes]:
    from convbw_mlir import compile_op

    try:
        op = compile_op(problem, target, cache=False)
    except Exception as e:  # a failure is part of the record, compared like the IR
        return f"ERROR {type(e).__name__}: {e}", b""
    return op.stages["linalg"], op.vmfb


def _dump_one(out: Path, job: tuple[str, str, str, str]) -> None:
    from convbw_mlir.dispatch import select
    from convbw_mlir.suites import load_suite

    suite, name, dtype, target = job
    problem = dict(load_suite(suite, dtype=dtype))[name]
    stem = f"{suite}.{name}.{dtype}.{target}"
    text, vmfb = _compile(problem, target)
    (out / f"{stem}.mlir").write_text(text)
    (out / f"{stem}.vmfb").write_bytes(vmfb)
    if target == "host" and vmfb:
        again = _compile(problem, target)[1]
        unstable = [i for i, (a, b) in enumerate(zip(vmfb, again)) if a != b] if len(again) == len(vmfb) else None
        (out / f"{stem}.unstable").write_text(json.dumps(unstable))
    try:
        chosen = str(select(problem, target))
    except Exception as e:
        chosen = f"ERROR {type(e).__name__}: {e}"
    (out / f"{stem}.select").write_text(chosen)


def dump(out: Path, jobs: int) -> int:
    out.mkdir(parents=True, exist_ok=True)
    todo = _jobs()
    with ProcessPoolExecutor(jobs) as pool:
        for done, _ in enumerate(pool.map(_dump_one, [out] * len(todo), todo, chunksize=4), 1):
            if done % 100 == 0:
                print(f"{done}/{len(todo)}", flush=True)
    print(f"{len(todo)} problems x targets in {out}")
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


def _same(before: Path, after: Path, strip: bool) -> bool:
    if not after.exists():
        return False
    if before.suffix == ".mlir":
        new = after.read_text()
        return before.read_text() == (strip_plans(new) if strip else new)
    old, new = before.read_bytes(), after.read_bytes()
    if old == new:
        return True
    mask = before.parent / f"{before.stem}.unstable"
    unstable = json.loads(mask.read_text()) if mask.exists() else None
    if unstable is None or len(old) != len(new):
        return False
    words = {i // 8 for i in unstable}  # the varying value is a pointer: its whole aligned 8-byte word may vary
    return all(a == b or i // 8 in words for i, (a, b) in enumerate(zip(old, new)))


def compare(before: Path, after: Path, strip: bool = False) -> int:
    files = [f for f in sorted(before.iterdir()) if f.suffix in (".mlir", ".vmfb", ".select")]
    differ = [f.name for f in files if not _same(f, after / f.name, strip)]
    extra = sorted({f.name for f in after.iterdir()} - {f.name for f in before.iterdir()})
    for kind in (".mlir", ".vmfb", ".select"):
        n = sum(1 for f in files if f.suffix == kind)
        bad = sum(1 for name in differ if name.endswith(kind))
        print(f"{kind[1:]:>6}: {n - bad} of {n} identical")
    masked = sum(1 for f in before.glob("*.unstable") if json.loads(f.read_text()))
    print(f"(host programs with IREE's own varying bytes masked: {masked})")
    for name in differ[:40]:
        print(f"  differs: {name}")
    for name in extra[:10]:
        print(f"  only after: {name}")
    return 1 if differ or extra else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump")
    d.add_argument("out", type=Path)
    d.add_argument("--jobs", type=int, default=2)
    cmp_ = sub.add_parser("compare")
    cmp_.add_argument("before", type=Path)
    cmp_.add_argument("after", type=Path)
    cmp_.add_argument("--strip-plans", action="store_true")
    args = ap.parse_args(argv)
    if args.cmd == "dump":
        return dump(args.out, args.jobs)
    return compare(args.before, args.after, args.strip_plans)


if __name__ == "__main__":
    sys.exit(main())
