"""Issue 39 item 4: where the sm_90a plan's rules misrank, measured. A family of dense 2-D layers that exercise the
three suspected misrankings, chosen by geometry (not from the suites): short reductions with many wide tiles
(StreamK against the split rule), odd channel counts the wgmma kernel does not take (the sm_80 kernel's tilings),
and bandwidth-bound 1x1s (the split counts a memory floor would prefer); f16 and bf16. Each problem's
contenders: the plan's own choice, its alternatives (``ALTERNATIVES``) and cuDNN (the runner's).

    .venv/bin/python bench/heur_probe.py compile DIR [--workers 2]     # here (the IREE compiler)
    python3 -m convbw_mlir.measure.run DIR --server --out OUT/results.json   # on the GPU (one measuring process)
    .venv/bin/python bench/heur_probe.py report OUT/results.json DIR/manifest.json   # the table: ours / cuDNN
    .venv/bin/python bench/heur_probe.py replay RESULTS MANIFEST [RESULTS MANIFEST ...]  # the plan now, measured

``compile --moved BEFORE``: the suite problems (f16) whose sm_90a plan moved since a ``bench/plan_identity.py dump``
(BEFORE), each with the plan now (the heuristic) and the plan before: the held-out check of a rule change.

The manifest is ``dispatch.tune.compile_candidates``' (each contender a ``Variant`` with its options), so the
runner and the server take it as they take the tuner's; no GPU reference is built (the runner checks every
contender against float64: the sample, and numpy's whole dW where cheap).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

from harness import compile_manifest

# (name, ckProfiler line "2 G N K C Y X H W sy sx dy dx pl pl pr pr", dtype)
SHORT = [  # 3x3s whose reduction (N Ho Wo) is 0.5-4 k rows, with hundreds of 128 x 256 tiles
    ("short_3x3_1280_16_n8", "2 1 8 1280 1280 3 3 16 16 1 1 1 1 1 1 1 1", "f16"),
    ("short_3x3_640_32_n2", "2 1 2 640 640 3 3 32 32 1 1 1 1 1 1 1 1", "bf16"),
    ("short_3x3_1024_8_n16", "2 1 16 1024 1024 3 3 8 8 1 1 1 1 1 1 1 1", "f16"),
    ("short_3x3_512_14_n8", "2 1 8 512 512 3 3 14 14 1 1 1 1 1 1 1 1", "bf16"),
    ("short_3x3_640to1280_16_n4", "2 1 4 1280 640 3 3 16 16 1 1 1 1 1 1 1 1", "f16"),
    ("short_3x3_2048_7_n32", "2 1 32 2048 2048 3 3 7 7 1 1 1 1 1 1 1 1", "bf16"),
    ("short_3x3_768_24_n4", "2 1 4 768 768 3 3 24 24 1 1 1 1 1 1 1 1", "f16"),
    ("short_3x3_384_12_n16", "2 1 16 384 384 3 3 12 12 1 1 1 1 1 1 1 1", "f16"),
    ("short_3x3_1536_8_n8", "2 1 8 1536 1536 3 3 8 8 1 1 1 1 1 1 1 1", "bf16"),
    ("short_3x3_256_16_n16", "2 1 16 256 256 3 3 16 16 1 1 1 1 1 1 1 1", "f16"),
    ("long_3x3_512_28_n32", "2 1 32 512 512 3 3 28 28 1 1 1 1 1 1 1 1", "f16"),  # a long one: StreamK's home
]
ODD = [  # channel counts not multiples of 64: the sm_80 kernel on sm_90a
    ("odd_3x3_72_56_n32", "2 1 32 72 72 3 3 56 56 1 1 1 1 1 1 1 1", "f16"),
    ("odd_3x3_24_112_n16", "2 1 16 24 24 3 3 112 112 1 1 1 1 1 1 1 1", "bf16"),
    ("odd_3x3_40_56_n32", "2 1 32 40 40 3 3 56 56 1 1 1 1 1 1 1 1", "f16"),
    ("odd_3x3_96_28_n64", "2 1 64 96 96 3 3 28 28 1 1 1 1 1 1 1 1", "bf16"),
    ("odd_3x3_120_28_n32", "2 1 32 120 120 3 3 28 28 1 1 1 1 1 1 1 1", "f16"),
    ("odd_3x3_144_14_n64", "2 1 64 144 144 3 3 14 14 1 1 1 1 1 1 1 1", "f16"),
    ("odd_3x3_160_14_n32", "2 1 32 160 160 3 3 14 14 1 1 1 1 1 1 1 1", "bf16"),
    ("odd_3x3_200_7_n64", "2 1 64 200 200 3 3 7 7 1 1 1 1 1 1 1 1", "f16"),
    ("odd_3x3_72to144_28_n32", "2 1 32 144 72 3 3 28 28 1 1 1 1 1 1 1 1", "bf16"),
    ("odd_1x1_96to24_56_n32", "2 1 32 24 96 1 1 56 56 1 1 1 1 0 0 0 0", "f16"),
]
ONE = [  # 1x1s from bandwidth-bound (few channels, many pixels) to compute-bound
    ("one_1x1_64_112_n16", "2 1 16 64 64 1 1 112 112 1 1 1 1 0 0 0 0", "f16"),
    ("one_1x1_64to256_56_n32", "2 1 32 256 64 1 1 56 56 1 1 1 1 0 0 0 0", "bf16"),
    ("one_1x1_256to64_56_n32", "2 1 32 64 256 1 1 56 56 1 1 1 1 0 0 0 0", "f16"),
    ("one_1x1_128_28_n64", "2 1 64 128 128 1 1 28 28 1 1 1 1 0 0 0 0", "bf16"),
    ("one_1x1_512_7_n128", "2 1 128 512 512 1 1 7 7 1 1 1 1 0 0 0 0", "f16"),
    ("one_1x1_1024to256_14_n64", "2 1 64 256 1024 1 1 14 14 1 1 1 1 0 0 0 0", "f16"),
    ("one_1x1_128to512_28_n16", "2 1 16 512 128 1 1 28 28 1 1 1 1 0 0 0 0", "bf16"),
]
PROBLEMS = SHORT + ODD + ONE
SM80_TILINGS = ((128, 256, 64, 64), (128, 128, 64, 64), (64, 128, 32, 64), (128, 64, 64, 32), (64, 64, 32, 32))


def problem(line: str, dtype: str) -> Any:
    from convbw_mlir.problem import ConvBwdWeightProblem

    return ConvBwdWeightProblem.from_ck(line).with_(dtype=dtype, dw_dtype=dtype)


def alternatives(p: Any) -> list[tuple[str, dict[str, Any]]]:
    """(label, overrides) of the plans beside the rule's: for the wgmma kernel the split rule without StreamK at
    each width and its split halved and doubled; for the sm_80 kernel each tiling of its table (its own split)."""
    from convbw_mlir.policies import sm90
    from convbw_mlir.targets import TARGETS

    sms = TARGETS["sm_90a"].compute_units
    out: list[tuple[str, dict[str, Any]]] = []
    if sm90.takes(p):
        m, n = p.out_channels, p.in_channels * math.prod(p.filter_size)
        red = p.batch * math.prod(p.output_size)
        bn, s, _ = sm90.choose(m, n, red, sms, p.groups, streamk=False)
        out.append((f"split{s}_bn{bn}", {"strategy": "explicit", "k_batch": s, "tile_n": bn}))
        for w in sm90.widths_for(n):
            if w != bn:
                ws = sm90.choose(m, n, red, sms, p.groups, [w], streamk=False)[1]
                out.append((f"split{ws}_bn{w}", {"strategy": "explicit", "k_batch": ws, "tile_n": w}))
        for k in sorted({1, max(1, s // 4), max(1, s // 2), 2 * s, *((2, 4) if s == 1 else ())} - {s}):
            out.append((f"split{k}_bn{bn}", {"strategy": "explicit", "k_batch": k, "tile_n": bn}))
    else:
        for bm, bn, wm, wn in SM80_TILINGS:
            out.append((f"tile{bm}x{bn}", {"strategy": "explicit", "tile_m": bm, "tile_n": bn,
                                           "subgroups_m": bm // wm, "subgroups_n": bn // wn}))  # fmt: skip
    return out


def variants(p: Any) -> list[Any]:
    """The plan's own choice first, then the valid alternatives whose plans differ from every earlier one."""
    from convbw_mlir.dispatch.variants import distinct

    return distinct(p, "sm_90a", alternatives(p), log=lambda m: print(f"  {p.name}{m[1:]}", flush=True))


