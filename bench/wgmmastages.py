"""Issue 39 goal 2, docs/decisions.md#short-reduction-dense item 3: the sm_90a wgmma kernel's ring depth
(``wgmma-stages``) timed on dense short reductions against the plan now (4 stages) and cuDNN. cuDNN's nvjet kernels
there are named ``_64x13_`` / ``_64x16_`` on its 64-wide tiles (``_64x5_`` to ``_64x8_`` on larger ones), read as
that many stages of k = 64; ours holds 4: a 128x64x64 wgmma step is ~0.14 us of an SM's tensor time against a TMA
round trip of ~0.7-1 us, so 4 k tiles in flight may be latency-bound on 25-100 k tiles. The depths are in the
tuner's grid (dispatch/variants.py ``_deeper``), never the rule's: this probe measures them.

A grid a layer (:func:`grid`), every point decided by the plan (refused ones recorded, not built), the plan's tile
rows (128 on K > 64, 64 else):

    s{n}_bn{bn}_k{k}     n stages, 4, 6, 8 (where the tile fits them) and the most the tile fits (``s{n}max``:
                         9 at 128x64, 7 at 128x128; policies/sm90.py max_stages) x bn 64, 128 x the plan's split and
                         unsplit; the 4-stage points are the pairs that isolate the depth

beside the plan now (``convbw[heuristic]``; a point equal to it is timed as it) and, on the held-back rows, the
product's choice where it differs (bench/wgmma64.py's). The layers: bench/wgmma64.py's that the plain wgmma kernel
takes (bench/tail7.py's: FIT on the tuned models' rows, CHECK on the held-out models'; then issue 39's held-back rows:
CHECK only), at most :data:`LIMIT_KERNELS` kernels (:func:`layers` says which are cut first).

    .venv/bin/python bench/wgmmastages.py compile DIR [--workers 2] [--cache CACHE]   # here (the IREE compiler)
    python3 bench/wgmmastages.py split DIR --parts 4                                  # the runner's parts
    python3 -m convbw_mlir.measure.run DIR.partI --server --out OUT/partI.json        # on the GPU (one at a time)
    python3 bench/wgmmastages.py report OUT/part*.json --manifest DIR/manifest.json   # the tables
"""

from __future__ import annotations

import functools
import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # harness, tail7, wgmma64 beside it, even with PYTHONSAFEPATH

import tail7  # noqa: E402
import wgmma64  # noqa: E402
from harness import print_report, probe_main  # noqa: E402

TARGET = wgmma64.TARGET
DEPTHS, WIDTHS = (4, 6, 8), (64, 128)  # and each tile's most
SETS, PLAN, PRODUCT = wgmma64.SETS, wgmma64.PLAN, wgmma64.PRODUCT
# the pack's kernels (the plans, the product's choices and the grid points built) at most: ESTIMATE <= 200 s
LIMIT_KERNELS = 250
POINT = re.compile(r"convbw\[s(\d+)(max)?_bn(\d+)_k(\d+)\]")


def most(p: Any, bn: int) -> int:
    """The deepest ring of ``p``'s plain wgmma tile (its rows by K) at width ``bn``."""
    from convbw_mlir.policies import sm90
    from convbw_mlir.targets import TARGETS

    return sm90.max_stages(64 * sm90.consumers_for(p.out_channels), bn, TARGETS[TARGET])


def grid(p: Any) -> list[tuple[str, dict[str, Any]]]:
    """(label, options) of each grid point for ``p``: every depth at bn 64 and 128, the plan's split and unsplit,
    the 4-stage point first (the pair of the deeper ones)."""
    from convbw_mlir.plan import decide

    kb = decide(p, TARGET).k_batch
    out = []
    for bn in WIDTHS:
        top = most(p, bn)
        for k in dict.fromkeys((kb, 1)):
            for n in dict.fromkeys(d for d in (*DEPTHS, top) if d <= top):
                label = f"s{n}{'max' if n == top else ''}_bn{bn}_k{k}"
                out.append((label, {"strategy": "explicit", "wgmma_stages": n, "tile_n": bn, "k_batch": k}))
    return out


def family(plan: Any) -> str:
    """``s4`` (the plain wgmma kernel at today's depth) or ``deep`` (another), else tail7's family."""
    from convbw_mlir.policies import sm90

    if sm90.is_sm90(plan) and plan.streamk is None and plan.merge is None:
        return "s4" if plan.tile.stages == 4 else "deep"
    return tail7.family(plan)


def variants(p: Any, held_back: bool = False) -> tuple[list[Any], dict[str, Any]]:
    """bench/wgmma64.py's variants over this grid and these families."""
    return wgmma64.variants(p, held_back, grid(p), family)


@functools.cache
def _built(name: str, dtype: str, held_back: bool) -> int:
    p = next(q for n, q, _ in wgmma64.layers() if n == name and q.dtype == dtype)
    return len(variants(p, held_back)[0])


