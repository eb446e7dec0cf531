"""Every plan kind that claims to be deterministic, run 10 times on the GPU: dW bitwise the same each time;
and its workspace against what IREE allocates.

    python bench/determinism.py compile .art/determinism/art            (here: needs the IREE compiler)
    python bench/determinism.py run .art/determinism/art --out OUT       (GPU machine: runtime only, from a wheel)
    python bench/determinism.py report OUT.json                          (the markdown again)

Compile side: one kernel for sm_80 per plan kind (:data:`CASES`: explicit split-K and unsplit, StreamK linear
and tree, wave specialization, IREE codegen's MMA tile split and unsplit, SIMT batch and rows splits, IREE's
own config, GEMM forms, bf16, 1-D; and IREE with fusilli's split reduction, which claims nothing), each
compiled in a child process; the manifest records the plan, its ``workspace_bytes`` and ``deterministic``,
and the buffers IREE allocates for a call (its stream phase: ``build.iree.device_allocations``), so the
workspace is checked before any GPU time: IREE's transient and constant buffers at most the plan's number.

Run side: each kernel in its own child process (an illegal address ends only that one): random inputs,
x and dy each followed by NaN (a read past them shows), dW checked once against float64, then ``--runs``
calls on the same inputs, every dW compared bitwise with the first; the device memory the driver reports
in use before the first call and after the last (IREE's pools keep what they took: an upper bound on the
workspace, at the pool's granularity) beside the plan's number. ``OUT.json`` and ``OUT.md``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from convbw_mlir.measure.children import run_child

TARGET = "sm_80"
RUNS = 10
CHILD_TIMEOUT_S = 300
DENSE = "2 1 32 64 64 3 3 14 14 1 1 1 1 1 1 1 1"  # padded 3x3: split-K, StreamK and the pad copy all apply
# (name, ckProfiler line, problem fields replaced, plan options; "form" for an IREE form)
CASES = [
    ("explicit-splitk", DENSE, {}, {}),
    ("explicit-unsplit", DENSE, {}, {"strategy": "explicit", "k_batch": 1}),
    (
        "explicit-splitk-bf16-f32out",
        DENSE,
        {"dtype": "bf16", "dw_dtype": "f32"},
        {"strategy": "explicit", "k_batch": 4},
    ),
    ("streamk-linear-16", DENSE, {"layout": 4}, {"strategy": "explicit", "streamk": 16}),
    ("streamk-linear-auto", DENSE, {"layout": 4}, {"strategy": "explicit", "streamk": "auto"}),
    ("streamk-tree-100", DENSE, {"layout": 4}, {"strategy": "explicit", "streamk": 100, "streamk_fixup": "tree"}),
    ("wavespec-2", DENSE, {}, {"strategy": "explicit", "producers": 2}),
    ("wavespec-4", DENSE, {}, {"strategy": "explicit", "producers": 4}),
    ("mma-split4", DENSE, {}, {"strategy": "codegen", "k_batch": 4}),
    ("mma-unsplit", DENSE, {}, {"strategy": "codegen", "k_batch": 1}),
    ("simt-batch-split", "2 32 8 1 1 3 3 28 28 1 1 1 1 1 1 1 1", {}, {}),
    ("simt-rows-split", "2 32 8 1 1 3 3 28 28 1 1 1 1 1 1 1 1", {}, {"k_batch": "rows"}),
    ("iree-grouped", "2 4 16 32 32 3 3 14 14 1 1 1 1 1 1 1 1", {}, {"strategy": "codegen"}),
    ("gemm-explicit", "2 1 32 256 64 1 1 14 14 1 1 1 1 0 0 0 0", {}, {}),
    ("gemm-strided-codegen", "2 1 64 256 64 1 1 28 28 2 2 1 1 0 0 0 0", {}, {"strategy": "codegen"}),
    ("explicit-1d", "1 1 16 64 64 3 200 1 1 1 1", {}, {}),
    ("iree-fusilli", DENSE, {}, {"form": "iree_fusilli"}),
]


def _problem(ck: str, fields: dict) -> Any:
    from convbw_mlir.problem import ConvBwdWeightProblem

    p = ConvBwdWeightProblem.from_ck(ck)
    return p.with_(**fields) if fields else p


def _build(name: str, ck: str, fields: dict, options: dict, target: str = TARGET) -> dict[str, Any]:
    """In a child process: the case's kernel, its plan's properties and IREE's buffers."""
    from convbw_mlir.build.iree import device_allocations
    from convbw_mlir.dispatch.build import compile_variant
    from convbw_mlir.dispatch.variants import Variant
    from convbw_mlir.plan import decide

    p = _problem(ck, fields)
    if "form" in options:
        variant = Variant(options["form"])
    else:
        variant = Variant("convbw", decide(p, target, **options))
    op = compile_variant(p, target, variant)
    plan = op.plan
    return {"name": name, "problem": p.to_dict(), "options": options, "vmfb": op.vmfb,
            "plan": plan.to_dict() if plan else None, "flags": variant.flags,
            "workspace_bytes": plan.workspace_bytes if plan else None,
            "deterministic": plan.deterministic if plan else not any("split-reduction" in f for f in variant.flags),
            "iree_allocations": device_allocations(op.stages["linalg"], target, variant.flags)}  # fmt: skip


