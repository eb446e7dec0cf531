"""Issue 39 goal 2: a split rule for the padded-channel wgmma kernel (``wgmma-pad-channels``), judged by pack
wgmmapad's FIT rule from its committed results (bench/results/h100_2026-12-06_wgmmapad), no GPU: each rule's
choice on every layer is looked up among the grid points the pack timed (CUPTI kernel_s of part*.json).

A rule is :func:`convbw_mlir.policies.sm90.choose` on taps x ceil(C/64) 64 columns (the 128-row tile where K > 64,
as the padded plan), the split-K grid only, with a split's slices at least ``min_slice`` k tiles:

    p_auto    min_slice 8 (the model as it is: what ``wgmma-pad-channels`` plans by itself)
    slice6    min_slice 6 (fitted on tune rows: the 4-way split at 6-7 k tiles a slice beat the 3-way one at 8-9
              on all three 25-k-tile tune rows, densenet121 l16, ghostnet blocks.8, regnet_x_1_6gf)

FIT (the pack's NOTE 3): fitted on tune rows only; adopted only where, on every held and heldback row, the rule's
point is in the grid and loses at most 5% to the plan now (convbw[heuristic], the sm_80 kernel, as timed in the
pack) and the rule raises their geomean.

    .venv/bin/python bench/padrule.py [RESULTS_DIR]
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results" / "h100_2026-12-06_wgmmapad"
PLAN = "convbw[heuristic]"
RULES = {"p_auto": 8, "slice6": 6}  # name: min_slice
LOSS = 0.95  # the most a held or heldback row may lose to the plan now (plan / rule)


def pick(problem: Any, min_slice: int) -> tuple[int, int, int]:
    """(rows, bn, k_batch) of the padded plan by :func:`sm90.choose` with ``min_slice`` (sm90.plan's arguments
    with ``wgmma-pad-channels``: no StreamK)."""
    from convbw_mlir.policies import sm90
    from convbw_mlir.targets import TARGETS

    tgt = TARGETS["sm_90a"]
    m, n = problem.out_channels, sm90.padded_channels(problem.in_channels) * math.prod(problem.filter_size)
    reduction = problem.batch * math.prod(problem.output_size)
    args = (m, n, reduction, tgt.compute_units, problem.groups, sm90.widths_for(n), False, sm90.floor_us(problem, tgt))
    bn, splits, _ = sm90.choose(*args, min_slice=min_slice)
    return 64 * sm90.consumers_for(m), bn, splits


def _point(contender: dict[str, Any]) -> tuple[int, int, int]:
    plan = contender["variant"]["plan"]
    return plan["tile"]["m"], plan["tile"]["n"], (plan.get("split") or {}).get("k_batch", 1)


def load(results: Path) -> list[dict[str, Any]]:
    """A row a layer: name, set, problem, each timed contender's (rows, bn, k) and us (ok ones only)."""
    from convbw_mlir.problem import ConvBwdWeightProblem

    times: dict[str, dict[str, float]] = {}
    for part in sorted(results.glob("part*.json")):
        for p in json.loads(part.read_text())["problems"]:
            times[p["key"]] = {c: v["kernel_s"] * 1e6 for c, v in p["contenders"].items() if v.get("status") == "ok"}
    rows = []
    for p in json.loads((results / "manifest.json").read_text())["problems"]:
        built = {c: _point(v) for c, v in p["contenders"].items() if "variant" in v}
        timed = {built[c]: us for c, us in times.get(p["key"], {}).items() if c in built and c != PLAN}
        rows.append({"name": p["name"], "dtype": p["problem"]["dtype"], "set": p["set"],
                     "problem": ConvBwdWeightProblem.from_dict(p["problem"]), "plan_us": times[p["key"]].get(PLAN),
                     "p_auto": built.get("convbw[p_auto]"), "timed": timed})  # fmt: skip
    return rows


def evaluate(rows: list[dict[str, Any]], min_slice: int) -> list[dict[str, Any]]:
    """Each row's rule point, its us (None: not in the grid) and plan / rule."""
    out = []
    for r in rows:
        point = pick(r["problem"], min_slice)
        us = r["timed"].get(point)
        best = min(r["timed"].values())
        ratio = r["plan_us"] / us if us else None
        out.append({**r, "point": point, "us": us, "best_us": best, "plan_over_rule": ratio})
    return out


def verdict(evaluated: list[dict[str, Any]]) -> tuple[bool, list[str]]:
    """FIT on the held and heldback rows: (adopted, reasons it is not)."""
    why, checked = [], [e for e in evaluated if e["set"] != "tune"]
    for e in checked:
        if e["us"] is None:
            why.append(f"{e['name']} {e['dtype']}: point {e['point']} not in the grid (not evaluable)")
        elif e["plan_over_rule"] < LOSS:
            why.append(f"{e['name']} {e['dtype']}: loses {1 - e['plan_over_rule']:.0%} to the plan now")
    ratios = [e["plan_over_rule"] for e in checked if e["plan_over_rule"]]
    if not ratios or _geomean(ratios) <= 1.0:
        why.append("does not raise the held/heldback geomean")
    return not why, why


def _geomean(values: list[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values))


def report(results: Path = RESULTS) -> int:
    rows = load(results)
    for r in rows:  # the model as it is must reproduce the pack's own p_auto
        if pick(r["problem"], RULES["p_auto"]) != r["p_auto"]:
            raise ValueError(f"{r['name']}: p_auto {r['p_auto']} != sm90.choose {pick(r['problem'], 8)}")
    for name, min_slice in RULES.items():
        ev = evaluate(rows, min_slice)
        print(f"\n## {name} (min_slice {min_slice})\n")
        print("| layer | dtype | set | rule point (rows, bn, k) | plan us | rule us | best us | plan / rule "
              "| rule / best |")  # fmt: skip
        print("|---|---|---|---|---:|---:|---:|---:|---:|")
        for e in ev:
            us = f"{e['us']:.1f}" if e["us"] else "not in grid"
            pr = f"{e['plan_over_rule']:.2f}" if e["plan_over_rule"] else "-"
            rb = f"{e['us'] / e['best_us']:.2f}" if e["us"] else "-"
            print(f"| {e['name']} | {e['dtype']} | {e['set']} | {e['point']} | {e['plan_us']:.1f} | {us} | "
                  f"{e['best_us']:.1f} | {pr} | {rb} |")  # fmt: skip
        for s in ("tune", "held", "heldback"):
            r = [e["plan_over_rule"] for e in ev if e["set"] == s and e["plan_over_rule"]]
            print(f"\n{s}: geomean plan / rule {_geomean(r):.2f} on {len(r)} rows" if r else f"\n{s}: none timed")
        ok, why = verdict(ev)
        print(f"\nFIT: {'passes' if ok else 'fails: ' + '; '.join(why)}")
    return 0


if __name__ == "__main__":
    sys.exit(report(Path(sys.argv[1]) if len(sys.argv) > 1 else RESULTS))
