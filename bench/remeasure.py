"""Issue 39 item 1: the claims that rested on a ``--jobs`` run, measured again with one measuring process a GPU
(docs/timing.md, "Claims re-measured").

    .venv/bin/python bench/remeasure.py compile DIR [--only GROUP ...]        # here (IREE compiler), sm_80 + sm_90a
    python3 bench/remeasure.py run DIR --out OUT --budget 300                 # the GPU machine (runtime, torch)
    python bench/remeasure.py compare OUT > table.md                          # old against new, claim by claim

Each group of :data:`GROUPS` is one manifest of the product's runner (``convbw_mlir.measure.run``'s format):
the claim's problems, each with the contenders the claim compares (ours and its variants by name, compiled by
``compile_op`` as the claim's script did), cuDNN beside them in the same process. ``run`` measures the groups in
order, each through one persistent measuring server (``run_manifest(server=True)``: candidates checked once
against float64 with NaN after x and dy, timed alone under the GPU's lock; docs/timing.md#server), never two at
once, and starts no group once ``--budget`` seconds are spent (those are listed as skipped). Its figure is the
CUPTI kernel time a call (``kernel_s``; the call's wall clock where CUPTI gave none).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tarfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

# numpy's whole float64 dW only where it takes a second or two: every contender is checked on the float64
# sample anyway, and these kernels passed the full check in the claims' own runs
NUMPY_MAX_FLOPS = 4e9


# -- the groups: problems and contenders ----------------------------------------------------------------
def _product_problems() -> dict[str, Any]:
    import hopper_conv as hc

    return {**hc.problems(), **hc.held_out(), **hc.ranked_problems()}


def _product_kinds(name: str, p: Any) -> dict[str, tuple[str, dict[str, Any]]]:
    """The product's sm_90a choice, our sm_80 kernel as hopper_conv.py --product built it, and the split rule's
    old choice where the plan now takes StreamK (the StreamK claim)."""
    import hopper_conv as hc

    from convbw_mlir.plan import decide

    kinds = {"ours90": ("sm_90a", {}), "ours80": ("sm_80", {} if p.layout_family.ck_code == 4 else
                                                  {"strategy": "explicit"})}  # fmt: skip
    if decide(p, "sm_90a").streamk is not None:
        for splits, bn in hc.VARIANTS.get(name, [])[:1]:
            kinds["split90"] = ("sm_90a", {"strategy": "explicit", "k_batch": splits, "tile_n": bn})
    return kinds


def _dense_problems() -> dict[str, Any]:
    import explicit_conv as ec

    return ec.problems()


def _dense_kinds(name: str, p: Any) -> dict[str, tuple[str, dict[str, Any]]]:
    """explicit_conv.py's goal-1 run: ours (the explicit kernel), the 128x256 recipe where the rule chose
    another tiling, IREE's codegen (the product's default then)."""
    from convbw_mlir.plan import decide

    kinds = {"ours": ("sm_80", {"strategy": "explicit"}), "codegen": ("sm_80", {"strategy": "codegen"})}
    plan = decide(p, "sm_80", strategy="explicit")
    if (plan.tile.m, plan.tile.n) != (128, 256):
        kinds["recipe"] = ("sm_80", {"strategy": "explicit", "tile_n": 256})
    return kinds


# explicit_bf16_rank's f16/bf16 pairs and a representative part of its bf16 2-D set
BF16 = ("retina_k256_100", "retina_k2376_50", "large_3x3_256_n64_56", "resnet50_3x3_256_n256_14",
        "resnet50_1x1_1024to256_n256_14", "streamk_3x3_128_n32_28", "retina_k36_25",
        "dilated_3x3_d2_256_28")  # fmt: skip


def _bf16_problems() -> dict[str, Any]:
    import explicit_conv as ec

    return {n: p for n, p in ec.problems(types=("bf16",)).items() if n.removesuffix("_bf16") in BF16}


# classes_after/layout4.md's eight 2-D layers; classes.py's five layout-4 twins (LAYOUT4)
LAYOUT4 = ("resnet50_3x3_64_n32_56", "streamk_3x3_128_n32_28", "streamk_3x3_512_n32_7", "retina_k36_50",
           "retina_k256_25_s2", "retina_k2376_50", "large_3x3_256_n64_56", "dilated_3x3_d2_256_28")  # fmt: skip


def _layout4_problems() -> dict[str, Any]:
    import classes
    import explicit_conv as ec

    return {n: p for n, p in ec.layout4_problems().items() if n in LAYOUT4 or n in classes.LAYOUT4}


def _layout4_kinds(name: str, p: Any) -> dict[str, tuple[str, dict[str, Any]]]:
    """explicit_conv.py --layout4: ours (the plan's default: the relayout), the gathered kernel, the former
    choice (IREE's codegen)."""
    return {"ours": ("sm_80", {}), "gather": ("sm_80", {"strategy": "explicit"}),
            "codegen": ("sm_80", {"strategy": "codegen"})}  # fmt: skip


def _depthwise_problems() -> dict[str, Any]:
    import explicit_conv as ec

    return ec.problems(depthwise=True, types=("f16", "bf16"))


def _depthwise_kinds(name: str, p: Any) -> dict[str, tuple[str, dict[str, Any]]]:
    """explicit_conv.py --depthwise: the rule's wide form, its narrow form (a stored plan), the former SIMT plan
    (run 1's manifest)."""
    import explicit_conv as ec

    from convbw_mlir.plan import decide

    plan = decide(p, "sm_80", strategy="explicit")
    kinds: dict[str, tuple[str, Any]] = {"ours": ("sm_80", {"strategy": "explicit"})}
    narrow = ec._narrow(p, plan) if plan.depthwise is not None else None
    if narrow is not None:
        kinds["narrow"] = ("sm_80", {"plan": narrow})
    simt = _old_plans().get(name)
    if simt is not None:
        kinds["simt"] = ("sm_80", {"plan": simt})
    return kinds


def _old_plans() -> dict[str, Any]:
    """The former SIMT plans of depthwise run 1 (its manifest's ``product`` entries), by problem."""
    from convbw_mlir.plan_data import Plan

    path = Path(__file__).parent / "results/h100_2026-11-25_depthwise/run1_manifest.json"
    out = {}
    for e in json.loads(path.read_text())["entries"]:
        if e["kind"] == "product" and e.get("plan"):
            try:
                out[e["problem"]] = Plan.from_dict(e["plan"])
            except (KeyError, TypeError, ValueError):
                pass
    return out


def _thin_problems() -> dict[str, Any]:
    import explicit_conv as ec

    return ec.problems(thin=True)


def _thin_kinds(name: str, p: Any) -> dict[str, tuple[str, dict[str, Any]]]:
    """explicit_conv.py --thin: merged groups (every MMA tile, the default since that run), the same with the skip
    of the tiles off the diagonal, the grouped form, one group a GEMM, the product's plan."""
    from dataclasses import replace

    import explicit_conv as ec

    from convbw_mlir.plan import Overrides, decide
    from convbw_mlir.policies import depthwise as depthwise_policy
    from convbw_mlir.targets import get_target

    merge = ec._merge_groups(p, get_target("sm_80"))
    merged = decide(p, "sm_80", strategy="explicit", merge_groups=merge)
    skip = replace(merged, merge=replace(merged.merge, skip_off_diagonal=True))
    return {"merged": ("sm_80", {"strategy": "explicit", "merge_groups": merge}),  # every MMA tile: the default now
            "merged_skip": ("sm_80", {"plan": skip}),
            "grouped": ("sm_80", {"plan": depthwise_policy.plan(p, get_target("sm_80"), Overrides())}),
            "onegroup": ("sm_80", {"strategy": "explicit", "merge_groups": 1}),
            "product": ("sm_80", {})}  # fmt: skip


# first_layers_rule's run 2: the ten layers, the rule before as given options
_SUB = {128: {256: (2, 4), 128: (2, 2), 64: (2, 2)}, 64: {128: (2, 2), 64: (2, 2)}}


def _first_table() -> dict[str, tuple[Any, tuple[int, int, int] | None]]:
    from convbw_mlir.problem import ConvBwdWeightProblem as P

    def conv1(n: int, dt: str = "f16") -> Any:
        return P(1, n, 3, 64, (224, 224), (7, 7), stride=2, pad_low=3, pad_high=3, layout=2, dtype=dt, dw_dtype=dt)

    return {
        "conv1_n256": (conv1(256), (128, 256, 108)),
        "conv1_n32": (conv1(32), (128, 256, 108)),
        "conv1_n32_bf16": (conv1(32, "bf16"), (128, 256, 108)),
        "vit_n64": (P(1, 64, 3, 768, (224, 224), (16, 16), stride=16, layout=2), (128, 256, 6)),
        "stem3d_n8": (
            P(
                1,
                8,
                3,
                45,
                (16, 112, 112),
                (1, 7, 7),
                stride=(1, 2, 2),
                pad_low=(0, 3, 3),
                pad_high=(0, 3, 3),
                layout=2,
            ),
            (128, 256, 108),
        ),  # fmt: skip
        "yolo52_n16": (P(1, 16, 256, 255, (52, 52), (1, 1), layout=2), (64, 128, 27)),
        "yolo13_n16": (P(1, 16, 1024, 255, (13, 13), (1, 1), layout=2), (64, 128, 5)),
        "convnext_stem_n32": (P(1, 32, 3, 96, (224, 224), (4, 4), stride=4, layout=2), None),
        "mnv2_stem_n32": (P(1, 32, 3, 32, (224, 224), (3, 3), stride=2, pad_low=1, pad_high=1, layout=2), None),
        "yolov5_stem_n16": (P(1, 16, 3, 32, (640, 640), (6, 6), stride=2, pad_low=2, pad_high=2, layout=2), None),
    }


def _first_problems() -> dict[str, Any]:
    return {name: p for name, (p, _) in _first_table().items()}


def _first_kinds(name: str, p: Any) -> dict[str, tuple[str, dict[str, Any]]]:
    prev = _first_table()[name][1]
    if prev:
        m, n, k = prev
        sm, sn = _SUB[m][n]
        old = {"strategy": "explicit", "tile_m": m, "tile_n": n, "subgroups_m": sm, "subgroups_n": sn, "k_batch": k}
    else:
        old = {"strategy": "explicit", "tile_m": 128, "tile_n": 256, "subgroups_m": 2, "subgroups_n": 4}
    return {"ours": ("sm_80", {"strategy": "explicit"}), "prev": ("sm_80", old),
            "codegen": ("sm_80", {"strategy": "codegen"})}  # fmt: skip


def _wavespec_problems() -> dict[str, Any]:
    import explicit_conv as ec
    import explicit_wavespec as ws

    return {n: p for n, p in ec.problems().items() if n in ws.FIRST}


def _wavespec_kinds(name: str, p: Any) -> dict[str, tuple[str, dict[str, Any]]]:
    """explicit_wavespec.py: the 4-warp plain pipeline, wave-specialized 4+4 and 4+2, the plan's default."""
    import explicit_wavespec as ws

    from convbw_mlir.plan import decide

    default = decide(p, "sm_80", strategy="explicit")
    tiling = ws._tiling(default)
    plain = decide(p, "sm_80", strategy="explicit", **tiling)
    opts = {"strategy": "explicit", "k_batch": plain.k_batch, **tiling}
    kinds = {"plain": ("sm_80", opts), **{k: ("sm_80", {**opts, "producers": n}) for k, n in ws.PRODUCERS.items()}}
    if default != plain:
        kinds["default"] = ("sm_80", {"strategy": "explicit"})
    return kinds


# (name, problems, contenders): measured in this order; the README's claims first
GROUPS: tuple[tuple[str, Callable[[], dict[str, Any]], Callable[[str, Any], dict]], ...] = (
    ("product", _product_problems, _product_kinds),
    ("dense", _dense_problems, _dense_kinds),
    ("layout4", _layout4_problems, _layout4_kinds),
    ("depthwise", _depthwise_problems, _depthwise_kinds),
    ("first", _first_problems, _first_kinds),
    ("thin", _thin_problems, _thin_kinds),
    ("bf16", _bf16_problems, _dense_kinds),
    ("wavespec", _wavespec_problems, _wavespec_kinds),
)


# -- compile side -----------------------------------------------------------------------------------------
def _plan_cell(plan: Any) -> str:
    """The plan in a few words: strategy, tile, split, StreamK, producers, merged groups."""
    d = plan.to_dict()
    bits = [str(d.get("strategy"))]
    tile = d.get("tile") or {}
    if tile:
        bits.append(f"{tile.get('m')}x{tile.get('n')}")
    if d.get("split"):
        bits.append(f"split {d['split'].get('k_batch')}")
    if d.get("streamk"):
        bits.append(f"streamk {d['streamk'].get('workgroups')}")
    if d.get("producers"):
        bits.append(f"producers {d['producers']}")
    if d.get("merge"):
        bits.append(f"merge {d['merge'].get('groups')}")
    if d.get("merge", {}).get("skip_off_diagonal"):
        bits.append("skip")
    if d.get("channels_last"):
        bits.append("relayout")
    return " ".join(bits)


def _compile_one(folder: Path, key: str, kind: str, p: Any, target: str, options: dict[str, Any]) -> dict:
    """One contender's record (measure.run's manifest format); a refusal or a failed compile is recorded."""
    from convbw_mlir import compile_op
    from convbw_mlir.build.iree import CompileError
    from convbw_mlir.plan import PlanError

    path = f"{key}.{kind}.vmfb"
    try:
        op = compile_op(p, target, isolate=True, cache=False, output_arg=target == "sm_90a", **options)
    except (PlanError, CompileError, ValueError) as e:
        return {"ok": False, "error": str(e).strip().splitlines()[0][:300] if str(e).strip() else "error"}
    rec: dict[str, Any] = {"ok": True, "vmfb": path, "flags": [], "config": {"plan": _plan_cell(op.plan),
                                                                             "target": target}}  # fmt: skip
    if target == "sm_90a":
        if op.launch is None or not op.launch.tensor_maps:
            return {"ok": False, "error": "sm_90a: the plan's kernel reads no tensor maps (not the direct launch)"}
        launch = folder / f"{key}.{kind}.launch"
        launch.mkdir(exist_ok=True)
        for name, data in op.launch.files().items():
            (launch / name).write_bytes(data)
        rec["launch"] = launch.name
    (folder / path).write_bytes(op.vmfb)
    return rec


def compile_group(out: Path, group: str, workers: int = 2) -> Path:
    """One group's manifest and kernels into ``out/group/`` (built beside, moved into place at the end)."""
    import datetime
    from importlib.metadata import version

    from convbw_mlir.files import atomic_directory

    _, problems_of, kinds_of = next(g for g in GROUPS if g[0] == group)
    problems = problems_of()
    with atomic_directory(out / group) as tmp:
        jobs = []
        for name, p in problems.items():
            key = f"{name}.{p.dtype}"
            jobs += [(name, key, kind, p, t, o) for kind, (t, o) in kinds_of(name, p).items()]
        with ThreadPoolExecutor(workers) as pool:  # each compile is its own process (isolate=True)
            recs = list(pool.map(lambda j: _compile_one(tmp, j[1], j[2], j[3], j[4], j[5]), jobs))
        by: dict[str, dict[str, Any]] = {}
        for (name, _, kind, _, _, _), rec in zip(jobs, recs, strict=True):
            by.setdefault(name, {})[kind] = rec
        entries = [{"name": name, "key": f"{name}.{p.dtype}", "group": group, "problem": p.to_dict(),
                    "contenders": by.get(name, {})} for name, p in problems.items()]  # fmt: skip
        manifest = {"target": "sm_90a" if group == "product" else "sm_80", "date": str(datetime.date.today()),
                    "iree_version": version("iree-base-compiler"), "contenders": sorted({k for e in entries
                                                                                        for k in e["contenders"]}),
                    "problems": entries}  # fmt: skip
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    for e in entries:
        bad = {k: r["error"] for k, r in e["contenders"].items() if not r.get("ok")}
        if bad:
            print(f"{group}/{e['name']}: not built: {bad}", flush=True)
    return out / group


# -- run side ---------------------------------------------------------------------------------------------
def run(folder: Path, out: Path, budget: float, groups: list[str] | None = None,
        numpy_max_flops: float = NUMPY_MAX_FLOPS) -> int:  # fmt: skip
    """Each group through one measuring server, in order, one at a time; a group is started only while the
    seconds a problem so far say it ends within ``budget`` (the first always)."""
    from convbw_mlir.measure.run import read_manifest, run_manifest

    out.mkdir(parents=True, exist_ok=True)
    t0, done, measured = time.time(), {}, 0
    for group, _, _ in GROUPS:
        if groups and group not in groups:
            continue
        if not (folder / group / "manifest.json").is_file():
            done[group] = "not in the pack"
            continue
        n = len(read_manifest(folder / group)["problems"])
        spent = time.time() - t0
        if measured and spent + n * spent / measured > budget:
            done[group] = f"skipped: {n} problems at {spent / measured:.1f} s each past the budget ({budget:.0f} s)"
            print(f"{group}: {done[group]}", flush=True)
            continue
        g0 = time.time()
        results = run_manifest(folder / group, server=True, numpy_max_flops=numpy_max_flops,
                               log=lambda *a: print(*a, flush=True))  # fmt: skip
        results["wall_s"] = round(time.time() - g0, 1)
        (out / f"{group}.json").write_text(json.dumps(results, indent=1) + "\n")
        measured += n
        done[group] = f"{n} problems in {results['wall_s']} s"
        print(f"{group}: {done[group]}", flush=True)
    (out / "groups.json").write_text(json.dumps({"groups": done, "wall_s": round(time.time() - t0, 1)}, indent=1))
    return 0


# -- compare: old against new ---------------------------------------------------------------------------
def kernel_us(row: dict, name: str) -> float | None:
    """A contender's kernel time a call in µs (CUPTI's; the call's wall clock where CUPTI gave none), None
    unless it ran and was correct."""
    r = row["contenders"].get(name, {})
    if r.get("status") != "ok":
        return None
    t = r.get("kernel_s") or r.get("median_s")
    return t * 1e6 if t else None


def geomean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


class Results:
    """The rows of a run's groups (``OUT/<group>.json``) by group and problem name."""

    def __init__(self, folder: Path) -> None:
        self.rows: dict[str, dict[str, dict]] = {}
        self.device = "-"
        for group, _, _ in GROUPS:
            path = folder / f"{group}.json"
            if path.is_file():
                data = json.loads(path.read_text())
                self.device = data.get("device", self.device)
                self.rows[group] = {r["name"]: r for r in data["problems"]}

    def us(self, group: str, name: str, kind: str) -> float | None:
        row = self.rows.get(group, {}).get(name)
        return kernel_us(row, kind) if row else None

    def ratios(self, group: str, names: list[str], num: str, den: str) -> dict[str, float]:
        """``num``'s time over ``den``'s per problem (> 1: ``den`` faster), where both ran correct."""
        out = {}
        for n in names:
            a, b = self.us(group, n, num), self.us(group, n, den)
            if a and b:
                out[n] = a / b
        return out


def _span(r: dict[str, float]) -> str:
    """geomean (min-max, count) of ratios, or what is missing."""
    if not r:
        return "not measured"
    v = list(r.values())
    return f"{geomean(v):.2f}x ({min(v):.2f}-{max(v):.2f}, {len(v)})"


def _names(group: str) -> list[str]:
    return list(next(g for g in GROUPS if g[0] == group)[1]())


def claims(res: Results) -> list[tuple[str, str, str, str]]:
    """(where, claim, old figure, new figure) of every claim docs/timing.md listed as resting on a --jobs run."""
    import explicit_conv as ec
    import hopper_conv as hc

    suite13, held, ranked = list(hc.problems()), list(hc.held_out()), list(hc.ranked_problems())
    dense = _names("dense")
    dense22 = [n for n in dense if n not in ec.EXTRA]
    p = "product"
    sk = [n for n in suite13 + held if res.us(p, n, "split90")]
    streamk = res.ratios(p, sk, "split90", "ours90")
    l4 = [n for n in _names("layout4") if n in LAYOUT4]
    twins = [n for n in _names("layout4") if n not in LAYOUT4]
    dw = _names("depthwise")
    thin = _names("thin")
    first = _names("first")
    unseen = ["convnext_stem_n32", "mnv2_stem_n32", "yolov5_stem_n16"]
    bf = _names("bf16")
    pairs = {n: res.us("bf16", n, "ours") / res.us("dense", n.removesuffix("_bf16"), "ours") for n in bf
             if res.us("bf16", n, "ours") and res.us("dense", n.removesuffix("_bf16"), "ours")}  # fmt: skip
    ws = _names("wavespec")
    rank1 = [n for n in ranked if n.startswith("conv1d") and not n.endswith(("_layout4", "_bf16"))]
    rank3 = [n for n in ranked if n.startswith("conv3d") and not n.endswith(("_layout4", "_bf16"))]
    rank_l4 = [n for n in ranked if n.endswith("_layout4")]

    def sp(group: str, names: list[str], num: str, den: str) -> str:
        return _span(res.ratios(group, names, num, den))

    def count(r: dict[str, float], pred: Callable[[float], bool]) -> str:
        return f"{sum(pred(v) for v in r.values())} of {len(r)}" if r else "not measured"

    def cells(group: str, names: list[str], kinds: list[str]) -> str:
        return "; ".join(f"{n}: " + " / ".join(f"{res.us(group, n, k):.1f}" if res.us(group, n, k) else "-"
                                               for k in kinds) for n in names)  # fmt: skip

    r13 = res.ratios(p, suite13, "cudnn", "ours90")
    return [
        (
            "README Results; docs/explicit-kernels.md (sm_90a through the product)",
            "the product's sm_90a choice / cuDNN on the suite's 13 dense layers",
            "1.12x (min 0.91)",
            _span(r13),
        ),
        (
            "README Results",
            "... on the 12 held-out 2-D layers",
            "1.04x (min 0.80)",
            sp(p, held, "cudnn", "ours90"),
        ),
        (
            "README Results",
            "... on the 16 1-D/3-D layers",
            "0.98x (min 0.39)",
            sp(p, ranked, "cudnn", "ours90"),
        ),
        (
            "README Results",
            "sm_90a choice vs our sm_80 kernel, 13 dense",
            "2.32x, all faster",
            sp(p, suite13, "ours80", "ours90"),
        ),
        (
            "README passes; docs/explicit-kernels.md goal 1",
            "explicit sm_80 kernel / cuDNN, dense suite (22), layout 2",
            "0.77x (0.74x with the two ResNet-50 layers)",
            f"{sp('dense', dense22, 'cudnn', 'ours')}; 24: {sp('dense', dense, 'cudnn', 'ours')}",
        ),
        (
            "docs/explicit-kernels.md goal 1",
            ">= 0.5x cuDNN, of 24",
            "19 of 24",
            count(res.ratios("dense", dense, "cudnn", "ours"), lambda v: v >= 0.5),
        ),
        (
            "docs/explicit-kernels.md goal 1",
            "the rule's tiling faster than the 128x256 recipe",
            "14 of 15",
            count(res.ratios("dense", dense, "recipe", "ours"), lambda v: v > 1),
        ),
        (
            "docs/explicit-kernels.md goal 1",
            "explicit kernel vs IREE codegen (the product's default then), 24",
            "3.42x (1.22-20.9x)",
            sp("dense", dense, "codegen", "ours"),
        ),
        (
            "docs/explicit-kernels.md, wave specialization (4 of 24 problems)",
            "plain / 4:4 and plain / 4:2",
            "0.930 and 0.746 over 24",
            f"{sp('wavespec', ws, 'plain', 'ws44')} and {sp('wavespec', ws, 'plain', 'ws42')}",
        ),
        (
            "docs/explicit-kernels.md, wave specialization",
            "the plan's default vs the 4-warp plain pipeline",
            "1.05x over 10",
            sp("wavespec", ws, "plain", "default"),
        ),
        (
            "docs/explicit-kernels.md (sm_90a); docs/results.md; policies/sm90.py",
            "sm_90a / cuDNN, 13 dense (H100, rule of then)",
            "1.00x (0.82-1.39x); 2.05x sm_80 (1.65-2.49x)",
            f"{_span(r13)} (today's rule); {sp(p, suite13, 'ours80', 'ours90')} sm_80",
        ),
        (
            "docs/explicit-kernels.md, StreamK and the rule",
            "StreamK vs the split rule's choice where the rule takes it",
            "12-20% faster",
            _span(streamk),
        ),
        (
            "docs/explicit-kernels.md, StreamK and the rule",
            "13 dense >= 0.9x cuDNN; geomean; vs sm_80",
            "13 of 13; 1.07x; 2.10x",
            f"{count(r13, lambda v: v >= 0.9)}; {_span(r13)}",
        ),
        (
            "docs/explicit-kernels.md, StreamK and the rule",
            "8 held-out ResNet-50/VGG-16 layers with the narrow tiles",
            "1.02x",
            _span(res.ratios(p, list(hc.HELD_OUT), "cudnn", "ours90")),
        ),
        (
            "docs/explicit-kernels.md, sm_90a through the product",
            "1-D/3-D: 16 vs cuDNN; vs sm_80",
            "0.90x; 2.19x",
            f"{sp(p, ranked, 'cudnn', 'ours90')}; {sp(p, ranked, 'ours80', 'ours90')}",
        ),
        (
            "docs/explicit-kernels.md, sm_90a through the product",
            "1-D and 3-D vs cuDNN",
            "1-D 1.01-1.81x, 3-D 0.68-0.94x",
            f"1-D {sp(p, rank1 + [n + '_bf16' for n in rank1], 'cudnn', 'ours90')}, 3-D "
            f"{sp(p, rank3 + [n + '_bf16' for n in rank3], 'cudnn', 'ours90')}",
        ),
        (
            "docs/explicit-kernels.md, sm_90a through the product",
            "layout 4: sm_90a on the copies vs the sm_80 relayout",
            "1.33x and 1.89x",
            sp(p, rank_l4, "ours80", "ours90"),
        ),
        (
            "docs/decisions.md, bf16",
            "bf16 explicit vs codegen (8 of the 24)",
            "3.34x over 24, all faster",
            sp("bf16", bf, "codegen", "ours"),
        ),
        (
            "docs/decisions.md, bf16",
            "bf16 / f16 of ours",
            "within 1% on 4 of 5 pairs",
            f"{count(pairs, lambda v: v <= 1.01)} within 1%; {_span(pairs)}",
        ),
        (
            "README passes; docs/decisions.md#layout4",
            "relayout vs the gathered kernel, 8 layers",
            "1.1-2.9x",
            sp("layout4", l4, "gather", "ours"),
        ),
        (
            "docs/decisions.md#layout4",
            "relayout vs the former choice (codegen); cuDNN/ours",
            "1.65-13x; 0.30-0.84",
            f"{sp('layout4', l4, 'codegen', 'ours')}; {sp('layout4', l4, 'cudnn', 'ours')}",
        ),
        (
            "docs/decisions.md#layout4",
            "layout-4 twins cuDNN/ours (conv1, Whisper conv1, R3D-18, ConvNeXt dw, ResNeXt)",
            "0.98, 0.81, 0.43, 6.96, 0.68",
            ", ".join(f"{n}: {v:.2f}" for n, v in res.ratios("layout4", twins, "cudnn", "ours").items())
            or "not measured",
        ),
        (
            "docs/decisions.md, thin groups",
            "merged / merged with the skip / grouped / one group / cuDNN, µs",
            "136.1/87.4(no skip)/168.0/423.2/70.1 ... (the skip lost everywhere)",
            cells("thin", thin, ["merged", "merged_skip", "grouped", "onegroup", "cudnn"]),
        ),
        (
            "docs/decisions.md, thin groups",
            "merged beats one group a GEMM; cuDNN/ours (merged)",
            "6 of 6; 0.77x",
            f"{count(res.ratios('thin', thin, 'onegroup', 'merged'), lambda v: v > 1)}; "
            f"{sp('thin', thin, 'cudnn', 'merged')}",
        ),
        (
            "docs/decisions.md#depthwise-by-default, run 1; docs/results.md",
            "depthwise vs the former SIMT plan",
            "2.2-10x on 15",
            sp("depthwise", dw, "simt", "ours"),
        ),
        (
            "docs/decisions.md#depthwise-by-default; docs/results.md; policies/sm80.py",
            "wide form / cuDNN over 20; narrow",
            "1.11x (run 1's kernel: 1.03x); narrow 0.83x",
            f"{sp('depthwise', dw, 'cudnn', 'ours')}; narrow {sp('depthwise', dw, 'cudnn', 'narrow')}",
        ),
        (
            "docs/decisions.md#register-path-tiles; docs/results.md",
            "first layers cuDNN/ours over 10 (rule before)",
            "1.03 (0.63)",
            f"{sp('first', first, 'cudnn', 'ours')} ({sp('first', first, 'cudnn', 'prev')})",
        ),
        (
            "docs/decisions.md#register-path-tiles",
            "unseen stems cuDNN/ours",
            "1.14-1.77x",
            sp("first", unseen, "cudnn", "ours"),
        ),
        (
            "docs/results.md, first layers",
            "vs the former codegen plan; cuDNN/ours",
            "3.5-16x; 0.25-1.63x",
            f"{sp('first', first, 'codegen', 'ours')}; {sp('first', first, 'cudnn', 'ours')}",
        ),
        (
            "bench/results/h200_2026-11-26_hopper_rank/README.md",
            "our sm_80 kernel / cuDNN on its 1-D and 3-D layers (the classes table's figures)",
            "1-D 0.34-0.90x, 3-D 0.28-0.76x",
            f"1-D {sp(p, rank1 + [n + '_bf16' for n in rank1], 'cudnn', 'ours80')}, "
            f"3-D {sp(p, rank3 + [n + '_bf16' for n in rank3], 'cudnn', 'ours80')}",
        ),
    ]


# The claims' own runs, per group: (label, rows file under bench/results/, their kind -> ours here)
OLD_RUNS: dict[str, list[tuple[str, str, dict[str, str]]]] = {
    "product": [("hopper_final (H200, --jobs 4)", "h200_2026-11-26_hopper_final/product.json",
                 {"cudnn": "cudnn", "sm80": "ours80", "product": "ours90"}),
                ("hopper_conv run 3 (H100, --jobs 4; the rule before StreamK)",
                 "h100_2026-11-26_hopper_conv/hopper_conv.json",
                 {"cudnn": "cudnn", "sm80": "ours80", "sm90": "ours90"}),
                ("hopper_perf run 2 (H200, --jobs 4)", "h200_2026-11-26_hopper_perf/run2_rule.json",
                 {"cudnn": "cudnn", "sm80": "ours80", "sm90": "ours90"})],
    "dense": [("explicit_conv layout 2 (H100, --jobs 10)", "h100_2026-11-23_explicit_conv_layout2.json",
               {"cudnn": "cudnn", "ours": "ours", "alt": "recipe", "product": "codegen"})],
    "bf16": [("explicit_bf16_rank (H100, --jobs 4)", "h100_2026-11-25_explicit_bf16_rank/rows_2d_bf16.json",
              {"cudnn": "cudnn", "ours": "ours", "alt": "recipe", "product": "codegen"})],
    "layout4": [("classes_after layout4 (H200, --jobs 8)", "h200_2026-11-26_classes_after/layout4.json",
                 {"cudnn": "cudnn", "ours": "ours", "gather": "gather", "product": "codegen"})],
    "depthwise": [("depthwise_default run 2 (H100, --jobs 8)", "h100_2026-11-25_depthwise_default/dw.json",
                   {"cudnn": "cudnn", "ours": "narrow", "alt": "ours"}),  # the rule then was the narrow form
                  ("depthwise run 1 (H100, --jobs 8; its kernel's first form)",
                   "h100_2026-11-25_depthwise/run1_rows.json",
                   {"cudnn": "cudnn", "product": "simt"})],
    "thin": [("classes_after thin_forms (H200, --jobs 8)", "h200_2026-11-26_classes_after/thin_forms.json",
              {"cudnn": "cudnn", "merged": "merged_skip", "merged_full": "merged", "ours": "grouped",
               "alt": "onegroup"})],
    "first": [("first_layers_rule run 2 (H200, --jobs 6)", "h200_2026-11-25_first_layers_rule/run2_rule_rows.jsonl",
               {"cudnn": "cudnn", "ours": "ours", "prev": "prev"})],
    "wavespec": [("explicit_wavespec (H100, --jobs 12)", "h100_2026-11-23_explicit_wavespec.json",
                  {"plain": "plain", "ws44": "ws44", "ws42": "ws42", "default": "default"})],
}  # fmt: skip


def old_rows(path: str) -> dict[str, dict[str, float]]:
    """problem -> kind -> single_us of a claim's own run (correct rows only)."""
    file = Path(__file__).parent / "results" / path
    text = file.read_text()
    data = [json.loads(line) for line in text.splitlines() if line.strip()] if path.endswith(".jsonl") else \
        json.loads(text)  # fmt: skip
    rows = data["rows"] if isinstance(data, dict) else data
    out: dict[str, dict[str, float]] = {}
    for r in rows:
        if r.get("correct", r.get("kind") == "cudnn") and r.get("single_us"):
            out.setdefault(r["problem"], {})[r["kind"]] = r["single_us"]
    return out


def detail(res: Results) -> list[str]:
    """Per group and old run: each problem's figures then and now (µs), and cuDNN / ours over the problems both
    runs have, so a claim's change shows as ours, cuDNN or the set."""
    lines = []
    for group, runs in OLD_RUNS.items():
        rows = res.rows.get(group)
        if not rows:
            continue
        for label, path, kinds in runs:
            old = old_rows(path)
            common = [n for n in rows if n in old]
            if not common:
                continue
            lines += ["", f"### {group} against {label}", "",
                      "| problem | " + " | ".join(f"{new} old -> new µs" for new in kinds.values()) + " |",
                      "|---|" + "---:|" * len(kinds)]  # fmt: skip
            for n in common:
                cells = []
                for was, new in kinds.items():
                    a, b = old[n].get(was), res.us(group, n, new)
                    cells.append(f"{a:.1f} -> {b:.1f}" if a and b else f"{a or '-'} -> {f'{b:.1f}' if b else '-'}")
                lines.append(f"| {n} | " + " | ".join(cells) + " |")
            ours = [new for new in kinds.values() if new != "cudnn"]
            for new in ours:
                was = next(k for k, v in kinds.items() if v == new)
                then = [old[n]["cudnn"] / old[n][was] for n in common if "cudnn" in old[n] and was in old[n]]
                now = res.ratios(group, common, "cudnn", new)
                moved = [res.us(group, n, new) / old[n][was] for n in common if res.us(group, n, new) and was in old[n]]
                lines.append(f"- {new}: cuDNN / it then {f'{geomean(then):.2f}x' if then else '-'} over {len(then)}, "
                             f"now {_span(now)}; its own time now / then {_span(dict(enumerate(moved)))}")  # fmt: skip
            cud = [res.us(group, n, "cudnn") / old[n]["cudnn"] for n in common if res.us(group, n, "cudnn")
                   and "cudnn" in old[n]]  # fmt: skip
            if cud:
                lines.append(f"- cuDNN's own time now / then: {_span(dict(enumerate(cud)))}")
    return lines


def compare(folder: Path) -> str:
    res = Results(folder)
    lines = [f"# Claims re-measured ({res.device}; one measuring process, bench/remeasure.py)", "",
             "| where | claim | old (--jobs run) | new (undisturbed) |", "|---|---|---|---|"]  # fmt: skip
    lines += [f"| {w} | {c} | {o} | {n} |" for w, c, o, n in claims(res)]
    lines += ["", "## Problem by problem: the claims' runs against this one", *detail(res)]
    return "\n".join(lines) + "\n"


def summary(folder: Path) -> str:
    """Per group: problems, contenders correct, and each contender's geomean against cuDNN (cuDNN / it)."""
    res = Results(folder)
    lines = [f"device: {res.device}"]
    for group, rows in res.rows.items():
        kinds = sorted({k for r in rows.values() for k in r["contenders"]} - {"cudnn"})
        ok = sum(r["contenders"][k].get("status") == "ok" for r in rows.values() for k in r["contenders"])
        tot = sum(len(r["contenders"]) for r in rows.values())
        geo = ", ".join(f"{k} {_span(res.ratios(group, list(rows), 'cudnn', k))}" for k in kinds)
        lines.append(f"{group}: {len(rows)} problems, {ok}/{tot} ok; cuDNN/ours: {geo}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="remeasure.py", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compile")
    c.add_argument("dir", type=Path)
    c.add_argument("--only", nargs="*", choices=[g[0] for g in GROUPS])
    c.add_argument("--pack", type=Path, help="also write the kernels as one tar.xz here")
    r = sub.add_parser("run")
    r.add_argument("dir", type=Path)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--budget", type=float, default=300.0)
    r.add_argument("--only", nargs="*", choices=[g[0] for g in GROUPS])
    r.add_argument("--numpy-max-flops", type=float, default=NUMPY_MAX_FLOPS,
                   help="numpy's whole float64 dW up to this many FLOPs (0: the float64 sample only)")  # fmt: skip
    for name in ("compare", "summary"):
        sub.add_parser(name).add_argument("results", type=Path)
    a = ap.parse_args(argv)
    if a.cmd == "compile":
        for group, _, _ in GROUPS:
            if not a.only or group in a.only:
                t0 = time.time()
                compile_group(a.dir, group)
                print(f"{group}: compiled in {time.time() - t0:.0f} s", flush=True)
        if a.pack:
            with tarfile.open(a.pack, "w:xz") as tar:
                tar.add(a.dir, arcname="remeasure")
        return 0
    if a.cmd == "run":
        return run(a.dir, a.out, a.budget, a.only, a.numpy_max_flops)
    print(compare(a.results) if a.cmd == "compare" else summary(a.results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
