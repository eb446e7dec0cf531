"""Issue 40 item 1: the depthwise kernel on Hopper, its plan's variants side by side with cuDNN.

    python bench/depthwise_sm90.py compile DIR [--only S ...] [--variants V ...] [--jobs 2]   (here: IREE compiler)
    python3 bench/depthwise_sm90.py run DIR --out OUT                                     (GPU machine: runtime)
    python3 bench/depthwise_sm90.py kernels DIR --out OUT --only S ...                   (GPU: each kernel's time)
    python bench/depthwise_sm90.py report OUT/results.json > table.md

Each problem (:data:`PROBLEMS`: the zoo's and the classes suite's depthwise layers, ConvNeXt-T's 7x7 at
three batches, EfficientNet-B0's 3x3/5x5, Mamba's causal 1-D conv) in f16 and bf16, channels-last, compiled
for sm_90a once per variant of the depthwise plan (:func:`variants`): the plan's own numbers, the numbers the
sm_80 target's facts give, other chunkings. ``run`` is the product's runner in its one-process-a-device
form (:mod:`convbw_mlir.measure.run` ``server=True``): every variant checked against float64 with NaN after
x and dy, then timed by CUPTI (kernel time, stage 2 included) with cuDNN in the same process, one timing at a
time.
"""

from __future__ import annotations

import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import Parser, geomean  # noqa: E402

# name -> ckProfiler problem (NDim G N K C <filter> <input> <strides> <dilations> <left pads> <right pads>)
PROBLEMS = {
    "convnext_t_7x7_g96_56_n32": "2 96 32 1 1 7 7 56 56 1 1 1 1 3 3 3 3",
    "convnext_t_7x7_g96_56_n64": "2 96 64 1 1 7 7 56 56 1 1 1 1 3 3 3 3",
    "convnext_t_7x7_g96_56_n128": "2 96 128 1 1 7 7 56 56 1 1 1 1 3 3 3 3",
    "convnext_t_7x7_g768_7_n32": "2 768 32 1 1 7 7 7 7 1 1 1 1 3 3 3 3",
    "mobilenetv2_3x3_g144_56": "2 144 32 1 1 3 3 56 56 1 1 1 1 1 1 1 1",
    "mobilenetv2_3x3_g96_112_s2": "2 96 32 1 1 3 3 112 112 2 2 1 1 1 1 1 1",
    "efficientnet_b0_5x5_g240_28": "2 240 32 1 1 5 5 28 28 1 1 1 1 2 2 2 2",
    "efficientnet_b0_5x5_g672_17_s2": "2 672 32 1 1 5 5 17 17 2 2 1 1 0 0 0 0",
    "efficientnet_b0_3x3_g240_29_s2": "2 240 32 1 1 3 3 29 29 2 2 1 1 0 0 0 0",
    "mobilenetv3_l_5x5_g72_56_s2": "2 72 32 1 1 5 5 56 56 2 2 1 1 2 2 2 2",
    "conformer_dw31_1d": "1 256 16 1 1 31 500 1 1 15 15",
    "mamba_causal_4_1d": "1 1536 8 1 1 4 2048 1 1 3 0",
    "x3d_3x3x3_g192": "3 192 8 1 1 3 3 3 16 14 14 1 1 1 1 1 1 1 1 1 1 1 1",
    "replknet31b_31x31_g128_56": "2 128 16 1 1 31 31 56 56 1 1 1 1 15 15 15 15",
}
# For ``scaled`` (not timed): small enough for numpy's whole float64 reference, dW in f32.
CHECKS = {"check_3x3_g64_20_f32out": "2 64 4 1 1 3 3 20 20 1 1 1 1 1 1 1 1"}
TARGET = "sm_90a"
ROOFLINE_BPS = 3.35e12  # H100 SXM: 3.35 TB/s (datasheet; convbw_mlir.targets RUNS_SM80)


