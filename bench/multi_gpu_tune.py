"""The tuner's timing half on every GPU of a machine and on one of them, in one process: the scaling (issue 27).

    python3 bench/multi_gpu_tune.py COMPILED --out DIR [--devices 0,1,..] [--budget 540] [--timeout 120]

COMPILED is a folder of ``convbw tune --compile-only`` (manifest.json and the kernels; build it with
``--no-hold-out`` so every problem is tuned). First the timing half with one measuring worker per GPU
(:func:`convbw_mlir.dispatch.tune.time_candidates`, ``--devices`` default every visible GPU), stopped from
starting problems at ``budget / (1 + GPUs)`` seconds; then the problems it finished once more on the first
GPU alone, within what is left of ``budget``. The all-GPU run goes first, so the one-GPU run finds CUDA's
JIT cache warm: the scaling ratio errs low, never high. Writes into ``--out``: ``multi_gpu.json`` and
``multi_gpu.md`` (problems per minute of each, the scaling ratio, candidates that crashed or hung and were
contained, whether the winners agree, an order flip within the measured noise counted apart), and each
run's results and records (``all.json``, ``one.json``, ``*.records.jsonl``).

Runs from the wheel with the IREE runtime only (no compiler): see /work/shared/device/README.md.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing  # noqa: F401 - imported before the chdir below: spawned workers find this script from here
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _counts(results: dict[str, Any]) -> dict[str, int]:
    """Candidates that crashed, hung (no progress, killed), failed or were wrong; problems lost with a worker."""
    c = {"problems": len(results["problems"]), "candidates": 0, "ok": 0, "crashed": 0, "hung": 0, "failed": 0,
         "wrong": 0, "lost_problems": 0, "problems_with_a_winner": 0}  # fmt: skip
    from convbw_mlir.dispatch.tune import _decide

    for row in results["problems"]:
        c["lost_problems"] += "measuring worker" in str(row.get("reference_error", ""))
        c["problems_with_a_winner"] += _decide(row)["winner"] is not None
        for r in row["contenders"].values():
            c["candidates"] += 1
            status, error = r.get("status"), str(r.get("error", ""))
            if status == "crashed" and error.startswith("no progress"):
                c["hung"] += 1
            elif status in ("ok", "crashed", "failed"):
                c[status] += 1
            elif status == "WRONG":
                c["wrong"] += 1
    return c


def _agreement(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Whether each problem timed in both runs has the same winner; where not, whether the swap is within
    the noise: each run's time of the other's winner within ``max(MIN_GAIN, that run's device noise)``."""
    from convbw_mlir.dispatch.tune import MIN_GAIN, _decide, device_noise

    na, nb = device_noise(a), device_noise(b)
    rows_b = {r["key"]: r for r in b["problems"]}
    out: dict[str, Any] = {"compared": 0, "same": 0, "flip_within_noise": 0, "differ": 0, "rows": []}
    for ra in a["problems"]:
        rb = rows_b.get(ra["key"])
        if rb is None:
            continue
        da, db = _decide(ra, na), _decide(rb, nb)
        if da["winner"] is None or db["winner"] is None:
            continue
        out["compared"] += 1
        if da["winner"] == db["winner"]:
            out["same"] += 1
            continue
        wa, wb = da["winner"], db["winner"]
        pairs = ((da["times"], wa, wb), (db["times"], wb, wa))  # each run: its own winner, the other's
        gaps = [times[other] / times[mine] - 1 if other in times else None for times, mine, other in pairs]
        margin = max(MIN_GAIN, na or 0.0, nb or 0.0)
        within = all(g is not None and g <= margin for g in gaps)
        out["flip_within_noise" if within else "differ"] += 1
        row = {"key": ra["key"], "all_gpus": da["winner"], "one_gpu": db["winner"], "gap_all": gaps[0]}
        out["rows"].append(row | {"gap_one": gaps[1], "margin": margin, "within_noise": within})
    out["noise_all"], out["noise_one"] = na, nb
    return out


