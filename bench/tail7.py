"""Issue 39: the dense short-reduction class on Hopper, searched. The zoo tuned on an H100 (2026-12-06) loses to cuDNN
on one class: dense (G = 1) layers whose reduction N Ho Wo is short (1,568 = 7x7 at batch 32, or 3,136), the last
stage of every ImageNet CNN (0.31-0.96x cuDNN), and none of the tuner's neighbours of the plan wins there. This probe
times a GRID of every kernel family the plan can ask for on sm_90a, wider than the tuner's, against the plan now and
cuDNN (the runner's), so the next change (a rule, a tile width, a kernel) is chosen by measurement:

    wgmma       the sm_90a kernel: tile width bn 64 (asked: the rule weighs it only where Y X C <= 64), 128, 192,
                256 x split k_batch 1, 2, 3, 4, 6, 8, 12 (where the kernel takes the split: no empty last slice)
    wgmma_sk    the same kernel with StreamK on the SMs (bn 128, 256, 192; the model has no 64-wide StreamK)
    sm80        the mma.sync kernel on sm_90a: its own tiling (tile_m as sm_80's plan has it), tile_m 64 / 128 x
                k_batch, 4 stages, 2 producer warps (wave specialization)
    codegen     IREE's codegen of the plan (strategy codegen)

The wgmma kernel has no cluster or stage knob (its tile's stages are fixed at 4, no cluster launch): not in the
grid. Every grid point is decided by the plan (pure Python): refused ones and asks that land on another kernel (a
wgmma ask on a problem the wgmma kernel does not take) are recorded in the manifest, not built; of the legal,
distinct plans at most :data:`MAX_VARIANTS` a problem are built, the plan's first, the rest taken in turns over the
families (:data:`TURNS`), each family in its own order (wgmma: the no-split and a split of each width first; sm80:
its own tiling, both row heights unsplit, wave specialization, split 4, 4 stages, then the other splits).

    .venv/bin/python bench/tail7.py compile DIR [--workers 2] [--cache CACHE]       # here (the IREE compiler)
    python3 -m convbw_mlir.measure.run DIR --server --out OUT/results.json            # on the GPU (one process)
    .venv/bin/python bench/tail7.py report OUT/results.json --manifest DIR/manifest.json   # the tables

The layers (:data:`LAYERS`, zoo names and types) are the tuned models' first (the figures a change may be fitted
on), then the held-out models' (``bench/zoo_split.json``: a change is checked on them, never fitted), each part by
the tuned run's loss against cuDNN (worst first), so a run cut short keeps the most important rows.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # harness beside it, even with PYTHONSAFEPATH=1 (the pack)

from harness import compile_manifest, geomean, print_report, probe_main, result_seconds  # noqa: E402

TARGET = "sm_90a"
SPLIT = Path(__file__).with_name("zoo_split.json")
MAX_REDUCTION = 3136  # N Ho Wo: 7x7 maps at batch 64, or two frames of 7x7 at batch 32 (the class's longest)
MIN_REDUCTION = 128  # at most this short, a plain GEMM is IREE codegen's by rule (policies/sm90.py SHORT_REDUCTION)
MAX_VARIANTS = 12  # a problem's kernels, the plan's included (cuDNN is the runner's): ~0.35 s each on the GPU
K_GRID = (1, 2, 3, 4, 6, 8, 12)
# the wgmma family's order: each width's no-split and a split first (the tuner measured the plan's width +- one
# split), then the remaining splits, wider ones last (a short reduction leaves few k tiles a slice)
WGMMA_ORDER = [(64, 1), (128, 2), (256, 1), (64, 2), (192, 1), (128, 4), (256, 2), (64, 4), (128, 1), (192, 2),
               (64, 3), (128, 3), (256, 4), (64, 6), (128, 6), (192, 4), (256, 3), (192, 3), (64, 8), (128, 8),
               (64, 12), (128, 12), (256, 6), (192, 6), (256, 8), (192, 8), (256, 12), (192, 12)]  # fmt: skip
STREAMK_WIDTHS = (128, 256, 192)
# the families' turns: the wgmma kernel (the plan's on most of the class) has the most grid points
TURNS = ("wgmma", "sm80", "wgmma", "wgmma_sk", "codegen", "wgmma", "sm80")

# (zoo name, dtype): tuned models' layers, then held-out models' (in the zoo at N = 32; "0.57x": the tuned run's
# cuDNN / our best; "untuned": a held-out model's layer the tuner never ran)
LAYERS = [
    ("r2plus1d_18.layer4.0.conv2.0.0.n32", "f16"),  # 3-D 1x3x3 512 -> 921, 0.31x
    ("r2plus1d_18.layer4.0.conv1.0.3.n32", "bf16"),  # 3-D 3x1x1 921 -> 512 (odd C: sm80), 0.39x
    ("s3d.features.14.branch1.1.0.0.n32", "bf16"),  # 3-D 1x3x3 160 -> 320 (C 160: sm80), 0.41x
    ("regnet_y_3_2gf.trunk_output.block4.block4-0.f.c.0.n32", "f16"),  # 1x1 1512 (C % 64: sm80), 0.44x
    ("cspresnet50.stages.3.blocks.0.conv1.conv.n32", "f16"),  # 1x1 1024 -> 512, 0.48x
    ("regnet_x_1_6gf.trunk_output.block4.block4-0.proj.0.n32", "f16"),  # 1x1 s2 408 -> 912 (sm80), 0.53x
    ("densenet121.features.denseblock4.denselayer13.conv1.n32", "f16"),  # 1x1 896 -> 128, 0.54x
    ("efficientnet_v2_s.features.6.1.block.3.0.n32", "f16"),  # 1x1 1536 -> 256, 0.54x
    ("resnet50.layer4.0.conv3.n32", "bf16"),  # 1x1 512 -> 2048, 0.57x
    ("densenet121.features.denseblock4.denselayer16.conv1.n32", "bf16"),  # 1x1 992 -> 128 (sm80), 0.59x
    ("mobilenet_v2.features.18.0.n32", "f16"),  # 1x1 320 -> 1280, 0.59x
    ("ghostnet_100.blocks.8.0.ghost1.primary_conv.0.n32", "bf16"),  # 1x1 160 -> 480 (sm80), 0.75x
    ("lcnet_050.blocks.5.1.conv_pw.n32", "f16"),  # 1x1 256, 0.61x
    ("googlenet.inception5b.branch2.1.conv.n32", "f16"),  # 3x3 192 -> 384, 0.70x
    ("resnext50_32x4d.layer4.0.conv3.n32", "bf16"),  # 1x1 1024 -> 2048, 0.71x
    ("repvgg_a2.stages.3.0.conv_kxk.conv.n32", "f16"),  # 3x3 s2 384 -> 1408, 0.83x
    ("r3d_18.layer4.0.conv2.0.n32", "f16"),  # 3-D 3x3x3 512, 0.84x
    ("r2plus1d_18.layer4.1.conv1.0.0.n32", "bf16"),  # 3-D 1x3x3 512 -> 1152, 0.87x
    # held out (bench/zoo_split.json): checked, never fitted
    ("mixnet_s.conv_head.n32", "bf16"),  # 1x1 200 -> 1536 (sm80), 0.50x
    ("efficientnet_b0.features.6.1.block.3.0.n32", "f16"),  # 1x1 1152 -> 192, 0.55x
    ("regnet_y_400mf.trunk_output.block4.block4-0.f.c.0.n32", "f16"),  # 1x1 440 (sm80), 0.56x
    ("mobilenet_v3_small.features.10.block.3.0.n32", "f16"),  # 1x1 576 -> 96, 0.62x
    ("wide_resnet50_2.layer4.0.conv2.n32", "bf16"),  # 3x3 1024, untuned
    ("regnety_016.s4.b1.conv3.conv.n32", "bf16"),  # 1x1 888 (sm80), untuned
]


def reduction(p: Any) -> int:
    """The problem's reduction length N Ho Wo (N Do Ho Wo in 3-D)."""
    return p.batch * math.prod(p.output_size)