def compile_side(folder: Path, only: str = "", target: str = TARGET) -> int:
    from convbw_mlir.build.isolate import call
    from convbw_mlir.files import atomic_directory

    entries = []
    with atomic_directory(folder) as tmp:
        for name, ck, fields, options in CASES:
            if only not in name:
                continue
            try:
                rec = call(_build, name, ck, fields, options, target, what=f"{name} for {target}", timeout=900)
            except Exception as e:  # noqa: BLE001 - a case that does not build is recorded, the others go on
                entries.append({"name": name, "error": (str(e).splitlines() or [type(e).__name__])[0][:300]})
                print(f"{name}: not built: {entries[-1]['error']}", file=sys.stderr)
                continue
            (tmp / f"{name}.vmfb").write_bytes(rec.pop("vmfb"))
            rec["vmfb"] = f"{name}.vmfb"
            scratch = sum(rec["iree_allocations"].get(k, 0) for k in ("transient", "constant"))
            rec["iree_scratch_bytes"] = scratch
            rec["workspace_ok"] = rec["workspace_bytes"] is None or scratch <= rec["workspace_bytes"]
            entries.append(rec)
            print(f"{name}: workspace {rec['workspace_bytes']} B, IREE's scratch {scratch} B", file=sys.stderr)
        (tmp / "manifest.json").write_text(json.dumps({"target": target, "cases": entries}, indent=1) + "\n")
    return 0