# Round 1's names (its branch defaults then: own stage 2, cvt conversions, steps of 8; README of its results).
ROUND1 = ("main", "plan", "sm80code", "w16", "w4", "w2", "w1", "w2t512")
# The switches main had: its rule aimed at 8 workgroups an SM, IREE's reduction as stage 2, cvt conversions.
MAIN = {"waves": 8, "threads": 256, "stage2": False, "mma": (), "unroll": 8, "prefetch": False, "window": 99,
        "halved_waves": 8}  # fmt: skip


def _spec(name: str) -> dict[str, Any]:
    """A variant's switches from its name: ``main``; ``plan`` (the branch's defaults); else dot-separated
    changes to the branch's defaults (those of each round's commit): ``w<N>`` workgroups an SM (WAVES and
    HALVED_WAVES), ``h<N>`` those of the layers whose window halves the step (HALVED_WAVES), ``t<N>``
    threads (THREADS), ``u<N>`` outputs a step of the wide form (WIDE_UNROLL), ``nowin`` no halving of a wide
    step's window (MAX_WINDOW), ``pf``/``nopf`` reads a step ahead or not (PREFETCH), ``i2`` IREE's stage 2,
    ``cvt`` no mma conversion, ``mma`` the mma conversion of f16 and bf16 (where the policy gives it)."""
    from convbw_mlir.policies import depthwise

    if name == "main":
        return dict(MAIN)
    spec = {"waves": depthwise.WAVES, "threads": depthwise.THREADS, "stage2": depthwise.OWN_STAGE2,
            "mma": depthwise.MMA_CONVERT, "unroll": depthwise.WIDE_UNROLL, "prefetch": depthwise.PREFETCH,
            "window": depthwise.MAX_WINDOW, "halved_waves": depthwise.HALVED_WAVES}  # fmt: skip
    for part in name.split("."):
        if part.startswith("w") and part[1:].isdigit():  # every problem's (halved steps' too)
            spec["waves"] = spec["halved_waves"] = int(part[1:])
        elif "t" in part and part.split("t", 1)[1].isdigit():
            head, _, threads = part.partition("t")
            spec["threads"] = int(threads)
            if head.startswith("w") and head[1:].isdigit():
                spec["waves"] = spec["halved_waves"] = int(head[1:])
        elif part.startswith("h") and part[1:].isdigit():  # the halved steps' workgroups an SM alone
            spec["halved_waves"] = int(part[1:])
        elif part.startswith("u") and part[1:].isdigit():
            spec["unroll"] = int(part[1:])
        elif part == "nowin":
            spec["window"] = 99
        elif part in ("pf", "nopf"):
            spec["prefetch"] = part == "pf"
        elif part == "i2":
            spec["stage2"] = False
        elif part == "cvt":
            spec["mma"] = ()
        elif part == "mma":
            spec["mma"] = ("f16", "bf16")
    return spec


class _Switches:
    """The depthwise policy's module switches set to a variant's (restored on exit)."""

    NAMES = {"waves": "WAVES", "threads": "THREADS", "stage2": "OWN_STAGE2", "mma": "MMA_CONVERT",
             "unroll": "WIDE_UNROLL", "prefetch": "PREFETCH", "window": "MAX_WINDOW",
             "halved_waves": "HALVED_WAVES"}  # fmt: skip

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec

    def __enter__(self) -> None:
        from convbw_mlir.policies import depthwise

        self.saved = {k: getattr(depthwise, v) for k, v in self.NAMES.items()}
        for k, v in self.NAMES.items():
            setattr(depthwise, v, self.spec[k])

    def __exit__(self, *_: Any) -> None:
        from convbw_mlir.policies import depthwise

        for k, v in self.NAMES.items():
            setattr(depthwise, v, self.saved[k])


