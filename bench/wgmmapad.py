"""Issue 39 goal 2: the sm_90a wgmma kernel on dense layers whose in-channels C are a multiple of 8 but not of 64
(``wgmma-pad-channels=true``: each tap's channels padded to whole 64-channel boxes), timed against the plan now
(the sm_80 mma.sync kernel: the wgmma kernel refused C % 64 != 0) and cuDNN. On tail7's refused layers the best of
our sm_80 grid was 0.31-0.74x cuDNN while cuDNN ran an sm90 kernel on 9 of 10 (docs/decisions.md
#short-reduction-dense 4.). The form is in the tuner's grid (dispatch/variants.py ``_padded``), never the rule's:
this probe measures it.

A grid a layer (:func:`grid`), every point decided by the plan (refused ones recorded, not built):

    p128    padded, 128-row tile (two consumer warpgroups) x bn 64, 128 x k_batch 1, 2, 4; and the padded plan's
            own split (``p_auto``: what the tuner tries first)
    p64     the same points with the 64-row tile (wgmma-rows 64)

beside the plan now (``convbw[heuristic]``) and, on the held-back rows, the product's choice where it differs
(``convbw[product]``). The layers: bench/tail7.py's layers the wgmma kernel refuses only for C (8 of 10: the two
with 921 channels stay refused; the tuned models' FIT, the held-out models' CHECK), then issue 39's held-back rows
with C % 64 != 0 (:data:`HELDBACK`, both types: CHECK only).

    .venv/bin/python bench/wgmmapad.py compile DIR [--workers 2] [--cache CACHE]    # here (the IREE compiler)
    python3 bench/wgmmapad.py split DIR --parts 2                                    # the runner's parts
    python3 -m convbw_mlir.measure.run DIR.partI --server --out OUT/partI.json       # on the GPU (one at a time)
    python3 bench/wgmmapad.py report OUT/part*.json --manifest DIR/manifest.json     # the tables
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # harness and tail7 beside it, even with PYTHONSAFEPATH=1

import tail7  # noqa: E402
import wgmma64  # noqa: E402
from harness import compile_manifest, geomean, print_report, probe_main  # noqa: E402

TARGET = "sm_90a"
HELDBACK_TSV = Path(__file__).resolve().parent / "heldback" / "dense2d_b.tsv"
# issue 39's held-back rows with C % 64 != 0 (bench/results/h100_2026-12-06_heldback_b2: the set's worst)
HELDBACK = ("densenet201.denseblock3.denselayer48.conv1.n32", "xception.block5.pointwise.n32")
TYPES = ("bf16", "f16")
WIDTHS, SPLITS, ROWS = (64, 128), (1, 2, 4), (128, 64)
PLAN, PRODUCT = "convbw[heuristic]", "convbw[product]"
SETS = wgmma64.SETS


def layers() -> list[tuple[str, Any, str]]:
    """(name, problem, set) of tail7's layers the wgmma kernel takes only padded (``tune`` or ``held``), then the
    held-back rows (``heldback``, channels-last as the product computes them).

    Raises:
        ValueError: a held-back name the set lacks, or one the padded kernel does not take (naming it).
    """
    from convbw_mlir.policies import sm90
    from convbw_mlir.suites import load_suite

    out = [(n, p, "held" if held else "tune") for n, p, held in tail7.layers() if sm90.takes_padded(p)]
    for t in TYPES:
        suite = dict(load_suite(HELDBACK_TSV, t))
        for name in HELDBACK:
            if name not in suite:
                raise ValueError(f"layer: {name!r} is not in {HELDBACK_TSV.name}")
            p = suite[name].with_(layout=2)
            if not sm90.takes_padded(p):
                raise ValueError(f"layer: {name!r} (C = {p.in_channels}) is not one the padded wgmma kernel takes")
            out.append((name, p, "heldback"))
    return out


def grid(p: Any) -> list[tuple[str, dict[str, Any]]]:
    """(label, options) of each grid point for ``p``: the padded plan's own split, then each 128-row point beside its
    64-row pair."""
    pad = {"strategy": "explicit", "wgmma_pad_channels": True}
    return [("p_auto", pad)] + [
        (f"p{rows}_bn{bn}_k{k}", {**pad, "wgmma_rows": rows, "tile_n": bn, "k_batch": k})
        for bn in WIDTHS
        for k in SPLITS
        for rows in ROWS
    ]


def family(plan: Any) -> str:
    """``p128`` / ``p64`` (the padded wgmma kernel's tile rows), else tail7's family."""
    from convbw_mlir.policies import sm90

    if sm90.is_sm90(plan) and plan.merge is None and plan.tile is not None:
        return f"p{plan.tile.m}"
    return tail7.family(plan)


def variants(p: Any, held_back: bool = False) -> tuple[list[Any], dict[str, Any]]:
    """The variants to build for ``p`` (the plan's first; on a held-back row the product's where its plan differs;
    then every legal grid point whose plan is new) and the grid's account (wgmma64's, this grid)."""
    saved = wgmma64.grid, wgmma64.family
    wgmma64.grid, wgmma64.family = grid, family
    try:
        return wgmma64.variants(p, held_back)
    finally:
        wgmma64.grid, wgmma64.family = saved


def compile_all(out: Path, workers: int, cache: Path) -> int:
    items = []
    for name, p, where in layers():
        vs, account = variants(p, where == "heldback")
        extra = {"set": where, "held_out": where != "tune", "reduction": tail7.reduction(p), "grid": account}
        items.append((name, p, vs, extra))
        c = account["counts"]
        print(f"{name} {p.dtype} ({where}): grid {c['grid']}, refused {c['refused']}, same plan {c['same_plan']}, "
              f"built {c['built']}", flush=True)  # fmt: skip
    return compile_manifest(out, items, workers, cache, TARGET)


estimate_s = tail7.estimate_s  # the same runner, the same cost a contender


# -- the report -------------------------------------------------------------------------------------------
_us, _ratio, _g = wgmma64._us, wgmma64._ratio, wgmma64._g


def summarize(rows: list[dict[str, Any]], manifest: dict[str, Any]) -> dict[str, Any]:
    """wgmma64's summary (per problem: plan, product, cuDNN, each family's best, each point's time)."""
    return wgmma64.summarize(rows, manifest)


