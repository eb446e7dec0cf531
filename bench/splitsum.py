"""Pack splitsum (issue 39 goal 2, docs/decisions.md#short-reduction-dense item 2): the split sum (stage 2) of the
explicit kernels' split plans before and after its own tile (``policies/split.py sum_tile``), on an H100. The layers:
bench/tail7.py's whose plan (``decide`` on sm_90a) is an explicit kernel split in k_batch > 1 (RegNetY-016's 888 and
RegNet-Y-400MF's 440, the two slow sums, among them). A layer's contenders: the plan as main's wheel builds it
(``convbw[before]``), as this branch's (``convbw[after]``), and cuDNN (the runner's); the same plan, so the main
kernel is the same code and the stage 2 alone differs where the outputs are not a multiple of 128.

    .venv/bin/python bench/splitsum.py compile DIR [--workers 2]   # here, once under each wheel (PYTHONPATH)
    python3 bench/splitsum.py merge BEFORE AFTER OUT               # one manifest: before and after a layer
    python3 bench/splitsum.py split OUT --parts 2
    python3 -m convbw_mlir.measure.run OUT.part0 --server --out part0.json   # on the GPU (one process a part)
    python3 bench/splitsum.py report part*.json --manifest OUT/manifest.json

The report: a row a layer, the stage 2's µs before and after (the runner's ``kernel_us_each``: its dispatch by name,
``..._reduction_...``), the whole plan's (all its kernels a call), the stage 2's bytes (splits x outputs f32 read,
outputs of dW's type written, D read where the epilogue has one) and its TB/s.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # harness beside it, even with PYTHONSAFEPATH=1 (the pack)

from harness import compile_manifest, load_manifest, probe_main  # noqa: E402

TARGET = "sm_90a"
SLOW = ("regnety_016.s4.b1.conv3.conv.n32", "regnet_y_400mf.trunk_output.block4.block4-0.f.c.0.n32")
BEFORE, AFTER = "convbw[before]", "convbw[after]"
# bytes an element of dW's type
WIDTH = {"f32": 4, "f16": 2, "bf16": 2}


def layers() -> list[tuple[str, Any, bool, Any]]:
    """(name, problem, held out, variant) of tail7's layers whose plan (the variant ``convbw[heuristic]``, as
    tail7 and the tuner build it) is an explicit kernel split in k_batch > 1, the two slow sums' first."""
    import tail7

    from convbw_mlir.dispatch.variants import heuristic
    from convbw_mlir.plan_data import Strategy

    out = []
    for name, p, held in tail7.layers():
        v = heuristic(p, TARGET)
        if v.plan.strategy == Strategy.EXPLICIT and v.plan.split is not None and v.plan.k_batch > 1:
            out.append((name, p, held, v))
    missing = set(SLOW) - {n for n, *_ in out}
    if missing:
        raise ValueError(f"layers: the slow sums' layers no longer split: {sorted(missing)}")
    return sorted(out, key=lambda e: e[0] not in SLOW)  # the slow sums first: a run cut short keeps them


def stage_two(p: Any, plan: Any) -> dict[str, Any]:
    """The stage 2's outputs, splits, bytes (read and written) and, on this code, its own tile (or None)."""
    from convbw_mlir.policies import split

    outputs = p.groups * p.out_channels * p.in_channels * math.prod(p.filter_size)
    ep = p.epilogue
    d_bytes = outputs * WIDTH[ep.d_dtype or p.dw_dtype] if ep is not None and ep.reads_d else 0
    moved = plan.k_batch * outputs * 4 + outputs * WIDTH[p.dw_dtype] + d_bytes
    tile = getattr(split, "sum_tile", lambda n, units: None)(outputs, plan.target_info.compute_units)
    return {"outputs": outputs, "splits": plan.k_batch, "bytes": moved, "tile": tile}


def compile_all(out: Path, workers: int, cache: Path | None) -> int:
    """The plan of each layer built by the convbw_mlir imported (main's wheel or this branch's)."""
    items = []
    for name, p, held, v in layers():
        s = stage_two(p, v.plan)
        print(f"{name} {p.dtype}: split {s['splits']}, {s['outputs']} outputs, stage 2 {s['bytes']} B, tile "
              f"{s['tile']}", flush=True)  # fmt: skip
        items.append((name, p, [v], {"held_out": held, "stage2": s}))
    return compile_manifest(out, items, workers, cache, TARGET)