def variants(problem: Any, names: tuple[str, ...] = ROUND1) -> dict[str, tuple[str, Any, dict[str, Any]]]:
    """name -> (target to compile for, the depthwise plan's numbers, the switches to compile with), for each of
    ``names`` (:func:`_spec`; ``sm80code``: the sm_80 target's plan compiled for sm_80, PTX the driver JITs)."""
    from convbw_mlir.plan import decide
    from convbw_mlir.policies import depthwise
    from convbw_mlir.targets import get_target

    out: dict[str, tuple[str, Any, dict[str, Any]]] = {}
    for name in names:
        if name == "sm80code":
            with _Switches(MAIN):
                out[name] = ("sm_80", decide(problem, "sm_80").depthwise, dict(MAIN))
            continue
        spec = _spec(name)
        with _Switches(spec):
            out[name] = (TARGET, depthwise._rule(problem, get_target(TARGET)), spec)
    return out


def _compile_one(job: tuple[str, str, dict, str, str, dict, str, dict]) -> tuple[str, str, dict[str, Any]]:
    """One variant's vmfb into ``folder``; its manifest record (an error is a record, not the end)."""
    key, name, pdict, target, folder, dw, path, spec = job
    from convbw_mlir.build.compile import build_op
    from convbw_mlir.plan_data import DepthwisePlan, Plan, Strategy
    from convbw_mlir.problem import ConvBwdWeightProblem
    from convbw_mlir.targets import get_target

    problem = ConvBwdWeightProblem.from_dict(pdict)
    try:
        with _Switches(spec):
            plan = Plan(target, Strategy.EXPLICIT, depthwise=DepthwisePlan(**dw))
            op = build_op(problem, get_target(target), plan=plan)
    except Exception as e:  # noqa: BLE001 - a variant that fails to build is a result
        return key, name, {"ok": False, "error": str(e).strip().splitlines()[0][:400] if str(e).strip() else "error"}
    (Path(folder) / path).write_bytes(op.vmfb)
    return key, name, {"ok": True, "vmfb": path, "flags": [], "mma_count": 0,
                       "config": {"strategy": "explicit", "target": target, "depthwise": dw, **spec}}  # fmt: skip


def compile_all(folder: Path, types: list[str], only: list[str] | None, names: tuple[str, ...], jobs: int) -> None:
    from dataclasses import asdict
    from importlib.metadata import version

    from convbw_mlir.policies import depthwise
    from convbw_mlir.problem import ConvBwdWeightProblem

    folder.mkdir(parents=True, exist_ok=True)
    entries, work = [], []
    for dtype in types:
        for name, line in {**PROBLEMS, **CHECKS}.items():
            if only and not any(s in name for s in only) or (not only and name in CHECKS):
                continue
            # dW in f32 where the name says so (the subnormal check: dW's own rounding out of the way)
            out = "f32" if name.endswith("_f32out") else dtype
            p = ConvBwdWeightProblem.from_ck(line, layout=2, dtype=dtype).with_(dw_dtype=out)
            key = f"{name}.{dtype}"
            entries.append({"name": name, "key": key, "problem": p.to_dict(), "contenders": {}})
            seen: dict[tuple, str] = {}
            for vname, (target, dw, spec) in variants(p, names).items():
                with _Switches(spec):  # the switches that change this problem's kernel
                    mma = depthwise.kernel(p, dw).mma_convert
                ident = (target, dw, spec["stage2"], mma, spec["prefetch"])
                if ident in seen:  # the same kernel under another name: measured once, noted
                    entries[-1].setdefault("same_as", {})[vname] = seen[ident]
                    continue
                seen[ident] = vname
                work.append((key, vname, p.to_dict(), target, str(folder), asdict(dw), f"{key}.{vname}.vmfb", spec))
    records: dict[str, dict[str, Any]] = {}
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        for key, vname, rec in pool.map(_compile_one, work):
            records.setdefault(key, {})[vname] = rec
            print(f"{key} {vname}: {'ok' if rec['ok'] else rec['error']}", file=sys.stderr)
    for e in entries:
        e["contenders"] = records.get(e["key"], {})
    names = sorted({n for e in entries for n in e["contenders"]})
    manifest = {"target": TARGET, "date": "", "iree_version": version("iree-base-compiler"), "contenders": names,
                "problems": entries}  # fmt: skip
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")


