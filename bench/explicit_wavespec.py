"""Wave specialization against the plain pipeline: the explicit sm_80 kernel in layout 2, at the same tiling and
split-K, with 4:4 and 4:2 consumer:producer warps (docs/explicit-kernels.md "Wave specialization").

Compile here (needs the IREE compiler), run there (needs iree-base-runtime, numpy, torch):

    .venv/bin/python bench/explicit_wavespec.py compile DIR        # sm_80 kernels + DIR/manifest.json
    python3 explicit_wavespec.py run DIR --out OUT --budget 110    # on the GPU machine, beside explicit_conv.py

Problems: those of bench/explicit_conv.py (the dense 2-D suite problems in layout 2 and ResNet-50's 3x3 and 1x1
layers). Per problem the tiling ``T`` is the plan's rule's where it has 4 warps (64x128, 128x128), else 128x128
(the rule's 128x256 has 8 warps: no room for producers in the register file); contenders: ``plain`` (the
plain pipeline at ``T``, split-K by the kernel's rule), ``ws44`` and ``ws42`` (4 and 2 producer warps, same
``T``, same split), and ``default`` (the plan's own choice, where it is not ``plain``: for scale).

The run side is bench/harness.py's with explicit_conv.py's children: each contender in its own child process
(explicit_conv.py ``run-one``), checked against a float64 reference on the GPU, kernel time by CUPTI (single calls
and sustained). Contenders start in priority order, so a cut-off run still answers the question: four problems
with all contenders first, then plain/4:4/4:2 of the rest, then the defaults. Writes
``OUT/explicit_wavespec.{md,json}`` (``report`` rebuilds them from a cut-off run's ``rows.json``).

CPU rehearsal: ``compile DIR --smoke`` (host kernels of the product's default in place of ours, two small
problems) and ``EXPLICIT_CONV_DEVICE=cpu``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import explicit_conv as conv  # beside this script: its problems, and its children check and time ours
import harness  # bench/harness.py, beside this script (its docstring says how)

KINDS = ("plain", "ws44", "ws42", "default")
PRODUCERS = {"ws44": 4, "ws42": 2}
FIRST = ("resnet50_3x3_256_n256_14", "large_3x3_256_n64_56", "streamk_3x3_128_n32_28", "retina_k36_25")
FOUR_WARPS = {(64, 128): (2, 2), (128, 128): (2, 2)}  # tile -> subgroups (consumer warps 32x64 / 64x64)


def _tiling(plan) -> dict[str, int]:
    """Tile options of the 4-warp tiling compared: the rule's where it has 4 warps, else 128x128."""
    m, n = (plan.tile.m, plan.tile.n) if (plan.tile.m, plan.tile.n) in FOUR_WARPS else (128, 128)
    sm, sn = FOUR_WARPS[(m, n)]
    return {"tile_m": m, "tile_n": n, "subgroups_m": sm, "subgroups_n": sn}


def compile_all(folder: Path, smoke: bool = False, only: list[str] | None = None) -> None:
    """Compile every contender of every problem into ``folder`` (vmfbs, manifest.json)."""
    from convbw_mlir import compile_op
    from convbw_mlir.build.iree import CompileError
    from convbw_mlir.plan import PlanError, decide

    folder.mkdir(parents=True, exist_ok=True)
    entries, refused = [], {}
    for name, p in conv.problems(smoke).items():
        if only and not any(o in name for o in only):
            continue
        t0 = time.time()
        suite = name not in conv.EXTRA
        kinds = {}
        try:
            if smoke:  # no sm_80 on the CPU: the product's host kernel stands in for each (plumbing only)
                kinds = {k: compile_op(p, "host", isolate=True, cache=False) for k in KINDS}
            else:
                default = decide(p, "sm_80", strategy="explicit")
                tiling = _tiling(default)
                plain = decide(p, "sm_80", strategy="explicit", **tiling)
                opts = {"strategy": "explicit", "k_batch": plain.k_batch, **tiling}
                kinds["plain"] = compile_op(p, "sm_80", isolate=True, cache=False, **opts)
                for kind, producers in PRODUCERS.items():
                    kinds[kind] = compile_op(p, "sm_80", isolate=True, cache=False, producers=producers, **opts)
                if default != plain:
                    kinds["default"] = compile_op(p, "sm_80", strategy="explicit", isolate=True, cache=False)
        except (PlanError, CompileError) as e:
            refused[name] = str(e)
        for kind, op in kinds.items():
            (folder / f"{kind}_{name}.vmfb").write_bytes(op.vmfb)
            entries.append(conv._entry(name, kind, p, op.plan, suite))
        print(f"{name}: {', '.join(kinds)} in {time.time() - t0:.1f} s", flush=True)
    harness.write_manifest(folder, {"target": "host" if smoke else "sm_80", "entries": entries, "refused": refused,
                                    "seed": conv.SEED, "layout": 2})  # fmt: skip


def batches(entries: list[dict]) -> list[list[str]]:
    """One contender a child, in priority order: the FIRST problems' four, then plain/4:4/4:2, then defaults."""
    names = {(e["problem"], e["kind"]): e["name"] for e in entries}
    problems = list(dict.fromkeys(e["problem"] for e in entries))
    first = [p for p in FIRST if p in problems] or problems[:2]
    rest = [p for p in problems if p not in first]
    order = [(p, k) for p in first for k in KINDS]
    order += [(p, k) for p in rest for k in KINDS[:3]] + [(p, "default") for p in rest]
    return [[names[key]] for key in order if key in names]


