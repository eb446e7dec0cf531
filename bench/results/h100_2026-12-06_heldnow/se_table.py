"""The squeeze-excite table of rule short-reduction-codegen at batch 64 and 128 (this folder's se64/, se128/):
our kernel (the plan's choice, explicit) against IREE's codegen, kernel time, fitted (the split's training models)
and held out (bench/zoo_split.json). Run from the repo root: .venv/bin/python <this folder>/se_table.py"""

from __future__ import annotations

import json
from pathlib import Path

from convbw_mlir.dispatch import generalize
from convbw_mlir.policies import sm90
from convbw_mlir.problem import ConvBwdWeightProblem

HERE = Path(__file__).parent


def rows() -> list[dict]:
    models, split = generalize.read_models("zoo"), generalize.read_split("bench/zoo_split.json")
    out = []
    for run in ("se64", "se128"):
        for row in json.loads((HERE / run / "results.json").read_text())["problems"]:
            p = ConvBwdWeightProblem.from_dict(row["problem"])
            c = row["contenders"]
            n32 = row["name"].rsplit(".n", 1)[0] + ".n32"  # the zoo's name: the split knows the layer at batch 32
            out.append({"set": "held out" if generalize.is_held_out(models[n32], split) else "fitted",
                        "layer": row["name"].rsplit(".n", 1)[0], "type": p.dtype, "C": p.in_channels,
                        "K": p.out_channels, "weights": p.in_channels * p.out_channels, "reduction": p.batch,
                        "ours": c["convbw[heuristic]"]["kernel_s"] * 1e6,
                        "codegen": c["convbw[strategy=codegen]"]["kernel_s"] * 1e6})  # fmt: skip
    return out


def main() -> None:
    lines = ["| reduction | set | layer | type | C x K | weights | ours, µs | codegen, µs | ours / codegen |",
             "|---:|---|---|---|---|---:|---:|---:|---:|"]  # fmt: skip
    all_rows = rows()
    for r in sorted(all_rows, key=lambda r: (r["reduction"], r["set"] != "fitted", r["weights"])):
        ratio = r["ours"] / r["codegen"]
        lines.append(f"| {r['reduction']} | {r['set']} | {r['layer']} | {r['type']} | {r['C']} x {r['K']} "
                     f"| {r['weights']} | {r['ours']:.2f} | {r['codegen']:.2f} | {ratio:.2f} |")  # fmt: skip
    lines.append("")
    for red in (64, 128):
        for s in ("fitted", "held out"):
            under = [r for r in all_rows if r["reduction"] == red and r["set"] == s and r["weights"] <= sm90.SHORT_GEMM]
            wins = [r for r in under if r["codegen"] < r["ours"]]
            lost = ", ".join(f"{r['weights']} ({r['ours'] / r['codegen']:.2f})" for r in under if r not in wins)
            lines.append(f"- reduction {red}, {s}, weights <= {sm90.SHORT_GEMM}: codegen faster on {len(wins)} of "
                         f"{len(under)}; ours faster at weights {lost or 'none'}")  # fmt: skip
    # the rule (sm90.SHORT_WORK): one limit on the GEMM's work, reduction x weights, at the batch-32 corner
    work = sm90.SHORT_WORK
    lines.append("")
    for red in (64, 128):
        for s in ("fitted", "held out"):
            some = [r for r in all_rows if r["reduction"] == red and r["set"] == s]
            right = [r for r in some if (r["weights"] * red <= work) == (r["codegen"] < r["ours"])]
            wrong = ", ".join(f"{r['weights']} ({r['ours'] / r['codegen']:.2f})" for r in some if r not in right)
            lines.append(f"- reduction {red}, {s}, codegen where reduction x weights <= {work}: right on "
                         f"{len(right)} of {len(some)}; wrong at weights {wrong or 'none'}")  # fmt: skip
    print("\n".join(lines))


if __name__ == "__main__":
    main()
