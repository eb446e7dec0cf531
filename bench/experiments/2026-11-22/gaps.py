"""Per problem, how far each performance goal of issue 5 is and what limits it, from a bench JSON:
python gaps.py RESULTS.json > gaps.md

The limiting factor is read from the numbers by fixed rules (stated in the output), not chosen by hand.
"""

import json
import math
import sys

FLOOR_US = 43.0  # the fastest IREE-compiled call of the day (any contender, any problem): the per-call floor
MMA_CEILING = 110.0  # IREE's CUDA matmul ceiling on this GPU, TFLOP/s (../shared/DESIGN.md)

d = json.load(open(sys.argv[1]))
print(f"# Goal gaps per problem ({sys.argv[1].rsplit('/', 1)[-1]})\n")
print("Goals (issue 5): >= 0.95x IREE's better default on every problem, 5x geomean, 20x on depthwise;"
      " vs cuDNN 0.5x dense and 1.0x grouped/depthwise. Limit rules, first that applies: `default wrong`"
      f" (IREE's default is wrong: no speedup to measure); `call floor` (IREE's fastest call of the day,"
      f" {FLOOR_US:.0f} us, is over a third of ours: the per-call cost of IREE's invocation, not the kernels,"
      " bounds both ratios; cuDNN's calls take ~19 us); `mma codegen` (matrix-core strategy: TFLOP/s against IREE's ~110 TFLOP/s"
      " matmul ceiling on this GPU); `simt reduction` (depthwise/thin: fraction of the roofline reached).\n")
print("| problem | ours us | IREE default us | speedup | goal | cuDNN us | vs cuDNN | goal | limit |")
print("|---|---|---|---|---|---|---|---|---|")
for r in d["problems"]:
    c = r["contenders"]
    ours = c["convbw"]["median_s"] * 1e6
    defaults = [c[k]["median_s"] * 1e6 for k in ("iree_direct", "iree_torch") if c.get(k, {}).get("status") == "ok"]
    best = min(defaults) if defaults else None
    dw = "_dw" in r["name"]  # the depthwise problems of the suites
    cud = c.get("cudnn", {})
    cud_us = cud["median_s"] * 1e6 if cud.get("status") == "ok" else None
    strategy = c["convbw"]["config"].get("strategy")
    if best is None:
        limit = "default wrong"
    elif FLOOR_US / ours > 1 / 3:
        limit = f"call floor ({FLOOR_US / ours:.0%} of the call)"
    elif strategy == "mma":
        limit = f"mma codegen ({r['flops'] / (ours * 1e-6) / 1e12:.0f} of ~{MMA_CEILING:.0f} TFLOP/s)"
    elif strategy == "simt":
        limit = f"simt reduction ({r['roofline_s'] / (ours * 1e-6):.2f} of roofline)"
    else:
        limit = f"IREE's own config ({r['flops'] / (ours * 1e-6) / 1e12:.1f} TFLOP/s)"
    sp = f"{best / ours:.2f}" if best else "-"
    goal = ("20x" if dw else "0.95x") if best else "-"
    vs = f"{cud_us / ours:.2f}" if cud_us else ("WRONG" if cud.get("status") == "WRONG" else "-")
    cgoal = "1.0x" if r["depthwise_or_grouped"] else "0.5x"
    cud_s = f"{cud_us:.1f}" if cud_us else cud.get("status", "-")
    print(f"| {r['key']} | {ours:.1f} | {best:.1f} | {sp} | {goal} | {cud_s} | {vs} | {cgoal} | {limit} |"
          if best else f"| {r['key']} | {ours:.1f} | - | - | - | {cud_s} | {vs} | {cgoal} | {limit} |")
speed = [min(r["contenders"][k]["median_s"] for k in ("iree_direct", "iree_torch")
             if r["contenders"].get(k, {}).get("status") == "ok") / r["contenders"]["convbw"]["median_s"]
         for r in d["problems"]
         if any(r["contenders"].get(k, {}).get("status") == "ok" for k in ("iree_direct", "iree_torch"))]
print(f"\nGeomean speedup {math.exp(sum(map(math.log, speed)) / len(speed)):.2f} over {len(speed)} problems"
      f" (goal 5x); {sum(s < 0.95 for s in speed)} below 0.95x.")