def _view(folder: Path, only: list[str]) -> Path:
    """A folder whose manifest holds only the problems whose name holds one of ``only`` (links to the vmfbs)."""
    import tempfile

    view = Path(tempfile.mkdtemp(prefix="dw90-view-"))
    m = json.loads((folder / "manifest.json").read_text())
    m["problems"] = [e for e in m["problems"] if any(s in e["name"] for s in only)]
    for e in m["problems"]:
        for rec in e["contenders"].values():
            if rec.get("vmfb"):
                (view / rec["vmfb"]).symlink_to((folder / rec["vmfb"]).resolve())
    (view / "manifest.json").write_text(json.dumps(m, indent=1) + "\n")
    return view


def run(folder: Path, out: Path, only: list[str] | None = None, numpy_max_flops: float = 0.0) -> int:
    """The runner's server over the manifest (or its problems named by ``only``); each finished row is also
    appended to ``out/rows.jsonl`` as it comes (a run cut short keeps its rows). ``numpy_max_flops`` 0: every
    result is checked on the runner's float64 sample (256 entries) and the NaN fences, not against numpy's whole
    reference (its float64 copies of large layers kept the prep workers busy past round 1's budget)."""
    from convbw_mlir.measure import run as runner

    out.mkdir(parents=True, exist_ok=True)
    rows = out / "rows.jsonl"
    rows.unlink(missing_ok=True)

    def line(row: Any) -> str:  # the runner logs each finished row through this: keep it whole
        with rows.open("a") as f:
            f.write(json.dumps(row.to_dict()) + "\n")
        return row.key

    runner._line = line
    results = runner.run_manifest(_view(folder, only) if only else folder, server=True, numpy_max_flops=numpy_max_flops)
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    table = report([out / "results.json"])
    (out / "table.md").write_text(table)
    print(table, end="")
    return 0


def kernels(folder: Path, out: Path, only: list[str], calls: int = 20) -> int:
    """Each variant's kernels one by one (the depthwise kernel, the stage 2 that sums its chunks): their mean
    duration by CUPTI over ``calls`` calls, one process, nothing else on the GPU (run after ``run``)."""
    import tempfile

    import torch

    from convbw_mlir.measure import cupti
    from convbw_mlir.reference import random_inputs
    from convbw_mlir.runtime import Kernel

    torch.zeros(1, device="cuda")
    rows = []
    for e in json.loads((folder / "manifest.json").read_text())["problems"]:
        if not any(s in e["name"] for s in only):
            continue
        from convbw_mlir.problem import ConvBwdWeightProblem

        x, dy = random_inputs(ConvBwdWeightProblem.from_dict(e["problem"]), seed=1)
        for name, rec in e["contenders"].items():
            if not rec.get("ok"):
                continue
            k = Kernel((folder / rec["vmfb"]).read_bytes(), "cuda")
            xd, dyd = k.to_device_fenced(x), k.to_device_fenced(dy)
            k(xd, dyd).to_host()
            with tempfile.TemporaryDirectory() as tmp:
                acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
                with torch.profiler.profile(activities=acts) as prof:
                    for _ in range(calls):
                        r = k(xd, dyd)
                    r.to_host()
                prof.export_chrome_trace(f"{tmp}/t.json")
                events = cupti.kernel_events(Path(f"{tmp}/t.json"))
            each: dict[str, float] = {}
            for _, dur, kname in events:
                each[kname] = each.get(kname, 0.0) + dur / calls
            rows.append({"key": e["key"], "variant": name, "kernels_us": each})
            print(e["key"], name, " ".join(f"{n[-40:]}={v:.1f}" for n, v in each.items()), flush=True)
            del k, xd, dyd
    (out / "kernels.json").write_text(json.dumps(rows, indent=1) + "\n")
    return 0