def _device_used(index: int = 0) -> int | None:
    """Bytes in use on the GPU, as the driver reports them (nvidia-smi), or None."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i",
                              str(index)], capture_output=True, text=True, timeout=30).stdout  # fmt: skip
        return int(out.strip().splitlines()[0]) * (1 << 20)
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return None


def run_one(folder: Path, name: str, runs: int) -> dict[str, Any]:
    """In a child: one kernel ``runs`` times on the same fenced inputs; bitwise comparison with the first."""
    import numpy as np

    from convbw_mlir.problem import ConvBwdWeightProblem
    from convbw_mlir.reference import ToleranceError, assert_close, random_inputs, reference
    from convbw_mlir.runtime import Kernel

    manifest = json.loads((folder / "manifest.json").read_text())
    rec = next(e for e in manifest["cases"] if e["name"] == name)
    p = ConvBwdWeightProblem.from_dict(rec["problem"])
    x, dy = random_inputs(p, seed=7)
    driver = "cuda" if manifest["target"].startswith("sm_") else "local-task"  # host: the script's own check
    kernel = Kernel((folder / rec["vmfb"]).read_bytes(), driver, None)
    xd, dyd = kernel.to_device_fenced(x), kernel.to_device_fenced(dy)  # NaN after each: over-reads show
    before = _device_used()
    outs = []
    for _ in range(runs):
        outs.append(np.asarray(kernel(xd, dyd).to_host()).copy())
    after = _device_used()
    growth = None if before is None or after is None else after - before
    row: dict[str, Any] = {"name": name, "runs": runs, "claims_deterministic": rec["deterministic"],
                           "workspace_bytes": rec["workspace_bytes"], "iree_scratch_bytes": rec["iree_scratch_bytes"],
                           "device_used_growth_bytes": growth}  # fmt: skip
    first = outs[0].tobytes()
    row["distinct_results"] = len({o.tobytes() for o in outs})
    row["identical"] = all(o.tobytes() == first for o in outs)
    row["max_abs_diff_to_first"] = float(max(np.max(np.abs(o.astype(np.float64) - outs[0])) for o in outs))
    row["sha256_first"] = hashlib.sha256(first).hexdigest()[:16]
    try:
        row["error_vs_float64"] = assert_close(p, outs[0], reference(p, x, dy), matrix_cores=True)
        row["correct"] = True
    except ToleranceError as e:
        row["correct"], row["error_vs_float64"] = False, str(e).splitlines()[0][:200]
    return row


def run_side(folder: Path, out: Path, runs: int) -> int:
    manifest = json.loads((folder / "manifest.json").read_text())
    rows = []
    for e in manifest["cases"]:
        if "error" in e:
            rows.append({"name": e["name"], "status": "not built", "error": e["error"]})
            continue
        t0 = time.perf_counter()
        cmd = [sys.executable, __file__, "run-one", str(folder), e["name"], "--runs", str(runs)]
        got = run_child(cmd, CHILD_TIMEOUT_S)
        if got.returncode is None:
            row = {"name": e["name"], "status": "timed out"}
        elif got.row is not None:
            row = got.row
        else:
            row = {
                "name": e["name"],
                "status": "crashed",
                "error": (got.stderr.strip().splitlines() or ["?"])[-1][:300],
            }
        row.setdefault("status", "ok")
        row["wall_s"] = round(time.perf_counter() - t0, 1)
        rows.append(row)
        print(json.dumps(row), file=sys.stderr)
    doc = {"target": manifest["target"], "device": _gpu_name(), "date": time.strftime("%Y-%m-%d"), "rows": rows}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")
    out.with_suffix(".md").write_text(report(doc))
    bad = [r for r in rows if r.get("claims_deterministic") and not r.get("identical")]
    return 1 if bad else 0


def _gpu_name() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30).stdout  # fmt: skip
        return out.strip().splitlines()[0] if out.strip() else None
    except (OSError, subprocess.SubprocessError):
        return None


def report(doc: dict[str, Any]) -> str:
    """Markdown: per kernel, its claim, whether the runs were identical, correctness and workspace."""
    lines = [f"# Determinism and workspace on {doc.get('device')} ({doc['target']} code, {doc.get('date')})", "",
             "| kernel | claims deterministic | runs | identical | distinct dW | max diff | correct | workspace B "
             "| IREE scratch B | device growth B |", "|---|---|---:|---|---:|---:|---|---:|---:|---:|"]  # fmt: skip
    for r in doc["rows"]:
        if r.get("status") != "ok":
            lines.append(f"| {r['name']} | | | {r.get('status')}: {r.get('error', '')} | | | | | | |")
            continue
        lines.append(f"| {r['name']} | {r['claims_deterministic']} | {r['runs']} | {r['identical']} "
                     f"| {r['distinct_results']} | {r['max_abs_diff_to_first']:.3g} | {r['correct']} "
                     f"| {r['workspace_bytes']} | {r['iree_scratch_bytes']} "
                     f"| {r['device_used_growth_bytes']} |")  # fmt: skip
    ok = [r for r in doc["rows"] if r.get("status") == "ok"]
    claimed = [r for r in ok if r["claims_deterministic"]]
    lines += ["", f"{sum(r['identical'] for r in claimed)} of {len(claimed)} kernels that claim determinism gave "
              f"bitwise identical dW on every run; {sum(r['correct'] for r in ok)} of {len(ok)} correct; IREE's "
              "scratch within the plan's workspace on "
              f"{sum(r['workspace_bytes'] is None or r['iree_scratch_bytes'] <= r['workspace_bytes'] for r in ok)}"
              f" of {len(ok)}."]  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="determinism.py", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compile")
    c.add_argument("dir", type=Path)
    c.add_argument("--only", default="", help="cases whose name contains this")
    c.add_argument("--target", default=TARGET, help="sm_80 (host: a check of the script on the CPU)")
    r = sub.add_parser("run")
    r.add_argument("dir", type=Path)
    r.add_argument("--out", type=Path, required=True, help="OUT.json and OUT.md are written")
    r.add_argument("--runs", type=int, default=RUNS)
    one = sub.add_parser("run-one")
    one.add_argument("dir", type=Path)
    one.add_argument("name")
    one.add_argument("--runs", type=int, default=RUNS)
    rep = sub.add_parser("report")
    rep.add_argument("json", type=Path)
    args = ap.parse_args(argv)
    if args.cmd == "compile":
        return compile_side(args.dir, args.only, args.target)
    if args.cmd == "run":
        return run_side(args.dir, args.out, args.runs)
    if args.cmd == "run-one":
        print(json.dumps(run_one(args.dir, args.name, args.runs)), flush=True)
        import os

        os._exit(0)  # IREE's runtime objects die badly with the interpreter (bench/harness.py: exit_child)
    print(report(json.loads(args.json.read_text())), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
