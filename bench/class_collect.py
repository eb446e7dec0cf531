"""Issue 40: what bench/results already holds of cuDNN/ours on Hopper, class by class (docs/classes.md).

    .venv/bin/python bench/class_collect.py > bench/results/h100_2026-12-06_class_collect.md

Reads the H100 runs of 2026-12-06 that timed ours beside cuDNN in one process (:data:`SOURCES`), classes each
row by its shape (:func:`class_table.problem_class`) and says whether what was timed is the plan ``decide`` gives
today on sm_90a (``current``) or an earlier one (``earlier``: the plan or the kernel changed since). Every figure
is a ratio of two times of one row of a results file (kernel time by CUPTI); nothing is measured here.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import class_table as ct  # noqa: E402
from harness import geomean  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
TARGET = "sm_90a"


def _plan_now(p: Any) -> dict[str, Any] | None:
    from convbw_mlir.plan import decide

    try:
        d = decide(p, TARGET).to_dict()
    except ValueError:
        return None
    d.pop("decision", None)
    return d


def _form(p: Any, plan: dict[str, Any] | None) -> str:
    """``current`` where today's plan is ``plan``; a depthwise or GEMV plan measured before the dw90 and gemv
    merges (10:37, 10:41) ran those kernels' code of then (their sources changed since; the GEMM kernels' did not
    since 3516730): earlier."""
    if not plan:
        return "unchecked (no plan recorded)"
    plan = {k: v for k, v in plan.items() if k != "decision"}
    if _plan_now(p) != plan:
        return "earlier (another plan)"
    return "earlier (the kernel's code then)" if plan.get("depthwise") or plan.get("gemv") else "current"


# -- the sources: (label, folder, rows) where rows yields (name, dtype, problem, ours µs, cuDNN µs, form) -----------
Row = tuple[str, str, Any, "float | None", "float | None", str]


def _remeasure_product() -> Iterator[Row]:
    """remeasure run 1's product group: the sm_90a plan of main 3516730 (``ours90``) on the suite's 13 dense layers,
    12 held-out 2-D layers and 16 1-D/3-D ones; current where today's plan has the same plan cell."""
    import hopper_conv as hc
    import remeasure

    from convbw_mlir.plan import decide

    probs = {**hc.problems(), **hc.held_out(), **hc.ranked_problems()}
    data = json.loads((RESULTS / "h100_2026-12-06_remeasure/run1/results/product.json").read_text())
    for r in data["problems"]:
        p = probs[r["name"]]
        cell = r["contenders"].get("ours90", {}).get("config", {}).get("plan")
        form = "current" if cell == remeasure._plan_cell(decide(p, TARGET)) else "earlier (another plan)"
        yield r["name"].removesuffix("_bf16"), p.dtype, p, ct.kernel_us(r, "ours90"), ct.kernel_us(r, "cudnn"), form


def _depthwise_round2() -> Iterator[Row]:
    """depthwise_sm90 round 2: per row, the variant whose plan numbers and switches are today's (current), else
    main's plan then (earlier)."""
    import depthwise_sm90 as dws

    from convbw_mlir.plan import decide
    from convbw_mlir.policies import depthwise
    from convbw_mlir.problem import ConvBwdWeightProblem

    for line in (RESULTS / "h100_2026-12-06_depthwise_sm90/round2_rows.jsonl").read_text().splitlines():
        r = json.loads(line)
        name, dtype = r["key"].rsplit(".", 1)
        p = ConvBwdWeightProblem.from_ck(dws.PROBLEMS[name], layout=2, dtype=dtype)
        now = decide(p, TARGET).depthwise
        ident_now = (asdict(now), depthwise.OWN_STAGE2, bool(depthwise.kernel(p, now).mma_convert), depthwise.PREFETCH)
        match = None
        for v, c in r["contenders"].items():
            cfg = c.get("config") or {}
            if v == "cudnn" or "depthwise" not in cfg:
                continue
            # round 2's "mma" variants converted by mma.sync wherever a vector was 4 channels (its README)
            mma = p.dtype in cfg.get("mma", []) and cfg["depthwise"]["vector"] == 4
            if (cfg["depthwise"], cfg.get("stage2"), mma, cfg.get("prefetch", False)) == ident_now:
                match = v
        v, form = (match, f"current ({match})") if match else ("main", "earlier (main's plan then)")
        yield name, dtype, p, ct.kernel_us(r, v), ct.kernel_us(r, "cudnn"), form