def moved(before: Path, dtype: str = "f16") -> list[tuple[str, Any, list[Any]]]:
    """(name, problem, [before, now]) of every suite problem whose sm_90a plan in ``before`` (a
    ``bench/plan_identity.py dump`` folder) differs from :func:`convbw_mlir.plan.decide`'s now."""
    from convbw_mlir.dispatch.variants import Variant, heuristic
    from convbw_mlir.plan_data import Plan
    from convbw_mlir.suites import load_suite

    records = {}
    for line in (before / "plans.jsonl").read_text().splitlines():
        r = json.loads(line)
        records[r["case"]] = r
    out = []
    for suite in ("seeds", "models", "ck_test_grouped_convnd_bwd_weight", "classes", "zoo"):
        for name, p in load_suite(suite, dtype):
            rec = records.get(f"{suite}.{name}.{dtype}.sm_90a")
            if rec is None or "plan" not in rec["decide"]:
                continue
            now = heuristic(p, "sm_90a")
            was = Plan.from_dict(rec["decide"]["plan"])
            if was != now.plan:
                out.append((f"{suite}.{name}", p, [now, Variant("convbw", was, (), "before")]))
    return out


def compile_all(out: Path, workers: int, cache: Path, only: str = "", before: Path | None = None) -> int:
    chosen = moved(before) if before is not None else [(n, problem(ln, t), None) for n, ln, t in PROBLEMS]
    items = [(name, p, vs or variants(p), {"held_out": False}) for name, p, vs in chosen if only in name]
    return compile_manifest(out, items, workers, cache)