def scaled(folder: Path, only: list[str], scale: float) -> int:
    """Each variant of the problems named by ``only`` on unit-normal x and dy times ``scale`` (1e-6: every f16 dy
    subnormal), fenced, against numpy's whole float64 dW: whether a conversion (the tensor cores' included) keeps
    subnormal inputs. Prints ``max|got - exact| / rms(exact)`` a variant; one process, nothing timed."""
    import numpy as np

    from convbw_mlir.problem import ConvBwdWeightProblem
    from convbw_mlir.reference import random_inputs, reference
    from convbw_mlir.runtime import Kernel

    for e in json.loads((folder / "manifest.json").read_text())["problems"]:
        if not any(s in e["name"] for s in only):
            continue
        p = ConvBwdWeightProblem.from_dict(e["problem"])
        x, dy = random_inputs(p, seed=2)
        dy = (dy.astype(np.float32) * scale).astype(dy.dtype)
        exact = reference(p, x, dy)
        rms = float(np.sqrt(np.mean(exact**2)))
        sub = float(np.mean(np.abs(dy.astype(np.float32)) < (6.1e-5 if p.dtype == "f16" else 1.2e-38)))
        for name, rec in e["contenders"].items():
            if not rec.get("ok"):
                continue
            k = Kernel((folder / rec["vmfb"]).read_bytes(), "cuda")
            got = np.asarray(k(k.to_device_fenced(x), k.to_device_fenced(dy)).to_host()).astype(np.float64)
            err = float(np.max(np.abs(got - exact)) / rms)
            print(
                f"{e['key']} {name}: error {err:.2e} rms units (dy x {scale:g}, {sub:.0%} of dy subnormal)", flush=True
            )
    return 0


def _time(row: dict, name: str) -> float | None:
    r = row["contenders"].get(name, {})
    return r.get("kernel_s") or r.get("median_s") if r.get("status") == "ok" else None


def _rows(path: Path) -> tuple[list[dict], str]:
    """A results file's rows and device (``rows.jsonl``: the rows a cut-short run logged)."""
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()], "-"
    data = json.loads(path.read_text())
    return data["problems"], data.get("device", "-")


