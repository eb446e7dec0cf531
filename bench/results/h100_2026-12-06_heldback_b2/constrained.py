"""The constrained selector's choice on the second held-back set, timed where either run timed it.

    .venv/bin/python bench/results/h100_2026-12-06_heldback_b2/constrained.py   (from the repo root; needs the
    runs' table.md and manifest.json: heldback_b's and this folder's)

For each row: today's plan's kernel, the product's choice (`select`: the installed selector, keeping the plan's
matrix instruction), and cuDNN/ours where that choice is the plan either run timed (selector v1: heldback_b, v2: this
run); then the geomean of the constrained choices and of v1's and v2's on the same rows.
"""

import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "bench"))

import heldback as hb  # noqa: E402
from class_table import kernel_of  # noqa: E402

from convbw_mlir.dispatch.select import select  # noqa: E402
from convbw_mlir.plan import decide  # noqa: E402

RUNS = [ROOT / "bench/results/h100_2026-12-06_heldback_b", ROOT / "bench/results/h100_2026-12-06_heldback_b2"]


def table(folder: Path) -> dict[str, list[str]]:
    """table.md's rows by key: key, ours us, cuDNN us, cuDNN/ours, ..."""
    rows = {}
    for line in (folder / "table.md").read_text().splitlines():
        if line.startswith("| 0"):
            cells = [c.strip() for c in line.split("|")[1:-1]]
            rows[cells[0]] = cells
    return rows


def product_plan(folder: Path) -> dict[str, str]:
    manifest = json.loads((folder / "manifest.json").read_text())
    out = {}
    for p in manifest["problems"]:
        c = p["contenders"]["convbw[product]"]
        out[p["key"]] = json.dumps(c.get("variant", {}).get("plan") or c.get("plan"), sort_keys=True)
    return out


def geomean(xs: list[float]) -> float:
    return math.exp(sum(map(math.log, xs)) / len(xs))


def main() -> None:
    tables, plans = [table(f) for f in RUNS], [product_plan(f) for f in RUNS]
    timed: dict[str, float] = {}
    for i, (name, p) in enumerate(hb.problems(("bf16", "f16"), ROOT / "bench/heldback/dense2d_b.tsv")):
        key = f"{i:03d}-{name}.{p.dtype}"
        chosen = select(p, "sm_90a").variant  # the product's choice (no database entry: the learned selector)
        mine = json.dumps(chosen.plan.to_dict(), sort_keys=True)
        run = next((r for r in range(len(RUNS)) if plans[r][key] == mine), None)
        figure = "UNTIMED"
        if run is not None:
            cells = tables[run][key]
            timed[key] = float(cells[2]) / float(cells[1])
            figure = f"{timed[key]:.2f}"
        plan = kernel_of(decide(p, "sm_90a").to_dict())
        print(f"{key[:46]:46} plan {plan:22} chosen {kernel_of(chosen.plan.to_dict()):22} {figure}")
    ratios = list(timed.values())
    print(f"timed {len(ratios)} untimed {50 - len(ratios)} geomean {geomean(ratios):.3f} min {min(ratios):.2f} "
          f"<0.8 {sum(r < 0.8 for r in ratios)}")  # fmt: skip
    same = [[float(t[k][3]) for k in timed] for t in tables]
    print(f"same rows: v1 {geomean(same[0]):.3f} v2 {geomean(same[1]):.3f} constrained {geomean(ratios):.3f}")


if __name__ == "__main__":
    main()