def _markdown(report: dict[str, Any]) -> str:
    runs, agree = report["runs"], report["winners"]
    lines = [
        f"# Timing half: {report['gpus']} GPUs against one ({report['date']})",
        "",
        f"Device: {report['device']}; GPUs used: {', '.join(map(str, report['devices']))} "
        f"(`CUDA_VISIBLE_DEVICES`={report['cuda_visible_devices']!r}); convbw-mlir {report['product_version']}, "
        f"IREE {report['iree_version']}, target {report['target']}; manifest: {report['manifest_problems']} problems.",
        "",
        "| run | GPUs | problems timed | wall s | problems / minute | candidates | ok | crashed | hung "
        "| failed | wrong | problems lost | problems with a winner |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in runs.items():
        c = r["counts"]
        cells = [name, len(r["devices"]), c["problems"], f"{r['wall_s']:.1f}", f"{r['problems_per_minute']:.2f}"]
        cells += [c[k] for k in ("candidates", "ok", "crashed", "hung", "failed", "wrong", "lost_problems")]
        lines.append("| " + " | ".join(map(str, [*cells, c["problems_with_a_winner"]])) + " |")
    ratio = report["scaling_ratio"]
    lines += [
        "",
        f"**Scaling ratio** (problems per minute, all GPUs / one GPU): {ratio:.2f}x on {report['gpus']} GPUs"
        if ratio
        else "**Scaling ratio**: n/a (a run timed nothing)",
        "",
        f"**Winners** on the {agree['compared']} problems both runs timed: {agree['same']} the same, "
        f"{agree['flip_within_noise']} swapped within the noise, {agree['differ']} different beyond it "
        f"(device noise: all GPUs {_pct(agree['noise_all'])}, one GPU {_pct(agree['noise_one'])}; margin "
        f"max(3%, noise)).",
        "",
        "The all-GPU run went first: the one-GPU run found CUDA's JIT cache warm, so the ratio errs low.",
    ]
    if agree["rows"]:
        lines += ["", "| problem | all GPUs' winner | one GPU's winner | gap, all-GPU run | gap, one-GPU run "
                  "| within noise |", "|---|---|---|---:|---:|---|"]  # fmt: skip
        for r in agree["rows"]:
            lines.append(f"| {r['key']} | {r['all_gpus']} | {r['one_gpu']} | {_pct(r['gap_all'])} "
                         f"| {_pct(r['gap_one'])} | {'yes' if r['within_noise'] else 'no'} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.1%}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", help="a convbw tune --compile-only folder")
    ap.add_argument("--out", required=True, help="folder for the report and both runs' results")
    ap.add_argument("--devices", default=None, help="GPUs of the all-GPU run (default every visible one)")
    ap.add_argument("--budget", type=float, default=540.0, help="seconds for both runs together (default 540)")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds one candidate may run (default 120)")
    ap.add_argument("--filter", default="", help="only problems whose key contains this")
    args = ap.parse_args(argv)
    from importlib.metadata import version

    from convbw_mlir.dispatch.tune import time_candidates
    from convbw_mlir.measure.pool import parse_devices, resolve_devices
    from convbw_mlir.measure.run import read_manifest
    from convbw_mlir.targets import get_target

    folder, out = Path(args.folder).resolve(), Path(args.out).resolve()
    try:
        manifest = read_manifest(folder)
        driver = get_target(manifest["target"]).driver
        devices = [d.index for d in resolve_devices(driver, parse_devices(args.devices) if args.devices else None)]
        if not args.budget > 0 or not args.timeout > 0:
            raise ValueError(f"--budget and --timeout: expected seconds > 0, got {args.budget} and {args.timeout}")
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    out.mkdir(parents=True, exist_ok=True)
    os.chdir(tempfile.mkdtemp(prefix="convbw-multi-gpu-"))  # no source tree in the children's path: the wheel runs
    t_start = time.monotonic()
    log = lambda s: print(s, flush=True)  # noqa: E731
    runs: dict[str, Any] = {}
    results: dict[str, Any] = {}
    for name, devs, deadline, keys in (("all", devices, args.budget / (1 + len(devices)), None),
                                       ("one", devices[:1], None, "from all")):  # fmt: skip
        if keys == "from all":
            keys = [r["key"] for r in results["all"]["problems"]]
            deadline = max(1.0, args.budget - (time.monotonic() - t_start) - 30)
        log(f"== {name}: GPUs {devs}, deadline {deadline:.0f} s")
        t0 = time.monotonic()
        res = time_candidates(folder, out / f"{name}.json", args.filter, log=log, deadline_s=deadline, devices=devs,
                              timeout_s=args.timeout, keys=keys)  # fmt: skip
        wall = time.monotonic() - t0
        results[name] = res
        n = len(res["problems"])
        runs[name] = {"devices": devs, "wall_s": wall, "problems_per_minute": n / wall * 60 if wall else 0.0,
                      "counts": _counts(res)}  # fmt: skip
    a, b = runs["all"]["problems_per_minute"], runs["one"]["problems_per_minute"]
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "device": results["all"]["device"],
        "gpus": len(devices),
        "devices": devices,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "target": manifest["target"],
        "iree_version": manifest["iree_version"],
        "product_version": version("convbw-mlir"),
        "manifest_problems": len(manifest["problems"]),
        "runs": runs,
        "scaling_ratio": a / b if a and b else None,
        "winners": _agreement(results["all"], results["one"]),
    }
    (out / "multi_gpu.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "multi_gpu.md").write_text(_markdown(report))
    log(_markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