def report(paths: list[Path], heads: tuple[str, ...] = ("main", "plan")) -> str:
    """The table: every variant's time, cuDNN's, and cuDNN/variant for ``heads`` and for the best variant."""
    rows = [r for p in paths for r in _rows(p)[0]]
    device = _rows(paths[0])[1] if paths else "-"
    names = sorted({n for r in rows for n in r["contenders"] if n != "cudnn"})
    names = [*(h for h in heads if h in names), *(n for n in names if n not in heads)]
    cols = [*(h for h in heads if h in names), "best"]
    lines = [f"# Depthwise on sm_90a: the plan's variants and cuDNN ({device}, kernel time by CUPTI, µs)", ""]
    lines += ["| problem | " + " | ".join(names) + " | cuDNN | " + " | ".join(f"cuDNN/{c}" for c in cols) + " |",
              "|---" * (len(names) + len(cols) + 2) + "|"]  # fmt: skip
    ratios: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        ts = {n: _time(r, n) for n in names}
        cells = [f"{t * 1e6:.1f}" if t else r["contenders"].get(n, {}).get("status", "-") for n, t in ts.items()]
        cud = _time(r, "cudnn")
        ts["best"] = min((t for t in ts.values() if t), default=None)
        dtype = r["key"].rsplit(".", 1)[-1]
        vs = []
        for c in cols:
            v = cud / ts[c] if cud and ts.get(c) else None
            vs.append(f"{v:.2f}" if v else "-")
            if v:
                ratios.setdefault((dtype, c), []).append(v)
        lines.append("| " + " | ".join([r["key"], *cells, f"{cud * 1e6:.1f}" if cud else "-", *vs]) + " |")
    lines.append("")
    for (dtype, c), vals in sorted(ratios.items()):
        lines.append(f"- {dtype} {c}: cuDNN/ours geomean {geomean(vals):.2f}, worst {min(vals):.2f} ({len(vals)})")
    lines += ["", "## Per variant, both types", "",
              "| variant | cuDNN/ours geomean | worst | f16/bf16 time geomean | worst f16/bf16 | problems |",
              "|---|---|---|---|---|---|"]  # fmt: skip
    by_key = {r["key"]: r for r in rows}
    for n in names:
        vals = [_time(r, "cudnn") / _time(r, n) for r in rows if _time(r, "cudnn") and _time(r, n)]
        pairs = [_time(r, n) / _time(by_key[r["key"][:-3] + "bf16"], n) for r in rows
                 if r["key"].endswith(".f16") and r["key"][:-3] + "bf16" in by_key and _time(r, n)
                 and _time(by_key[r["key"][:-3] + "bf16"], n)]  # fmt: skip
        if vals:
            fb = f"{geomean(pairs):.2f} | {max(pairs):.2f}" if pairs else "- | -"
            lines.append(f"| {n} | {geomean(vals):.2f} | {min(vals):.2f} | {fb} | {len(vals)} |")
    lines += [
        "",
        f"Memory roofline: x + dy + dW bytes at {ROOFLINE_BPS / 1e12:.2f} TB/s (H100 SXM datasheet) over the time.",
        "",
    ]
    for r in rows:
        if "bytes" in r and r["name"].startswith("mamba"):
            cells = [f"{n} {r['bytes'] / ROOFLINE_BPS / _time(r, n):.2f}" for n in names if _time(r, n)]
            cud = _time(r, "cudnn")
            cells.append(f"cuDNN {r['bytes'] / ROOFLINE_BPS / cud:.2f}" if cud else "cuDNN -")
            lines.append(f"- {r['key']}: " + ", ".join(cells))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = Parser(prog="depthwise_sm90.py", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compile")
    c.add_argument("dir", type=Path)
    c.add_argument("--types", nargs="+", default=["f16", "bf16"], choices=["f16", "bf16"])
    c.add_argument("--only", nargs="*", help="only the problems whose name holds one of these")
    c.add_argument("--variants", nargs="+", default=list(ROUND1), help="variant names (see _spec)")
    c.add_argument("--jobs", type=int, default=2)
    r = sub.add_parser("run")
    r.add_argument("dir", type=Path)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--only", nargs="*", help="only the problems whose name holds one of these")
    r.add_argument("--numpy-max-flops", type=float, default=0.0, help="whole-array numpy check up to this (0: none)")
    kp = sub.add_parser("kernels")
    kp.add_argument("dir", type=Path)
    kp.add_argument("--out", type=Path, required=True)
    kp.add_argument("--only", nargs="+", required=True)
    sc = sub.add_parser("scaled")
    sc.add_argument("dir", type=Path)
    sc.add_argument("--only", nargs="+", required=True)
    sc.add_argument("--scale", type=float, default=1e-6)
    rep = sub.add_parser("report")
    rep.add_argument("results", type=Path, nargs="+")
    rep.add_argument("--heads", nargs="+", default=["main", "plan"], help="variants with a cuDNN/variant column")
    args = ap.parse_args(argv)
    if args.cmd == "compile":
        compile_all(args.dir, args.types, args.only, tuple(args.variants), args.jobs)
        return 0
    if args.cmd == "run":
        return run(args.dir, args.out, args.only, args.numpy_max_flops)
    if args.cmd == "scaled":
        return scaled(args.dir, args.only, args.scale)
    if args.cmd == "kernels":
        args.out.mkdir(parents=True, exist_ok=True)
        return kernels(args.dir, args.out, args.only)
    print(report(args.results, tuple(args.heads)), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