def class_refusal(p: Any) -> str:
    """Why ``p`` is not of this probe's class ("" : it is): dense (one group), 2-D or 3-D, a reduction of more than
    :data:`MIN_REDUCTION` and at most :data:`MAX_REDUCTION`."""
    why = []
    if p.groups != 1:
        why.append(f"groups: {p.groups} (dense only: 1)")
    if p.rank not in (2, 3):
        why.append(f"rank: {p.rank} (2-D or 3-D)")
    if not MIN_REDUCTION < reduction(p) <= MAX_REDUCTION:
        why.append(f"reduction: {reduction(p)} (N Ho Wo in {MIN_REDUCTION + 1} .. {MAX_REDUCTION})")
    return "; ".join(why)


def held_out_models(split: Path = SPLIT) -> set[str]:
    """The held-out models of the zoo's split by model (decided before tuning)."""
    return set(json.loads(split.read_text())["held_out"])


def layers(names: list[tuple[str, str]] = LAYERS, held: set[str] | None = None) -> list[tuple[str, Any, bool]]:
    """(name, problem, held out) of each ``(zoo name, dtype)``, the tuned models' first (their order kept).

    Raises:
        ValueError: a name the zoo lacks, or a layer not of the class (naming it and why).
    """
    from convbw_mlir.suites import load_suite

    held = held_out_models() if held is None else held
    zoo = {t: dict(load_suite("zoo", t)) for t in sorted({t for _, t in names})}
    out = []
    for name, dtype in names:
        p = zoo[dtype].get(name)
        if p is None:
            raise ValueError(f"layer: {name!r} ({dtype}) is not a zoo problem")
        if why := class_refusal(p):
            raise ValueError(f"layer: {name!r} is not of the short-reduction dense class: {why}")
        out.append((name, p, name.split(".")[0] in held))
    return sorted(out, key=lambda e: e[2])  # stable: the tuned first, each part in its order