def _zootune() -> Iterator[Row]:
    """zootune: on 60 zoo problem-types, the candidate whose plan is today's where the run timed it (the tuner
    timed the plan's neighbours too: codegen, splits, tiles), else the heuristic's sm_90a plan then (branch zootune
    7462f12)."""
    from convbw_mlir.problem import ConvBwdWeightProblem

    data = json.loads((RESULTS / "h100_2026-12-06_zootune/results.json").read_text())
    for r in data["problems"]:
        p = ConvBwdWeightProblem.from_dict(r["problem"])
        plans = {n: {k: v for k, v in (c.get("plan") or {}).items() if k != "decision"}
                 for n, c in r.get("variants", {}).items()}  # fmt: skip
        now = _plan_now(p)
        name = next((n for n, plan in plans.items() if plan == now and ct.kernel_us(r, n)), "convbw[heuristic]")
        yield r["name"], p.dtype, p, ct.kernel_us(r, name), ct.kernel_us(r, "cudnn"), _form(p, plans.get(name))


def _heur_heldout() -> Iterator[Row]:
    """heur_heldout: the plan as merged by heur (``convbw[heuristic]``) on 21 zoo layers the rules moved."""
    from convbw_mlir.problem import ConvBwdWeightProblem

    folder = RESULTS / "h100_2026-12-06_heur_heldout"
    entries = {e["key"]: e for e in json.loads((folder / "manifest.json").read_text())["problems"]}
    for r in json.loads((folder / "results.json").read_text())["problems"]:
        e = entries[r["key"]]
        p = ConvBwdWeightProblem.from_dict(e["problem"])
        plan = e["contenders"]["convbw[heuristic]"].get("variant", {}).get("plan")
        yield r["name"].removeprefix("zoo."), p.dtype, p, ct.kernel_us(r, "convbw[heuristic]"), \
            ct.kernel_us(r, "cudnn"), _form(p, plan)  # fmt: skip


def _gemv_round2() -> Iterator[Row]:
    """gemv round 2: the plan of c12f434 (``convbw``); the GEMV kernel changed since (the lanes' tree sum, the
    interior branch off by rule): earlier where today's plan is the GEMV kernel, else unchecked."""
    import gemv

    probs = {(n, p.dtype): p for n, p, _ in gemv.problems(["f16", "bf16"])}
    for f in sorted((RESULTS / "h100_2026-12-06_gemv_round2").glob("results_*.json")):
        for r in json.loads(f.read_text())["problems"]:
            name, dtype = r["key"].rsplit(".", 1)
            p = probs.get((name, dtype))
            if p is None:
                continue
            now = _plan_now(p)
            # the row names no plan (its config: strategy and split only): today's plan is not compared
            form = "earlier (round 2's GEMV kernel)" if now and now.get("gemv") else "unchecked (the plan then)"
            yield name, dtype, p, ct.kernel_us(r, "convbw"), ct.kernel_us(r, "cudnn"), form


SOURCES: tuple[tuple[str, str, Callable[[], Iterator[Row]]], ...] = (
    ("remeasure run 1, product (main 3516730)", "h100_2026-12-06_remeasure/run1", _remeasure_product),
    ("depthwise_sm90 round 2 (branch dw90)", "h100_2026-12-06_depthwise_sm90", _depthwise_round2),
    ("zootune (7462f12, heuristic's plan)", "h100_2026-12-06_zootune", _zootune),
    ("heur_heldout (the plan as merged)", "h100_2026-12-06_heur_heldout", _heur_heldout),
    ("gemv round 2 (c12f434)", "h100_2026-12-06_gemv_round2", _gemv_round2),
)