def layers(limit: int = LIMIT_KERNELS) -> list[tuple[str, Any, str]]:
    """bench/wgmma64.py's layers the plain wgmma kernel takes (the rest would build the plan alone), in its order
    (tail7's tuned, held-out, then the held-back rows), cut to at most ``limit`` kernels (each layer's plan, a
    held-back row's product, its grid): first the rows past the reduction the tuner tries deeper rings on
    (``SHORT_DENSE_REDUCTION``; kept otherwise as a check of that bound), the longest first; then the tuned models'
    rows, the last first; the held-back rows last."""
    from convbw_mlir.dispatch.variants import SHORT_DENSE_REDUCTION
    from convbw_mlir.policies import sm90

    out = [(n, p, w) for n, p, w in wgmma64.layers() if sm90.takes(p)]
    while sum(_built(n, p.dtype, w == "heldback") for n, p, w in out) > limit:
        past = [e for e in out if tail7.reduction(e[1]) > SHORT_DENSE_REDUCTION]
        if past:
            out.remove(max(reversed(past), key=lambda e: tail7.reduction(e[1])))
            continue
        where = next(w for w in SETS if any(e[2] == w for e in out))
        out.remove(next(e for e in reversed(out) if e[2] == where))
    return out


compile_all = functools.partial(wgmma64.compile_all, layers_of=layers, variants_of=variants)
estimate_s = tail7.estimate_s  # the same runner, the same cost a contender


# -- the report -------------------------------------------------------------------------------------------
def _pairs(r: dict[str, Any]) -> dict[str, list[float]]:
    """By depth (``6``, ``8``, ``max``): the 4-stage point's time over the deeper one's at the same width and split
    (> 1: deeper faster), where both were timed (the plan's own point counts as timed: wgmma64.summarize)."""
    out: dict[str, list[float]] = {}
    for n, t in r["times"].items():
        m = POINT.fullmatch(n)
        if not m or m[1] == "4" and not m[2]:
            continue
        four = r["times"].get(f"convbw[s4_bn{m[3]}_k{m[4]}]")
        if four:
            out.setdefault("max" if m[2] else m[1], []).append(four / t)
    return out


def _depths(s: dict[str, Any]) -> list[str]:
    found = {d for r in s["rows"] for d in _pairs(r)}
    return sorted(found - {"max"}, key=int) + ["max"] * ("max" in found)


def report_lines(s: dict[str, Any]) -> list[str]:
    """A row a problem, then by set and depth the deeper rings against their 4-stage pairs, then each grid point
    against the problem's best, then the verdict: does a deeper ring reach issue 39's 1.15x cuDNN."""
    lines = ["| layer | dtype | shape | set | plan kernel | plan us | product us | cuDNN us | best s4 us | best deeper "
             "| deeper us | s4/deeper pairs | plan/deeper | cuDNN/deeper | cuDNN/best |",
             "|---|---|---|---|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    us, ratio, g = wgmma64._us, wgmma64._ratio, wgmma64._g
    for r in s["rows"]:
        four, deep = r["families"].get("s4", (None, None)), r["families"].get("deep", (None, None))
        pairs = [x for v in _pairs(r).values() for x in v]
        lines.append(f"| {r['name']} | {r['dtype']} | {r['shape']} | {r['set']} | {r['plan_family'] or '-'} | "
                     f"{us(r['plan'])} | {us(r['product'])} | {us(r['cudnn'])} | {us(four[0])} | {deep[1] or '-'} | "
                     f"{us(deep[0])} | {g(pairs)} | {ratio(r['plan'], deep[0])} | {ratio(r['cudnn'], deep[0])} | "
                     f"{ratio(r['cudnn'], r['best'])} |")  # fmt: skip
    lines += ["", "| set | depth | pairs | geomean s4 / deeper (pairs) | deeper faster in | layers where it is the "
              "best point |", "|---|---|---:|---:|---:|---:|"]  # fmt: skip
    for where in SETS:
        got = [r for r in s["rows"] if r["set"] == where]
        for depth in _depths(s):
            pairs = [x for r in got for x in _pairs(r).get(depth, [])]
            if not pairs:
                continue
            best = sum(1 for r in got if (m := POINT.fullmatch(r["best_name"] or "")) and
                       ("max" if m[2] else m[1]) == depth)  # fmt: skip
            lines.append(f"| {where} | {depth} | {len(pairs)} | {g(pairs)} | {sum(x > 1 for x in pairs)} | {best} |")
    lines += ["", "| set | problems with a deeper point | geomean plan / best deeper | geomean cuDNN / best deeper | "
              "deeper beats the plan on | deeper beats cuDNN on |", "|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    for where in SETS:
        got = [r for r in s["rows"] if r["set"] == where and "deep" in r["families"]]
        if got:
            deep = {r["key"]: r["families"]["deep"][0] for r in got}
            lines.append(f"| {where} | {len(got)} | {g([r['plan'] / deep[r['key']] for r in got if r['plan']])} | "
                         f"{g([r['cudnn'] / deep[r['key']] for r in got if r['cudnn']])} | "
                         f"{sum(1 for r in got if r['plan'] and deep[r['key']] < r['plan'])} | "
                         f"{sum(1 for r in got if r['cudnn'] and deep[r['key']] < r['cudnn'])} |")  # fmt: skip
    return lines + wgmma64.point_lines(s) + wgmma64.verdict_lines(s, "deeper rings in the grid")


def report(results: list[Path], manifest: Path) -> int:
    """The tables of :func:`report_lines` from the runner's part files and the compile side's manifest."""
    return print_report(results, manifest, wgmma64.summarize, report_lines)


def main(argv: list[str] | None = None) -> int:
    return probe_main(argv, __doc__, "wgmmastages", 4, compile_all, report)


if __name__ == "__main__":
    sys.exit(main())