def family(plan: Any) -> str:
    """A plan's kernel family: ``wgmma``, ``wgmma_sk`` (StreamK), ``sm80`` (the mma.sync kernel; ``sm80_ws`` wave-
    specialized), ``codegen`` (IREE's codegen of any tile), or its strategy."""
    from convbw_mlir.plan_data import Strategy
    from convbw_mlir.policies import sm90

    if sm90.is_sm90(plan):
        return "wgmma_sk" if plan.streamk is not None else "wgmma"
    if plan.strategy == Strategy.EXPLICIT and plan.tile is not None and "MMA_SYNC" in plan.tile.intrinsic:
        return "sm80_ws" if plan.wavespec is not None else "sm80"
    return "codegen" if plan.strategy != Strategy.EXPLICIT else str(plan.strategy)


def grid(p: Any) -> dict[str, list[tuple[str, dict[str, Any]]]]:
    """Each family's (label, options) asks for ``p``, in the family's order."""
    from convbw_mlir.plan import PlanError, decide

    explicit = {"strategy": "explicit"}
    try:  # the sm_80 kernel's own tiling, as the tuner asks for it (dispatch/variants.py _sm80_kernel)
        own = decide(p, "sm_80", strategy="explicit").tile
    except (PlanError, ValueError):
        own = None
    split = [
        (f"sm80_m{m}_k{k}", {**explicit, "tile_m": m, "k_batch": k}) for k in (1, 4, 2, 6, 3, 8, 12) for m in (64, 128)
    ]
    sm80 = [("sm80_own", {**explicit, "tile_m": own.m})] if own is not None else []
    sm80 += split[:2] + [("sm80_ws2", {**explicit, "producers": 2})] + split[2:4]
    sm80 += [("sm80_stages4", {**explicit, "tile_m": 128, "stages": 4})] + split[4:]
    return {
        "wgmma": [(f"wgmma_bn{n}_k{k}", {**explicit, "tile_n": n, "k_batch": k}) for n, k in WGMMA_ORDER],
        "wgmma_sk": [(f"wgmma_sk_bn{n}", {**explicit, "streamk": "auto", "tile_n": n}) for n in STREAMK_WIDTHS],
        "sm80": sm80,
        "codegen": [("codegen", {"strategy": "codegen"})],
    }