def merge(before: Path, after: Path, out: Path) -> int:
    """One manifest in ``out``: each layer's plan from ``before`` (as :data:`BEFORE`) and ``after`` (as :data:`AFTER`,
    its stage-2 account kept), their files copied with a prefix.

    Raises:
        ValueError: the two manifests' layers differ (naming the first that does).
    """
    b, a = load_manifest(before), load_manifest(after)
    if [e["key"] for e in b["problems"]] != [e["key"] for e in a["problems"]]:
        raise ValueError(f"merge: the layers of {before} and {after} differ")
    out.mkdir(parents=True, exist_ok=False)
    problems = []
    for eb, ea in zip(b["problems"], a["problems"]):
        if eb["problem"] != ea["problem"]:
            raise ValueError(f"merge: layer {ea['key']}: the problems differ")
        contenders = {"reference": ea["contenders"]["reference"]}
        for label, folder, entry, heuristic in ((BEFORE, before, eb, False), (AFTER, after, ea, True)):
            (rec,) = [c for n, c in entry["contenders"].items() if n != "reference"]
            rec = dict(rec, heuristic=heuristic)
            for k in ("vmfb", "launch"):
                if rec.get(k):
                    name = f"{label[7:-1]}.{rec[k]}"
                    copy = shutil.copytree if (folder / rec[k]).is_dir() else shutil.copyfile
                    copy(folder / rec[k], out / name)
                    rec[k] = name
            contenders[label] = rec
        problems.append({**ea, "contenders": contenders, "before_build": {"iree_version": b.get("iree_version")}})
    (out / "manifest.json").write_text(json.dumps({**a, "problems": problems}, indent=1) + "\n")
    print(f"{out}: {len(problems)} layers, {2 * len(problems)} kernels")
    return 0


def stage_two_us(res: dict[str, Any]) -> float | None:
    """The stage 2's µs a call in a contender's row: its ``..._reduction_...`` dispatch by name (``kernel_us_each``),
    else (a runner without it) the call's kernels but the longest's median launch; None unless ok."""
    if res.get("status") != "ok" or not res.get("kernel_s"):
        return None
    each = res.get("kernel_us_each")
    if each:
        return sum(us for name, us in each.items() if "_reduction_" in name) or None
    launches = res.get("kernel_launch_us")
    return res["kernel_s"] * 1e6 - launches[1] if launches else None


def _f(v: float | None, fmt: str = ".1f") -> str:
    return "-" if v is None else format(v, fmt)


def report_lines(rows: list[dict[str, Any]], manifest: dict[str, Any]) -> list[str]:
    """A row a layer: stage 2 and the whole plan, before and after, the stage 2's bytes and TB/s; then the counts
    and what was not ok (a wrong kernel never counts)."""
    man = {e["key"]: e for e in manifest["problems"]}
    lines = ["| layer | dtype | set | outputs x splits | own tile (threads x f32) | stage-2 bytes | stage 2 us "
             "before | stage 2 us after | TB/s before | TB/s after | plan us before | plan us after | before/after "
             "plan | cuDNN us |", "|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    bad, ratios = [], []
    for r in rows:
        e = man[r["key"]]
        s, c = e["stage2"], r["contenders"]
        bad += [f"{r['key']} {n}: {v.get('status')} {str(v.get('error', ''))[:100]}" for n, v in c.items()
                if n != "reference" and v.get("status") not in ("ok", None)]  # fmt: skip
        sb, sa = (stage_two_us(c.get(k, {})) for k in (BEFORE, AFTER))
        pb, pa = (c[k].get("kernel_s") if c.get(k, {}).get("status") == "ok" else None for k in (BEFORE, AFTER))
        cu = c.get("cudnn", {})
        cudnn = cu.get("kernel_s") or cu.get("median_s") if cu.get("status") == "ok" else None
        tile = s["tile"]
        if pb and pa:
            ratios.append(pb / pa)
        lines.append(
            f"| {r['name']} | {e['problem']['dtype']} | {'held' if e.get('held_out') else 'tune'} | "
            f"{s['outputs']} x {s['splits']} | {f'{tile[0]} x {tile[1]}' if tile else 'IREE own'} | {s['bytes']} | "
            f"{_f(sb)} | {_f(sa)} | {_f(sb and s['bytes'] / sb / 1e6, '.2f')} | "
            f"{_f(sa and s['bytes'] / sa / 1e6, '.2f')} | {_f(pb and pb * 1e6)} | {_f(pa and pa * 1e6)} | "
            f"{_f(pb and pa and pb / pa, '.2f')} | {_f(cudnn and cudnn * 1e6)} |"
        )
    g = math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None
    lines += ["", f"layers timed before and after: {len(ratios)} of {len(rows)}; geomean plan before/after: "
              f"{_f(g, '.3f')}"]  # fmt: skip
    if bad:
        lines += ["", "not ok:", *bad]
    return lines


def report(results: list[Path], manifest: Path) -> int:
    rows = [r for f in results for r in json.loads(f.read_text())["problems"]]
    print("\n".join(report_lines(rows, json.loads(manifest.read_text()))))
    return 0


def main(argv: list[str] | None = None) -> int:
    """``merge BEFORE AFTER OUT`` here; ``compile``, ``split`` and ``report`` as every probe pack's (``probe_main``)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["merge"]:
        ap = argparse.ArgumentParser(prog="splitsum.py merge", description=merge.__doc__.split("\n\n")[0])
        for name in ("before", "after", "out"):
            ap.add_argument(name, type=Path)
        args = ap.parse_args(argv[1:])
        return merge(args.before, args.after, args.out)
    return probe_main(argv, __doc__, "splitsum", 2, compile_all, report)


if __name__ == "__main__":
    sys.exit(main())