def run(folder: Path, out: Path, budget: float, jobs: int, child_limit: float) -> int:
    start = time.time()
    manifest = harness.load_manifest(folder)
    rows = harness.run_batches(conv.__file__, folder, out, batches(manifest["entries"]), budget, jobs, start,
                               child_limit)  # fmt: skip
    return report(rows, manifest, out, harness.device_name(conv.DEVICE), wall=time.time() - start)


def report(rows: list[dict], manifest: dict, out: Path, device: str, date: str | None = None,
           wall: float | None = None) -> int:  # fmt: skip
    """OUT/explicit_wavespec.json and .md: per problem plain, 4:4, 4:2 (single and sustained), the speedups."""
    by, plans = harness.rows_by_problem(rows), harness.manifest_plans(manifest)
    order = list(dict.fromkeys(e["problem"] for e in manifest["entries"]))

    def tile(plan: Any) -> str:
        return harness.tile_split(plan) or "-"

    def us(r: dict, key: str = "single_us") -> float | None:
        return r.get(key) if r.get("correct") else None

    def launch(r: dict) -> str:  # CUPTI's "blocks per SM" is the grid over the SMs, not residency: left out
        regs = (r.get("launch") or {}).get("registers per thread")
        return "-" if regs is None else str(regs)

    def ok(r: dict) -> str:
        for key in ("crashed", "skipped", "error"):
            if key in r:
                return key
        return "-" if not r else ("yes" if r.get("correct") else f"WRONG ({r.get('max_rel_err', 0):.1e})")

    f = harness.cell
    lines = [f"# Wave specialization, explicit sm_80 kernel, layout 2, f16: {device}, {date or harness.now()}", "",
             "Kernel time a call by CUPTI (median of single calls 10 ms apart; sus.: per call back to back). "
             "plain / ws44 / ws42: the same tiling and split; ws = wave-specialized consumer:producer warps.", "",
             "| problem | tile, split | plain us | 4:4 us | 4:2 us | plain/4:4 | plain/4:2 | plain sus. | 4:4 sus. | "
             "4:2 sus. | correct (plain, 4:4, 4:2) | registers a thread (plain; 4:4; 4:2) | default tile, split | "
             "default us |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|---:|"]  # fmt: skip
    speed = {"ws44": [], "ws42": []}
    sus = {"ws44": [], "ws42": []}
    for name in sorted(by, key=order.index):
        k = by[name]
        plain = k.get("plain", {})
        ratio = {}
        for kind in PRODUCERS:
            a, b = us(plain), us(k.get(kind, {}))
            ratio[kind] = a / b if a and b else None
            if ratio[kind]:
                speed[kind].append(ratio[kind])
            a, b = us(plain, "sustained_us"), us(k.get(kind, {}), "sustained_us")
            if a and b:
                sus[kind].append(a / b)
        d = k.get("default", plain)
        dplan = plans.get((name, "default"), plans.get((name, "plain")))
        lines.append(
            f"| {name} | {tile(plans.get((name, 'plain')))} | {f(us(plain))} | {f(us(k.get('ws44', {})))} | "
            f"{f(us(k.get('ws42', {})))} | {f(ratio['ws44'], '{:.2f}')} | {f(ratio['ws42'], '{:.2f}')} | "
            f"{f(us(plain, 'sustained_us'))} | {f(us(k.get('ws44', {}), 'sustained_us'))} | "
            f"{f(us(k.get('ws42', {}), 'sustained_us'))} | {ok(plain)}, {ok(k.get('ws44', {}))}, "
            f"{ok(k.get('ws42', {}))} | {launch(plain)}; {launch(k.get('ws44', {}))}; {launch(k.get('ws42', {}))} | "
            f"{tile(dplan)} | {f(us(d))} |"
        )
    doc = {"device": device, "date": date or harness.now(), "wall_s": wall, "rows": rows,
           "refused": manifest["refused"]}  # fmt: skip
    lines.append("")
    for kind, label in (("ws44", "4:4"), ("ws42", "4:2")):
        doc[f"geomean_plain_over_{kind}"] = harness.geomean(speed[kind])
        doc[f"geomean_plain_over_{kind}_sustained"] = harness.geomean(sus[kind])
        doc[f"problems_{kind}"] = len(speed[kind])
        single, sustained = doc[f"geomean_plain_over_{kind}"], doc[f"geomean_plain_over_{kind}_sustained"]
        lines.append(f"Geomean plain / {label} over {len(speed[kind])} problems: {f(single, '{:.3f}')} (sustained "
                     f"{f(sustained, '{:.3f}')}); > 1: wave specialization is faster.")  # fmt: skip
    lines.append("")
    lines += harness.notes(manifest, rows, wall, wrong=True)
    return harness.write_tables(out, "explicit_wavespec", doc, lines)


def main(argv: list[str] | None = None) -> int:
    ap, _, run_ = harness.command_line(__file__, __doc__, "host kernels of two small problems (CPU rehearsal)",
                                       only=True, out_required=True)  # fmt: skip
    harness.add_batch_options(run_, budget=110.0, child_limit=45.0)
    return harness.main(ap, argv, compile=lambda a: compile_all(a.dir, a.smoke, a.only),
                        run=lambda a: run(a.dir, a.out, a.budget, a.jobs, a.child_limit), report=report)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