def collect() -> list[dict[str, Any]]:
    """Every row of every source with its class and form."""
    out = []
    for label, folder, rows in SOURCES:
        for name, dtype, p, ours, cud, form in rows():
            out.append({"source": label, "folder": folder, "name": name, "dtype": dtype, "class": ct.problem_class(p),
                        "ours_us": ours, "cudnn_us": cud, "form": form})  # fmt: skip
    return out


def _f(v: float | None, spec: str = "{:.2f}") -> str:
    return spec.format(v) if v is not None else "-"


def summary(rows: list[dict[str, Any]]) -> list[str]:
    """A line a (class, source, form): rows, cuDNN/ours geomean, min, below 0.5, f16/bf16 time (worst)."""
    lines = ["| class | source (bench/results/...) | form | rows | compared | cuDNN/ours geomean | min | below 0.5x "
             "| f16/bf16 time, worst pair |", "|---" * 9 + "|"]  # fmt: skip
    groups: dict[tuple[str, str, str], list[dict]] = {}
    for r in rows:
        form = r["form"].split(" ")[0]
        groups.setdefault((r["class"], r["folder"], form), []).append(r)
    order = {c: i for i, c in enumerate(ct.CLASSES)}
    for (cls, folder, form), rs in sorted(groups.items(), key=lambda kv: (order.get(kv[0][0], 99), kv[0][1:])):
        vals = [r["cudnn_us"] / r["ours_us"] for r in rs if r["ours_us"] and r["cudnn_us"]]
        times = {(r["name"], r["dtype"]): r["ours_us"] for r in rs if r["ours_us"]}
        pairs = [times[(n, "f16")] / times[(n, "bf16")] for (n, t) in times if t == "f16" and (n, "bf16") in times]
        lines.append(f"| {cls} | {folder} | {form} | {len(rs)} | {len(vals)} | {_f(geomean(vals) if vals else None)} "
                     f"| {_f(min(vals) if vals else None)} | {sum(v < 0.5 for v in vals)} "
                     f"| {_f(max(pairs) if pairs else None, '{:.3f}')} ({len(pairs)}) |")  # fmt: skip
    return lines


def main() -> int:
    rows = collect()
    lines = [
        "# cuDNN/ours on the H100 runs of 2026-12-06, by class (bench/class_collect.py)",
        "",
        "Every row of the sources below that timed ours and cuDNN in one process (kernel time by CUPTI, "
        "NVIDIA H100 80GB HBM3). Class: bench/class_table.py's rule on the row's shape. Form: `current` = the "
        "plan `decide(problem, 'sm_90a')` gives today on this commit (same plan; depthwise: same plan numbers "
        "and kernel switches), `earlier` = another plan or kernel, `unchecked` = the row names no plan to "
        "compare. Nothing here is a new measurement.",
        "",
    ]
    lines += summary(rows)
    lines += ["", "## Rows", "", "| class | layer | type | source | form | ours µs | cuDNN µs | cuDNN/ours |",
              "|---" * 8 + "|"]  # fmt: skip
    order = {c: i for i, c in enumerate(ct.CLASSES)}
    for r in sorted(rows, key=lambda r: (order.get(r["class"], 99), r["folder"], r["name"], r["dtype"])):
        ratio = r["cudnn_us"] / r["ours_us"] if r["ours_us"] and r["cudnn_us"] else None
        lines.append(f"| {r['class']} | {r['name']} | {r['dtype']} | {r['folder']} | {r['form']} "
                     f"| {_f(r['ours_us'], '{:.1f}')} | {_f(r['cudnn_us'], '{:.1f}')} | {_f(ratio)} |")  # fmt: skip
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