def prune(p: Any, cap: int = MAX_VARIANTS) -> tuple[list[Any], dict[str, Any]]:
    """The variants to build for ``p`` (the plan's first, then at most ``cap`` - 1 legal plans of :func:`grid`, taken
    in :data:`TURNS` over the families, none repeating a plan) and the grid's account: each point's family, the
    refused (reason), the repeats of an earlier plan, the legal ones left out, and the counts."""
    from convbw_mlir.dispatch.variants import OPTIONS, Variant, heuristic
    from convbw_mlir.plan import PlanError, decide

    plan = heuristic(p, TARGET)
    chosen: list[Any] = [plan]
    legal: dict[str, list[Any]] = {}
    refused: dict[str, str] = {}
    asks = grid(p)
    for fam, points in asks.items():
        legal[fam] = []
        for label, opts in points:
            try:
                got = decide(p, TARGET, **opts)
            except (PlanError, ValueError) as e:
                refused[label] = str(e).splitlines()[0][:200]
                continue
            if family(got) != fam and not (fam == "sm80" and family(got) == "sm80_ws"):
                refused[label] = f"the plan is the {family(got)} kernel's, not {fam}'s (the kernel does not take it)"
                continue
            kept = tuple(sorted((k, v) for k, v in opts.items() if k in OPTIONS))  # producers: the plan carries it
            legal[fam].append(Variant("convbw", got, kept, label))
    same: dict[str, str] = {}
    left = {fam: list(vs) for fam, vs in legal.items()}
    while len(chosen) < cap and any(left.values()):
        for fam in TURNS:
            while left[fam] and len(chosen) < cap:
                v = left[fam].pop(0)
                twin = next((w for w in chosen if w.plan == v.plan), None)
                if twin is None:
                    chosen.append(v)
                    break
                same[v.label] = twin.label
    pruned = []
    for v in (v for vs in left.values() for v in vs):  # the legal ones not reached: a repeat, or left out
        twin = next((w for w in chosen if w.plan == v.plan), None)
        if twin is None:
            pruned.append(v.label)
        else:
            same[v.label] = twin.label
    built = {v.name: family(v.plan) for v in chosen}
    counts = {"grid": sum(map(len, asks.values())), "refused": len(refused), "same_plan": len(same),
              "pruned": len(pruned), "built": len(chosen)}  # fmt: skip
    return chosen, {"families": built, "refused": refused, "same_plan": same, "pruned": pruned, "counts": counts}


# the GPU's cost (issue 39's server runs on an H100): a contender checked and timed, and the server's start
CONTENDER_S, START_S = 0.35, 8.0


def estimate_s(manifest: dict[str, Any]) -> float:
    """Seconds the runner needs for ``manifest``: its built kernels and cuDNN a problem at :data:`CONTENDER_S` each,
    plus :data:`START_S`."""
    built = sum(1 + sum(1 for n, c in e["contenders"].items() if n != "reference" and c.get("ok"))
                for e in manifest["problems"])  # fmt: skip
    return START_S + CONTENDER_S * built


def compile_all(out: Path, workers: int, cache: Path) -> int:
    items = []
    for name, p, held in layers():
        vs, account = prune(p)
        items.append((name, p, vs, {"held_out": held, "reduction": reduction(p), "grid": account}))
        c = account["counts"]
        print(f"{name} {p.dtype}: grid {c['grid']}, refused {c['refused']}, same plan {c['same_plan']}, "
              f"pruned {c['pruned']}, built {c['built']}", flush=True)  # fmt: skip
    return compile_manifest(out, items, workers, cache, TARGET)


# -- the report -------------------------------------------------------------------------------------------
PLAN = "convbw[heuristic]"


def _us(t: float | None) -> str:
    return f"{t * 1e6:.1f}" if t else "-"


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a and b else "-"


def _shape(p: dict[str, Any]) -> str:
    taps = "x".join(map(str, p["filter_size"]))
    return f"{taps} {p['in_channels']}->{p['out_channels']}"


def summarize(rows: list[dict[str, Any]], manifest: dict[str, Any]) -> dict[str, Any]:
    """Per problem (``rows``: the runner's results rows; ``manifest``: the compile side's), each family's best time
    and label, the plan's and cuDNN's time, the overall best; the statuses that were not ok."""
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
            if t and f and (f not in best or t < best[f][0]):
                best[f] = (t, n)
        ours = [t for n, t in times.items() if n in fams and t]
        top = min(((t, n) for n, t in times.items() if n in fams and t), default=None)
        out.append({"name": r["name"], "key": r["key"], "dtype": entry["problem"]["dtype"],
                    "shape": _shape(entry["problem"]), "rank": len(entry["problem"]["filter_size"]),
                    "held_out": bool(entry.get("held_out")), "plan_family": fams.get(PLAN),
                    "plan": times.get(PLAN), "cudnn": times.get("cudnn"), "best": top[0] if top else None,
                    "best_name": top[1] if top else None, "families": best, "timed": len(ours),
                    "times": {n: t for n, t in times.items() if n in fams and t}})  # fmt: skip
    return {"rows": out, "not_ok": bad}