def _time(res: dict[str, Any]) -> float | None:
    if res.get("status") != "ok":
        return None
    return res.get("kernel_s") or res.get("median_s")


def report(results: Path, manifest: Path) -> int:
    """Per problem: each contender's kernel time, ratio cuDNN / it, and whether the plan's choice was the best."""
    rows = json.loads(results.read_text())["problems"]
    man = {e["name"]: e for e in json.loads(manifest.read_text())["problems"]}
    lines = ["| problem | dtype | plan's choice | us | best of ours | us | cuDNN us | cuDNN/plan | cuDNN/best |",
             "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    ratios, best_ratios = [], []
    for r in rows:
        entry = man[r["name"]]
        times = {n: _time(c) for n, c in r["contenders"].items() if n not in ("reference", "cudnn")}
        heur = next(n for n, c in entry["contenders"].items() if c.get("heuristic"))
        ok = {n: t for n, t in times.items() if t}
        cudnn = _time(r["contenders"].get("cudnn", {}))
        if not ok or heur not in ok:
            lines.append(f"| {r['name']} | {entry['problem'].get('dtype')} | {heur} | failed | | | | | |")
            continue
        best = min(ok, key=ok.get)
        cells = [r["name"], entry["problem"].get("dtype"), heur, f"{ok[heur] * 1e6:.1f}", best, f"{ok[best] * 1e6:.1f}"]
        if cudnn:
            ratios.append(cudnn / ok[heur])
            best_ratios.append(cudnn / ok[best])
            cells += [f"{cudnn * 1e6:.1f}", f"{cudnn / ok[heur]:.2f}", f"{cudnn / ok[best]:.2f}"]
        else:
            cells += ["", "", ""]
        lines.append("| " + " | ".join(cells) + " |")
    if ratios:
        gm = math.exp(statistics.fmean(math.log(x) for x in ratios))
        gb = math.exp(statistics.fmean(math.log(x) for x in best_ratios))
        lines.append(f"\ngeomean cuDNN/plan {gm:.2f} (min {min(ratios):.2f}), cuDNN/best-of-ours {gb:.2f} "
                     f"over {len(ratios)}")  # fmt: skip
    print("\n".join(lines))
    return 0


def replay(pairs: list[tuple[Path, Path]]) -> int:
    """Per measured set: the plan ``decide`` makes now against the plan measured as the heuristic, each at the
    kernel time of the measured contender with that plan ("not measured" where none has it)."""
    from convbw_mlir.dispatch.variants import heuristic
    from convbw_mlir.plan_data import Plan
    from convbw_mlir.problem import ConvBwdWeightProblem

    def tile(plan: Plan) -> str:
        kind = "wgmma" if plan.tile.intrinsic.startswith("NV_WGMMA") else "sm80"
        split = f"StreamK {plan.streamk.workgroups}" if plan.streamk else f"split {plan.k_batch}"
        return f"{plan.tile.m}x{plan.tile.n} {kind} {split}"

    for results, manifest in pairs:
        rows = {r["name"]: r for r in json.loads(results.read_text())["problems"]}
        ratios, moved, missing = [], 0, 0
        print(f"\n{results.parent.name}\n\n| layer | measured plan | us | plan now | us | measured/now | why now |")
        print("|---|---|---|---|---|---|---|")
        for entry in json.loads(manifest.read_text())["problems"]:
            p = ConvBwdWeightProblem.from_dict(entry["problem"])
            now = heuristic(p, "sm_90a").plan
            times = {}
            for name, c in entry["contenders"].items():
                t = _time(rows[entry["name"]]["contenders"].get(name, {})) if "variant" in c else None
                if t:
                    times.setdefault(Plan.from_dict(c["variant"]["plan"]), (name, t))
            heur = next(n for n, c in entry["contenders"].items() if c.get("heuristic"))
            was = Plan.from_dict(entry["contenders"][heur]["variant"]["plan"])
            t_was, t_now = times.get(was, (None, None))[1], times.get(now, (None, None))[1]
            moved += now != was
            why = (now.decision.detail if now.decision else "").split(":")[0]
            if t_was and t_now:
                ratios.append(t_was / t_now)
                cell = f"{t_was / t_now:.3f}"
            else:
                missing += 1
                cell = "not measured"
            fmt = lambda t: f"{t * 1e6:.1f}" if t else "-"  # noqa: E731
            print(f"| {entry['name']} | {tile(was)} | {fmt(t_was)} | {tile(now)}{' **' if now != was else ''} | "
                  f"{fmt(t_now)} | {cell} | {why} |")  # fmt: skip
        gm = math.exp(statistics.fmean(math.log(x) for x in ratios)) if ratios else float("nan")
        print(f"\n{moved} of {len(rows)} plans move; measured/now geomean {gm:.3f} over {len(ratios)}, "
              f"now faster on {sum(x > 1 for x in ratios)}, slower on {sum(x < 1 for x in ratios)}; "
              f"{missing} not measured")  # fmt: skip
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compile")
    c.add_argument("dir", type=Path)
    c.add_argument("--workers", type=int, default=2)
    c.add_argument("--cache", type=Path, required=True, help="the kernel cache (outside the pack)")
    c.add_argument("--only", default="", help="the problems whose name contains this")
    c.add_argument("--moved", type=Path, help="instead: the suite problems whose plan moved since this "
                   "plan_identity dump (f16): the plan now and the plan before")  # fmt: skip
    r = sub.add_parser("report")
    r.add_argument("results", type=Path)
    r.add_argument("manifest", type=Path)
    rp = sub.add_parser("replay")
    rp.add_argument("pairs", type=Path, nargs="+", help="RESULTS MANIFEST pairs (results.json, manifest.json)")
    a = ap.parse_args(argv)
    if a.cmd == "replay":
        if len(a.pairs) % 2:
            ap.error(f"pairs: {len(a.pairs)} paths (RESULTS MANIFEST pairs: an even number)")
        return replay(list(zip(a.pairs[::2], a.pairs[1::2])))
    if a.cmd == "compile":
        return compile_all(a.dir, a.workers, a.cache, a.only, a.moved)
    return report(a.results, a.manifest)


if __name__ == "__main__":
    sys.exit(main())
