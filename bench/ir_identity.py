"""What a refactor must not change, written out and compared between two checkouts (docs/plan.md): for every
suite problem x element type x target, the lowered IR and the ``.vmfb`` program of ``compile_op`` (no cache),
and what ``select`` chooses.

    python bench/ir_identity.py dump DIR [--jobs 2]   # DIR/<suite>.<name>.<dtype>.<target>.{mlir,vmfb,select}
    python bench/ir_identity.py compare BEFORE AFTER  # byte-identical, bytes IREE itself varies masked
    python bench/ir_identity.py dump DIR --sample --no-vmfb  # a kernel-family sample, our passes' IR only

``--sample`` takes, instead of every suite problem x type x target, a sample that reaches every explicit
kernel family (sm_80 GEMM, merged, folded, StreamK, wave-specialized, depthwise; sm_90a GEMM/conv, StreamK,
fp8; CDNA and RDNA through gfx942/gfx1100/gfx1200) by the pipeline options that ask for them.
``--no-vmfb`` writes every stage of our pipeline's IR (``CompiledOp.stages``) without the IREE compile: for a
GPU target the ``.vmfb`` is IREE's deterministic function of that IR, so identical IR is an identical program.

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


# the pipeline options that reach each explicit kernel family (docs/explicit-kernels.md), the targets they take
# and the layout they are asked for in (2: channels last; 4: NGCHW, the sm_80 StreamK and folded kernels')
_SAMPLE_FORMS: tuple[tuple[str, dict, tuple[str, ...], int], ...] = (
    ("default", {}, ("sm_80", "sm_90a", "gfx942", "gfx1100", "gfx1200"), 2),
    ("explicit", {"strategy": "explicit"}, ("sm_80", "sm_90a", "gfx942", "gfx1100", "gfx1200"), 2),
    ("l4", {}, ("sm_80", "sm_90a", "gfx942"), 4),
    ("l4explicit", {"strategy": "explicit", "layout4": "gather"}, ("sm_80", "gfx942", "gfx1100"), 4),
    ("streamk", {"strategy": "explicit", "streamk": "auto"}, ("sm_90a",), 2),
    ("streamk4", {"strategy": "explicit", "streamk": "auto", "layout4": "gather"}, ("sm_80",), 4),
    ("tree", {"strategy": "explicit", "streamk": 64, "streamk_fixup": "tree", "layout4": "gather"}, ("sm_80",), 4),
    ("wavespec", {"strategy": "explicit", "producers": 2}, ("sm_80",), 2),
    ("fold", {"strategy": "explicit", "layout4": "fold"}, ("sm_80",), 4),
    ("split", {"strategy": "explicit", "k_batch": 4}, ("sm_80", "sm_90a", "gfx942"), 2),
    ("narrow", {"strategy": "explicit", "tile_n": 64}, ("sm_80", "sm_90a"), 2),
    ("nomerge", {"strategy": "explicit", "merge_groups": 1}, ("sm_80",), 2),
)
_SAMPLE_SUITES = ("seeds", "models", "ck_test_grouped_convnd_bwd_weight", "classes")


def _sample_jobs() -> list[tuple[str, str, str, str, str]]:
    """(suite, name, dtype, target, form): each form x target over every ``step``-th suite problem (rotated by
    form, so the forms see different problems), f16 and bf16 alternating, and the fp8 problems."""
    from convbw_mlir.suites import load_suite

    problems = [(suite, name) for suite in _SAMPLE_SUITES for name, _ in load_suite(suite)]
    out = []
    for f, (form, _, targets, _) in enumerate(_SAMPLE_FORMS):
        step = 2 if form in ("default", "explicit") else 4
        for i, (suite, name) in enumerate(problems[f % step :: step]):
            for j, target in enumerate(targets):
                out.append((suite, name, ("f16", "bf16")[(i + j) % 2], target, form))
    out += [("fp8", name, "fp8", "sm_90a", form) for name in _FP8 for form in ("default", "split")]
    return out


# fp8 problems (tests/test_fp8_plan.py): the sm_90a fp8 GEMM's K-major copies, strided and split
_FP8 = {
    "resnet_1x1": dict(groups=1, batch=256, in_channels=1024, out_channels=256, input_size=(14, 14),
                       filter_size=(1, 1), dtype="e4m3", dy_dtype="e5m2"),
    "strided_1x1": dict(groups=1, batch=2, in_channels=128, out_channels=64, input_size=(16, 12), filter_size=(1, 1),
                        stride=2, dtype="e5m2", dy_dtype="e4m3"),
}  # fmt: skip


def _problem(suite: str, name: str, dtype: str, layout: int = 2):
    import dataclasses

    from convbw_mlir.problem import ConvBwdWeightProblem
    from convbw_mlir.suites import load_suite

    if suite == "fp8":
        return ConvBwdWeightProblem(**_FP8[name])
    problem = dict(load_suite(suite, dtype=dtype))[name]
    return problem if problem.layout == layout else dataclasses.replace(problem, layout=layout)


def _stages(problem, target: str, options: dict) -> str:
    """Every stage of our pipeline's IR (what ``compile_op(...).stages`` holds), without IREE's compile."""
    from convbw_mlir.dialects import convbw

    from convbw_mlir.build.compile import run_pipeline
    from convbw_mlir.ir_imports import new_context
    from convbw_mlir.limits import check_limits
    from convbw_mlir.pipelines import for_target
    from convbw_mlir.targets import resolve

    try:
        check_limits(problem, resolve(target))
        pipeline = for_target(target, **options)
        with new_context() as ctx:
            module = convbw.build_module(problem, None)
            text = f"// stage convbw\n{module}"
            run_pipeline(module, pipeline, ctx)
            return f"{text}// stage linalg\n{module}"
    except Exception as e:  # a refusal is part of the record, compared like the IR
        return f"ERROR {type(e).__name__}: {e}"


def _dump_sample_one(out: Path, job: tuple[str, str, str, str, str]) -> None:
    suite, name, dtype, target, form = job
    options, layout = next((o, lay) for f, o, _, lay in _SAMPLE_FORMS if f == form)
    text = _stages(_problem(suite, name, dtype, layout), target, options)
    (out / f"{suite}.{name}.{dtype}.{target}.{form}.mlir").write_text(text)


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


def dump(out: Path, jobs: int, sample: bool = False, vmfb: bool = True) -> int:
    if sample and vmfb:
        raise ValueError("--sample: dumps our passes' IR only; give --no-vmfb too")
    if not vmfb and not sample:
        raise ValueError("--no-vmfb: with --sample only")
    out.mkdir(parents=True, exist_ok=True)
    todo, one = (_sample_jobs(), _dump_sample_one) if sample else (_jobs(), _dump_one)
    with ProcessPoolExecutor(jobs) as pool:
        for done, _ in enumerate(pool.map(one, [out] * len(todo), todo, chunksize=4), 1):
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
    d.add_argument("--sample", action="store_true", help="the kernel-family sample instead of every suite problem")
    d.add_argument("--no-vmfb", action="store_true", help="our passes' IR only, without IREE's compile")
    cmp_ = sub.add_parser("compare")
    cmp_.add_argument("before", type=Path)
    cmp_.add_argument("after", type=Path)
    cmp_.add_argument("--strip-plans", action="store_true")
    args = ap.parse_args(argv)
    if args.cmd == "dump":
        return dump(args.out, args.jobs, args.sample, not args.no_vmfb)
    return compare(args.before, args.after, args.strip_plans)


if __name__ == "__main__":
    sys.exit(main())