def report_lines(s: dict[str, Any]) -> list[str]:
    """The tables: a row a problem, then by family and set (tuned / held out) how often it is the best and its
    geomean against the plan and cuDNN, then each grid point's wins and geomean against the best, then the class's
    verdict against cuDNN."""
    fams = ["wgmma", "wgmma_sk", "sm80", "sm80_ws", "codegen"]
    lines = ["| layer | dtype | shape | set | plan kernel | plan us | cuDNN us | best | best us | plan/best | "
             "cuDNN/best | cuDNN/plan | " + " | ".join(f"{f} us" for f in fams) + " |",
             "|---|---|---|---|---|---:|---:|---|---:|---:|---:|---:|" + "---:|" * len(fams)]  # fmt: skip
    for r in s["rows"]:
        lines.append(f"| {r['name']} | {r['dtype']} | {r['shape']} | {'held' if r['held_out'] else 'tune'} | "
                     f"{r['plan_family'] or '-'} | {_us(r['plan'])} | {_us(r['cudnn'])} | {r['best_name'] or '-'} | "
                     f"{_us(r['best'])} | {_ratio(r['plan'], r['best'])} | {_ratio(r['cudnn'], r['best'])} | "
                     f"{_ratio(r['cudnn'], r['plan'])} | "
                     + " | ".join(_us(r["families"].get(f, (None,))[0]) for f in fams) + " |")  # fmt: skip
    lines += ["", "| set | family | problems timed | best on | geomean plan / family's best (> 1: faster) | "
              "geomean cuDNN / family's best | family beats cuDNN on |",
              "|---|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    for held in (False, True):
        part = [r for r in s["rows"] if r["held_out"] == held]
        for f in fams:
            got = [r for r in part if f in r["families"]]
            if not got:
                continue
            wins = sum(1 for r in got if r["best_name"] == r["families"][f][1])
            vs_plan = geomean([r["plan"] / r["families"][f][0] for r in got if r["plan"]])
            vs_cudnn = geomean([r["cudnn"] / r["families"][f][0] for r in got if r["cudnn"]])
            beats = sum(1 for r in got if r["cudnn"] and r["families"][f][0] < r["cudnn"])
            lines.append(f"| {'held' if held else 'tune'} | {f} | {len(got)} | {wins} | "
                         f"{'-' if vs_plan is None else f'{vs_plan:.2f}'} | "
                         f"{'-' if vs_cudnn is None else f'{vs_cudnn:.2f}'} | {beats} |")  # fmt: skip
    lines += ["", "| grid point | timed on | best on (tune) | best on (held) | geomean its time / the problem's best |",
              "|---|---:|---:|---:|---:|"]  # fmt: skip
    points = sorted({n for r in s["rows"] for n in r.get("times", {})})
    for n in points:
        got = [r for r in s["rows"] if n in r["times"]]
        wins = [sum(1 for r in got if r["best_name"] == n and r["held_out"] == h) for h in (False, True)]
        lines.append(
            f"| {n} | {len(got)} | {wins[0]} | {wins[1]} | {geomean([r['times'][n] / r['best'] for r in got]):.2f} |"
        )
    lines += ["", "| set | problems | geomean cuDNN/plan | geomean cuDNN/best of the grid | min cuDNN/best | "
              "grid's best beats cuDNN on |", "|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    for held in (False, True):
        part = [r for r in s["rows"] if r["held_out"] == held and r["cudnn"] and r["best"]]
        if not part:
            continue
        plan = geomean([r["cudnn"] / r["plan"] for r in part if r["plan"]])
        best = [r["cudnn"] / r["best"] for r in part]
        lines.append(f"| {'held' if held else 'tune'} | {len(part)} | {'-' if plan is None else f'{plan:.2f}'} | "
                     f"{geomean(best):.2f} | {min(best):.2f} | {sum(b > 1 for b in best)} |")  # fmt: skip
    if s["not_ok"]:
        lines += ["", "not ok:", *s["not_ok"]]
    return lines


def report(results: list[Path], manifest: Path) -> int:
    """The tables of :func:`report_lines` from the runner's part files and the compile side's manifest."""
    return print_report(results, manifest, summarize, report_lines)


def main(argv: list[str] | None = None) -> int:
    return probe_main(argv, __doc__, "tail7", 2, compile_all, report)


if __name__ == "__main__":
    sys.exit(main())
