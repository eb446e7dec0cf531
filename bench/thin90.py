"""Issue 40 item 2: thin and medium groups on Hopper, side by side. Each layer's contenders: the plan now (the sm_80
kernel on sm_90a, merged where its rule merges: 4-16 channels), the wgmma kernel's boxed form (``wgmma_merge``: its
most groups a 64-channel box, the policy's split and width; and at a second width), the sm_80 kernel's merged form
where the plan is not already it (the most groups whose K fit 64 rows: 24 and 32 channels), and cuDNN (the
runner's). These figures (bench/results/h100_2026-12-06_thin90) made the boxed form the plan's default for 4-16
channels (switch ``WGMMA_MERGE_BY_DEFAULT``, rule ``policies/sm90.py: merge_rule``, widths ``MERGE_RULE_CHANNELS``):
a rerun's "plan now" is the boxed form there.

    .venv/bin/python bench/thin90.py compile DIR [--workers 2] [--cache CACHE]   # here (the IREE compiler)
    python3 -m convbw_mlir.measure.run DIR --server --out OUT/results.json         # on the GPU (one process)
    .venv/bin/python bench/thin90.py report OUT/results.json DIR/manifest.json     # the table and the verdict

The layers (N = 32, real sizes; ``tune``: the rule's widths may be set on them; ``held``: held back, none of the
rule's widths is chosen on them) come first by priority (a run cut short keeps the most important rows: the
manifest can be split with ``--part``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from harness import compile_manifest, geomean, probe_main, result_seconds

# (name, ckProfiler line "NDim G N K C <filter> <input> <strides> <dilations> <left pads> <right pads>", dtype, set)
LAYERS = [
    ("resnext50_32x4d.layer1.conv2", "2 32 32 4 4 3 3 56 56 1 1 1 1 1 1 1 1", "f16", "tune"),  # C = 4
    ("regnety_8gf.s2.conv2", "2 8 32 56 56 3 3 28 28 1 1 1 1 1 1 1 1", "f16", "tune"),  # C = 56, 448 channels
    ("resnext50_32x4d.layer2.1.conv2", "2 32 32 8 8 3 3 28 28 1 1 1 1 1 1 1 1", "f16", "tune"),  # C = 8
    ("regnet_x_1_6gf.block2-1.conv2", "2 7 32 24 24 3 3 28 28 1 1 1 1 1 1 1 1", "f16", "tune"),  # C = 24
    ("resnext50_32x4d.layer3.1.conv2", "2 32 32 16 16 3 3 14 14 1 1 1 1 1 1 1 1", "f16", "tune"),  # C = 16
    ("resnext50_32x4d.layer4.1.conv2", "2 32 32 32 32 3 3 7 7 1 1 1 1 1 1 1 1", "f16", "tune"),  # C = 32
    ("regnet_x_400mf.block2.conv2", "2 4 32 16 16 3 3 28 28 1 1 1 1 1 1 1 1", "f16", "tune"),  # RegNetX gw 16
    ("resnext50_32x4d.layer1.conv2", "2 32 32 4 4 3 3 56 56 1 1 1 1 1 1 1 1", "bf16", "tune"),
    ("regnety_8gf.s2.conv2", "2 8 32 56 56 3 3 28 28 1 1 1 1 1 1 1 1", "bf16", "tune"),
    ("regnety_8gf.s3.conv2", "2 16 32 56 56 3 3 14 14 1 1 1 1 1 1 1 1", "f16", "tune"),  # 896 channels
    ("resnext50_32x4d.layer2.0.conv2", "2 32 32 8 8 3 3 56 56 2 2 1 1 1 1 1 1", "f16", "tune"),  # stride 2
    ("resnext50_32x4d.layer3.0.conv2", "2 32 32 16 16 3 3 28 28 2 2 1 1 1 1 1 1", "f16", "tune"),
    ("resnext50_32x4d.layer4.0.conv2", "2 32 32 32 32 3 3 14 14 2 2 1 1 1 1 1 1", "f16", "tune"),
    ("regnet_y_400mf.block2-1.conv2", "2 13 32 8 8 3 3 28 28 1 1 1 1 1 1 1 1", "f16", "tune"),  # G = 13: ragged box
    ("regnet_x_1_6gf.block1-1.conv2", "2 3 32 24 24 3 3 56 56 1 1 1 1 1 1 1 1", "f16", "tune"),
    ("resnext50_32x4d.layer2.1.conv2", "2 32 32 8 8 3 3 28 28 1 1 1 1 1 1 1 1", "bf16", "tune"),
    ("resnext50_32x4d.layer3.1.conv2", "2 32 32 16 16 3 3 14 14 1 1 1 1 1 1 1 1", "bf16", "tune"),
    ("resnext50_32x4d.layer4.1.conv2", "2 32 32 32 32 3 3 7 7 1 1 1 1 1 1 1 1", "bf16", "tune"),
    ("regnet_x_400mf.block2.conv2", "2 4 32 16 16 3 3 28 28 1 1 1 1 1 1 1 1", "bf16", "tune"),
    ("regnet_x_1_6gf.block2-1.conv2", "2 7 32 24 24 3 3 28 28 1 1 1 1 1 1 1 1", "bf16", "tune"),
    ("resnext101_32x8d.layer4.1.conv2", "2 32 32 64 64 3 3 7 7 1 1 1 1 1 1 1 1", "f16", "tune"),  # C = 64: plain
    # held back (zoo layers none of the rule's widths is chosen on)
    ("held.resnest14d.layer1.0.conv2", "2 2 32 64 32 3 3 56 56 1 1 1 1 1 1 1 1", "f16", "held"),  # K 64, C 32
    ("held.regnety_016.s3.b2.conv2", "2 14 32 24 24 3 3 14 14 1 1 1 1 1 1 1 1", "bf16", "held"),
    ("held.regnet_y_400mf.block4-1.conv2", "2 55 32 8 8 3 3 7 7 1 1 1 1 1 1 1 1", "f16", "held"),
    ("held.resnext101_32x8d.layer3.1.conv2", "2 32 32 32 32 3 3 14 14 1 1 1 1 1 1 1 1", "bf16", "held"),
    ("held.regnet_x_1_6gf.block4-1.conv2", "2 38 32 24 24 3 3 7 7 1 1 1 1 1 1 1 1", "f16", "held"),
    ("held.wav2vec2.pos_conv", "1 16 32 48 48 128 49 1 1 64 64", "f16", "held"),  # 1-D, 128 taps, C = 48
]


def problem(line: str, dtype: str) -> Any:
    from convbw_mlir.problem import ConvBwdWeightProblem

    return ConvBwdWeightProblem.from_ck(line).with_(dtype=dtype, dw_dtype=dtype)


def alternatives(p: Any) -> list[tuple[str, dict[str, Any]]]:
    """(label, overrides) beside the plan now: the boxed form (the policy's width and split, then the next width by
    its own split), and the sm_80 kernel merged by its rule (where that is not the plan already)."""
    from convbw_mlir.plan import decide
    from convbw_mlir.policies import sm90

    out: list[tuple[str, dict[str, Any]]] = []
    m = sm90.merge_for(p)
    if m and not sm90.merge_refusals(p, m):
        boxed = {"strategy": "explicit", "wgmma_merge": m}
        out.append((f"wgmma_box{m}", boxed))
        bn = decide(p, "sm_90a", **boxed).tile.n
        other = next(w for w in (128, 192, 256) if w != bn)
        out.append((f"wgmma_box{m}_bn{other}", {**boxed, "tile_n": other}))
    # the sm_80 kernel merged: its rule's groups (thin groups: the plan now), else the most whose K fit 64 rows
    merge = max((g for g in range(2, p.groups + 1) if p.groups % g == 0 and g * p.out_channels <= 64), default=1)
    if merge > 1 and p.in_channels % 2 == 0:
        out.append(("sm80_merged", {"strategy": "explicit", "merge_groups": merge}))
    return out


def variants(p: Any) -> list[Any]:
    """The plan now first, then the valid alternatives whose plans differ from every earlier one."""
    from convbw_mlir.dispatch.variants import distinct

    return distinct(p, "sm_90a", alternatives(p))


def compile_all(out: Path, workers: int, cache: Path) -> int:
    items = []
    for name, line, dtype, kind in LAYERS:
        p = problem(line, dtype)
        items.append((name, p, variants(p), {"held_out": kind == "held"}))
    return compile_manifest(out, items, workers, cache)


def _kind(label: str) -> str:
    if label.startswith("convbw[wgmma_box"):
        return "wgmma_box"
    return "plan" if label == "convbw[heuristic]" else label


def report(results: list[Path], manifest: Path) -> int:
    """Per layer: each contender's kernel time (us), the boxed form's best against the plan now and against cuDNN;
    then the geomeans by group width over the tune layers, which the rule's widths (MERGE_RULE_CHANNELS) are set
    from, and over the held-back layers (``held``) apart."""
    rows = [r for f in results for r in json.loads(f.read_text())["problems"]]
    man = {e["key"]: e for e in json.loads(manifest.read_text())["problems"]}
    lines = ["| layer | dtype | C | K | G | plan now | us | boxed (best) | us | sm80 merged us | cuDNN us | "
             "plan/boxed | cuDNN/boxed | cuDNN/plan |",
             "|---|---|---:|---:|---:|---|---:|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    by_width: dict[int, list[float]] = {}
    bad = []
    for r in rows:
        entry = man.get(r["key"]) or next(e for e in man.values() if e["name"] == r["name"])
        p = entry["problem"]
        times = {n: result_seconds(c) for n, c in r["contenders"].items() if n not in ("reference",)}
        bad += [f"{r['key']} {n}: {c.get('status')} {c.get('error', '')[:100]}" for n, c in r["contenders"].items()
                if n != "reference" and c.get("status") not in ("ok", None)]  # fmt: skip
        plan = times.get("convbw[heuristic]")
        boxed = {n: t for n, t in times.items() if _kind(n) == "wgmma_box" and t}
        best = min(boxed, key=boxed.get) if boxed else None
        cudnn, sm80 = times.get("cudnn"), times.get("convbw[sm80_merged]")

        def us(t: float | None) -> str:
            return f"{t * 1e6:.1f}" if t else "-"

        def ratio(a: float | None, b: float | None) -> str:
            return f"{a / b:.2f}" if a and b else "-"

        if plan and best:  # the held-back layers apart: the rule's widths are not set on them
            key = "held" if r["name"].startswith("held.") else p["in_channels"]
            by_width.setdefault(key, []).append(plan / boxed[best])
        plan_label = entry["contenders"]["convbw[heuristic]"]["variant"]["plan"]["tile"]["intrinsic"]
        lines.append(f"| {r['name']} | {p['dtype']} | {p['in_channels']} | {p['out_channels']} | {p['groups']} | "
                     f"{'wgmma' if 'WGMMA' in plan_label else 'sm80'} | {us(plan)} | {best or '-'} | "
                     f"{us(boxed.get(best))} | {us(sm80)} | {us(cudnn)} | {ratio(plan, boxed.get(best))} | "
                     f"{ratio(cudnn, boxed.get(best))} | {ratio(cudnn, plan)} |")  # fmt: skip
    lines += ["", "| group width C | layers | geomean plan now / boxed (> 1: the boxed form faster) | min | max |",
              "|---:|---:|---:|---:|---:|"]  # fmt: skip
    for c in sorted(by_width, key=lambda c: (isinstance(c, str), c)):
        v = by_width[c]
        g = geomean(v)
        lines.append(f"| {c} | {len(v)} | {g:.2f} | {min(v):.2f} | {max(v):.2f} |")
    print("\n".join(lines))
    if bad:
        print("\nnot ok:\n" + "\n".join(bad))
    return 0


def main(argv: list[str] | None = None) -> int:
    return probe_main(argv, __doc__, "thin90", 2, compile_all, report)


if __name__ == "__main__":
    sys.exit(main())
