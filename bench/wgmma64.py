"""Issue 39 goal 2: the sm_90a wgmma kernel's 64-row tile on K > 64 (``wgmma-rows=64``, one consumer warpgroup),
timed on dense short reductions against the plan now and cuDNN. cuDNN runs one kernel with a tile of 64 x 64 or
smaller on 11 of 16 of the class's 1x1s, and the sm_80 kernel's 64-row tile unsplit beat its 128-row one on all 16
layers of 1,568 positions (docs/decisions.md#short-reduction-dense); no kernel family of ours beat cuDNN on the 24
(bench/results/h100_2026-12-06_tail7). The tile is in the tuner's grid (dispatch/variants.py ``_rows64``), never the
rule's: this probe measures it.

A grid a layer (:func:`grid`), every point decided by the plan (refused ones recorded, not built):

    w64     wgmma-rows 64 x bn 64, 128 x k_batch 1, 2, 4
    w128    the same points with the 128-row tile (wgmma-rows 128): the pairs that isolate the rows

beside the plan now (``convbw[heuristic]``) and, on the held-back rows, the product's choice where it differs
(``convbw[product]``: what select gives a user, bench/heldback.py). The layers: bench/tail7.py's 24 (the tuned
models' first: a rule may be FITTED on them; then the held-out models': CHECKED only), then issue 39's held-back
losers whose plan is the plain wgmma kernel (:data:`HELDBACK`, both types: CHECKED only).

    .venv/bin/python bench/wgmma64.py compile DIR [--workers 2] [--cache CACHE]     # here (the IREE compiler)
    python3 bench/wgmma64.py split DIR --parts 4                                      # the runner's parts
    python3 -m convbw_mlir.measure.run DIR.partI --server --out OUT/partI.json        # on the GPU (one at a time)
    python3 bench/wgmma64.py report OUT/part*.json --manifest DIR/manifest.json       # the tables
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # harness and tail7 beside it, even with PYTHONSAFEPATH=1

import tail7  # noqa: E402
from harness import compile_manifest, geomean, print_report, probe_main, result_seconds  # noqa: E402

TARGET = "sm_90a"
HELDBACK_TSV = Path(__file__).resolve().parent / "heldback" / "dense2d_b.tsv"
# issue 39's held-back losers whose plan is the plain wgmma kernel (bench/results/h100_2026-12-06_heldback_b2)
HELDBACK = ("xception.conv3.pointwise.n32", "yolov5l.model.7.conv.n16", "yolov5l.model.9.cv1.n16",
            "densenet201.transition3.conv.n32", "pix2pix.unet.down5.n16", "alexnet.features.8.n128")  # fmt: skip
TYPES = ("bf16", "f16")
WIDTHS, SPLITS = (64, 128), (1, 2, 4)
PLAN, PRODUCT = "convbw[heuristic]", "convbw[product]"
SETS = ("tune", "held", "heldback")  # fitted on, checked on (tail7's held-out models), checked on (issue 39's)


def layers() -> list[tuple[str, Any, str]]:
    """(name, problem, set) of tail7's layers (``tune`` or ``held``) then the held-back rows (``heldback``), the
    held-back ones channels-last as the product computes them.

    Raises:
        ValueError: a held-back name the set lacks (naming it).
    """
    from convbw_mlir.suites import load_suite

    out = [(n, p, "held" if held else "tune") for n, p, held in tail7.layers()]
    for t in TYPES:
        suite = dict(load_suite(HELDBACK_TSV, t))
        for name in HELDBACK:
            if name not in suite:
                raise ValueError(f"layer: {name!r} is not in {HELDBACK_TSV.name}")
            out.append((name, suite[name].with_(layout=2), "heldback"))
    return out


def grid(p: Any) -> list[tuple[str, dict[str, Any]]]:
    """(label, options) of each grid point for ``p``, each 64-row point beside its 128-row pair."""
    return [
        (f"w{rows}_bn{bn}_k{k}", {"strategy": "explicit", "wgmma_rows": rows, "tile_n": bn, "k_batch": k})
        for bn in WIDTHS
        for k in SPLITS
        for rows in (64, 128)
    ]


def family(plan: Any) -> str:
    """``w64`` / ``w128`` (the plain wgmma kernel's tile rows), else tail7's family."""
    from convbw_mlir.policies import sm90

    if sm90.is_sm90(plan) and plan.streamk is None and plan.merge is None:
        return f"w{plan.tile.m}"
    return tail7.family(plan)


def variants(p: Any, held_back: bool = False, points: list[tuple[str, dict[str, Any]]] | None = None,
             family_of: Any = None) -> tuple[list[Any], dict[str, Any]]:  # fmt: skip
    """The variants to build for ``p`` (the plan's first; on a held-back row the product's where its plan differs;
    then every legal point of ``points`` (default :func:`grid`) whose plan is new) and the grid's account: each
    built one's family (``family_of``, default :func:`family`), the refused (reason), the repeats of an earlier
    plan, the counts."""
    from dataclasses import replace

    from convbw_mlir.dispatch.select import select
    from convbw_mlir.dispatch.variants import Variant, heuristic
    from convbw_mlir.plan import PlanError, decide

    chosen = [heuristic(p, TARGET)]
    if held_back:
        product = select(p, TARGET).variant
        if product.plan is not None and product.plan != chosen[0].plan:
            chosen.append(replace(product, label="product"))
    refused: dict[str, str] = {}
    same: dict[str, str] = {}
    points = grid(p) if points is None else points
    for label, opts in points:
        try:
            plan = decide(p, TARGET, **opts)
        except (PlanError, ValueError) as e:
            refused[label] = str(e).splitlines()[0][:200]
            continue
        twin = next((v for v in chosen if v.plan == plan), None)
        if twin is not None:
            same[label] = twin.label
            continue
        chosen.append(Variant("convbw", plan, tuple(sorted(opts.items())), label))
    built = {v.name: (family_of or family)(v.plan) for v in chosen}
    counts = {"grid": len(points), "refused": len(refused), "same_plan": len(same), "built": len(chosen)}
    return chosen, {"families": built, "refused": refused, "same_plan": same, "counts": counts}


def compile_all(out: Path, workers: int, cache: Path, layers_of: Any = None, variants_of: Any = None) -> int:
    """Build every layer's grid (``layers_of``, ``variants_of``: default :func:`layers`, :func:`variants`) into
    ``out`` as the runner's manifest."""
    items = []
    for name, p, where in (layers_of or layers)():
        vs, account = (variants_of or variants)(p, where == "heldback")
        extra = {"set": where, "held_out": where != "tune", "reduction": tail7.reduction(p), "grid": account}
        items.append((name, p, vs, extra))
        c = account["counts"]
        print(f"{name} {p.dtype} ({where}): grid {c['grid']}, refused {c['refused']}, same plan {c['same_plan']}, "
              f"built {c['built']}", flush=True)  # fmt: skip
    return compile_manifest(out, items, workers, cache, TARGET)


estimate_s = tail7.estimate_s  # the same runner, the same cost a contender


# -- the report -------------------------------------------------------------------------------------------
def _us(t: float | None) -> str:
    return f"{t * 1e6:.1f}" if t else "-"


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a and b else "-"


def _g(values: list[float]) -> str:
    g = geomean(values)
    return "-" if g is None else f"{g:.2f}"


def summarize(rows: list[dict[str, Any]], manifest: dict[str, Any]) -> dict[str, Any]:
    """Per problem (``rows``: the runner's results rows; ``manifest``: the compile side's): the plan's, the
    product's and cuDNN's time, each family's best (time, label), each grid point's time; the statuses not ok."""
    man = {e["key"]: e for e in manifest["problems"]}
    out, bad = [], []
    for r in rows:
        entry = man.get(r["key"]) or next(e for e in man.values() if e["name"] == r["name"])
        fams = entry["grid"]["families"]
        times = {n: result_seconds(c) for n, c in r["contenders"].items() if n != "reference"}
        bad += [f"{r['key']} {n}: {c.get('status')} {str(c.get('error', ''))[:100]}" for n, c in r["contenders"].items()
                if n != "reference" and c.get("status") not in ("ok", None)]  # fmt: skip
        best: dict[str, tuple[float, str]] = {}
        for n, t in times.items():
            f = fams.get(n)
            if t and f and n not in (PLAN, PRODUCT) and (f not in best or t < best[f][0]):
                best[f] = (t, n)
        ours = {n: t for n, t in times.items() if n in fams and t}
        top = min(((t, n) for n, t in ours.items()), default=None)
        for label, twin in entry["grid"].get("same_plan", {}).items():  # a point whose plan was built as another
            if f"convbw[{twin}]" in ours:
                ours[f"convbw[{label}]"] = ours[f"convbw[{twin}]"]
        plan = times.get(PLAN)
        out.append({"name": r["name"], "key": r["key"], "dtype": entry["problem"]["dtype"],
                    "shape": tail7._shape(entry["problem"]), "set": entry.get("set", "tune"),
                    "plan_family": fams.get(PLAN), "plan": plan, "product": times.get(PRODUCT) or plan,
                    "cudnn": times.get("cudnn"), "best": top[0] if top else None, "best_name": top[1] if top else None,
                    "families": best, "times": ours})  # fmt: skip
    return {"rows": out, "not_ok": bad}


def _pairs(r: dict[str, Any]) -> list[float]:
    """The 128-row point's time over its 64-row pair's (> 1: 64 rows faster), where both were timed."""
    return [r["times"][f"convbw[w128{n[len('convbw[w64') : -1]}]"] / t for n, t in r["times"].items()
            if n.startswith("convbw[w64_") and f"convbw[w128{n[len('convbw[w64') : -1]}]" in r["times"]]  # fmt: skip


def report_lines(s: dict[str, Any]) -> list[str]:
    """A row a problem, then by set the 64-row tile against the plan, its 128-row pairs and cuDNN, then each grid
    point against the problem's best, then the verdict: does the 64-row tile reach issue 39's 1.15x cuDNN."""
    lines = ["| layer | dtype | shape | set | plan kernel | plan us | product us | cuDNN us | best w64 | w64 us | "
             "w128 us | plan/w64 | w128/w64 pairs | cuDNN/w64 | cuDNN/best |",
             "|---|---|---|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in s["rows"]:
        w64, w128 = r["families"].get("w64", (None, None)), r["families"].get("w128", (None, None))
        lines.append(f"| {r['name']} | {r['dtype']} | {r['shape']} | {r['set']} | {r['plan_family'] or '-'} | "
                     f"{_us(r['plan'])} | {_us(r['product'])} | {_us(r['cudnn'])} | {w64[1] or '-'} | {_us(w64[0])} | "
                     f"{_us(w128[0])} | {_ratio(r['plan'], w64[0])} | {_g(_pairs(r))} | {_ratio(r['cudnn'], w64[0])} | "
                     f"{_ratio(r['cudnn'], r['best'])} |")  # fmt: skip
    lines += ["", "| set | problems with w64 | w64 best on | geomean plan / best w64 | geomean w128 / w64 (pairs) | "
              "geomean cuDNN / best w64 | w64 beats the plan on | w64 beats cuDNN on |",
              "|---|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for where in SETS:
        got = [r for r in s["rows"] if r["set"] == where and "w64" in r["families"]]
        if not got:
            continue
        t64 = {r["key"]: r["families"]["w64"][0] for r in got}
        wins = sum(1 for r in got if r["best_name"] == r["families"]["w64"][1])
        pairs = [x for r in got for x in _pairs(r)]
        lines.append(f"| {where} | {len(got)} | {wins} | {_g([r['plan'] / t64[r['key']] for r in got if r['plan']])} | "
                     f"{_g(pairs)} | {_g([r['cudnn'] / t64[r['key']] for r in got if r['cudnn']])} | "
                     f"{sum(1 for r in got if r['plan'] and t64[r['key']] < r['plan'])} | "
                     f"{sum(1 for r in got if r['cudnn'] and t64[r['key']] < r['cudnn'])} |")  # fmt: skip
    return lines + point_lines(s) + verdict_lines(s, "w64 in the grid")


def point_lines(s: dict[str, Any]) -> list[str]:
    """Each grid point of :func:`summarize`'s rows: timed on, best on, geomean its time over the problem's best."""
    lines = ["", "| grid point | timed on | best on | geomean its time / the problem's best |", "|---|---:|---:|---:|"]
    for n in sorted({n for r in s["rows"] for n in r["times"]} - {PLAN, PRODUCT}):
        got = [r for r in s["rows"] if n in r["times"]]
        wins = sum(1 for r in got if r["best_name"] == n)
        lines.append(f"| {n} | {len(got)} | {wins} | {_g([r['times'][n] / r['best'] for r in got])} |")
    return lines


def verdict_lines(s: dict[str, Any], grid: str) -> list[str]:
    """By set: cuDNN over the plan, the product and the grid's best (``grid`` says what the grid holds), and issue
    39's goal 2 (>= 1.15x cuDNN); then what was not ok (a wrong kernel never counts)."""
    lines = ["", f"| set | problems | geomean cuDNN/plan | geomean cuDNN/product | geomean cuDNN/best ({grid}) | "
             "min cuDNN/best | best beats cuDNN on | goal 2 (>= 1.15) |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]  # fmt: skip
    for where in SETS:
        part = [r for r in s["rows"] if r["set"] == where and r["cudnn"] and r["best"]]
        if not part:
            continue
        best = [r["cudnn"] / r["best"] for r in part]
        g = geomean(best)
        lines.append(f"| {where} | {len(part)} | {_g([r['cudnn'] / r['plan'] for r in part if r['plan']])} | "
                     f"{_g([r['cudnn'] / r['product'] for r in part if r['product']])} | {g:.2f} | {min(best):.2f} | "
                     f"{sum(b > 1 for b in best)} | {'met' if g >= 1.15 else 'not met'} |")  # fmt: skip
    if s["not_ok"]:
        lines += ["", "not ok:", *s["not_ok"]]
    return lines


def report(results: list[Path], manifest: Path) -> int:
    """The tables of :func:`report_lines` from the runner's part files and the compile side's manifest."""
    return print_report(results, manifest, summarize, report_lines)


def main(argv: list[str] | None = None) -> int:
    return probe_main(argv, __doc__, "wgmma64", 4, compile_all, report)


if __name__ == "__main__":
    sys.exit(main())