def _pad_best(r: dict[str, Any]) -> tuple[float | None, str | None]:
    """The fastest padded point of a row (either tile rows)."""
    got = [r["families"][f] for f in ("p128", "p64") if f in r["families"]]
    return min(got) if got else (None, None)


def report_lines(s: dict[str, Any]) -> list[str]:
    """A row a problem, then by set the padded kernel against the plan now (sm_80) and cuDNN, then each grid point
    against the problem's best, then the verdict."""
    lines = ["| layer | dtype | shape | set | plan kernel | plan us | product us | cuDNN us | best padded | "
             "padded us | p128 us | p64 us | plan/padded | cuDNN/padded | cuDNN/plan |",
             "|---|---|---|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in s["rows"]:
        t, n = _pad_best(r)
        p128, p64 = r["families"].get("p128", (None, None)), r["families"].get("p64", (None, None))
        lines.append(f"| {r['name']} | {r['dtype']} | {r['shape']} | {r['set']} | {r['plan_family'] or '-'} | "
                     f"{_us(r['plan'])} | {_us(r['product'])} | {_us(r['cudnn'])} | {n or '-'} | {_us(t)} | "
                     f"{_us(p128[0])} | {_us(p64[0])} | {_ratio(r['plan'], t)} | {_ratio(r['cudnn'], t)} | "
                     f"{_ratio(r['cudnn'], r['plan'])} |")  # fmt: skip
    lines += ["", "| set | problems with padded | padded best on | geomean plan / best padded | geomean p128 / p64 "
              "(best of each) | geomean cuDNN / best padded | padded beats the plan on | padded beats cuDNN on |",
              "|---|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for where in SETS:
        got = [(r, _pad_best(r)[0]) for r in s["rows"] if r["set"] == where and _pad_best(r)[0]]
        if not got:
            continue
        wins = sum(1 for r, _ in got if r["best_name"] == _pad_best(r)[1])
        rows_ratio = [r["families"]["p128"][0] / r["families"]["p64"][0] for r, _ in got
                      if "p128" in r["families"] and "p64" in r["families"]]  # fmt: skip
        lines.append(f"| {where} | {len(got)} | {wins} | {_g([r['plan'] / t for r, t in got if r['plan']])} | "
                     f"{_g(rows_ratio)} | {_g([r['cudnn'] / t for r, t in got if r['cudnn']])} | "
                     f"{sum(1 for r, t in got if r['plan'] and t < r['plan'])} | "
                     f"{sum(1 for r, t in got if r['cudnn'] and t < r['cudnn'])} |")  # fmt: skip
    lines += ["", "| grid point | timed on | best on | geomean its time / the problem's best |", "|---|---:|---:|---:|"]
    for n in sorted({n for r in s["rows"] for n in r["times"]} - {PLAN, PRODUCT}):
        got = [r for r in s["rows"] if n in r["times"]]
        wins = sum(1 for r in got if r["best_name"] == n)
        lines.append(f"| {n} | {len(got)} | {wins} | {_g([r['times'][n] / r['best'] for r in got])} |")
    lines += ["", "| set | problems | geomean cuDNN/plan | geomean cuDNN/product | geomean cuDNN/best (padded in the "
              "grid) | min cuDNN/best | best beats cuDNN on |", "|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for where in SETS:
        part = [r for r in s["rows"] if r["set"] == where and r["cudnn"] and r["best"]]
        if not part:
            continue
        best = [r["cudnn"] / r["best"] for r in part]
        lines.append(f"| {where} | {len(part)} | {_g([r['cudnn'] / r['plan'] for r in part if r['plan']])} | "
                     f"{_g([r['cudnn'] / r['product'] for r in part if r['product']])} | {geomean(best):.2f} | "
                     f"{min(best):.2f} | {sum(b > 1 for b in best)} |")  # fmt: skip
    if s["not_ok"]:
        lines += ["", "not ok:", *s["not_ok"]]
    return lines


def report(results: list[Path], manifest: Path) -> int:
    """The tables of :func:`report_lines` from the runner's part files and the compile side's manifest."""
    return print_report(results, manifest, summarize, report_lines)


def main(argv: list[str] | None = None) -> int:
    return probe_main(argv, __doc__, "wgmmapad", 2, compile_all, report)


if __name__ == "__main__":
    sys.exit(main())
