"""Issue 23's per-class table: our plan's kernel against IREE's best form and cuDNN, class by class.

    python bench/classes.py compile .art/classes [--types f16 bf16] [--only S ...]        (here: IREE compiler)
    python3 bench/classes.py run .art/classes --out OUT [--class dw ...]                 (GPU machine: runtime)
    python bench/classes.py report OUT/results*.json [--before OLD.json ...] > table.md

The problems are ``convbw_mlir/suites/classes.tsv`` (real layers of published models; the class is the name's
first word). Each runs channels-last (layout 2) in every type asked for, and the problems named in
:data:`LAYOUT4` also in layout 4 (NGCHW/GKCYX/NGKHW: torch's own NCHW order), f16. Every IREE form and the
reference are compiled for f16 (:data:`convbw_mlir.build.contenders.CONTENDERS`); the other types get our
plan's kernel and the reference only (IREE's forms are measured in f16; bf16 is judged against our own f16
and cuDNN's bf16). The run is the product's runner (:mod:`convbw_mlir.measure.run`): each problem in child
processes, every contender checked against float64 with NaN placed after x and dy, then timed; cuDNN in the
same process. ``report`` groups the rows by class: ours (and which kernel the plan chose), the best IREE
form, cuDNN, ours/cuDNN, and per class the geomean, the worst problem and bf16/f16.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import Parser, geomean  # noqa: E402

SUITE = "classes"
# Layout 4 (torch's NCHW with groups) on one problem of each class: the transposes our kernels must fold.
LAYOUT4 = (
    "first_resnet50_conv1_n32",
    "conv1d_whisper_base_conv1",
    "conv3d_r3d18_layer1",
    "dw_convnext_t_7x7_g96_56",
    "thin_resnext50_g32_c4_56",
)
IREE_FORMS = ("iree_direct", "iree_torch", "iree_fusilli")


def problems(types: list[str], only: list[str] | None = None) -> list[tuple[str, Any, tuple[str, ...]]]:
    """(name, problem, contenders) of every measured entry."""
    from convbw_mlir.build.contenders import CONTENDERS
    from convbw_mlir.suites import load_suite

    out = []
    for dtype in types:
        for name, p in load_suite(SUITE, dtype=dtype):
            if only and not any(s in name for s in only):
                continue
            forms = CONTENDERS if dtype == "f16" else ("convbw", "reference")
            out.append((name, p, forms))
            if dtype == "f16" and name in LAYOUT4:
                out.append((f"{name}.layout4", p.with_(layout=4), forms))
    return out


def compile_all(folder: Path, types: list[str], only: list[str] | None) -> None:
    """Every entry's contenders into ``folder`` (one manifest; compiled in child processes, built beside)."""
    from convbw_mlir.build.contenders import write_artifacts

    entries = problems(types, only)
    groups: dict[tuple[str, ...], list] = {}
    for name, p, forms in entries:
        groups.setdefault(forms, []).append((name, p))
    parts = []
    for i, (forms, probs) in enumerate(groups.items()):
        parts.append(write_artifacts(probs, "sm_80", folder.with_name(f"{folder.name}.part{i}"), forms))
    merge_manifests(parts, folder)


def merge_manifests(parts: list[Path], folder: Path) -> None:
    """One folder from several ``write_artifacts`` folders (their vmfb names are unique by problem key)."""
    from convbw_mlir.files import atomic_directory

    with atomic_directory(folder) as tmp:
        manifest: dict[str, Any] | None = None
        for part in parts:
            m = json.loads((part / "manifest.json").read_text())
            for f in part.iterdir():
                if f.name != "manifest.json":
                    f.rename(tmp / f.name)
            if manifest is None:
                manifest = m
            else:
                manifest["problems"] += m["problems"]
                manifest["contenders"] = sorted(set(manifest["contenders"]) | set(m["contenders"]))
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    for part in parts:
        (part / "manifest.json").unlink()
        part.rmdir()


def run(folder: Path, out: Path, classes: list[str] | None, jobs: int = 1) -> int:
    from convbw_mlir.measure.report import write_report
    from convbw_mlir.measure.run import run_manifest

    out.mkdir(parents=True, exist_ok=True)
    for cls in classes or [""]:
        results = run_manifest(folder, filt=f"{cls}_" if cls else "", jobs=jobs)
        path = out / f"results{'_' + cls if cls else ''}.json"
        path.write_text(json.dumps(results, indent=1) + "\n")
        write_report(results, path)
    return 0


def _time(row: dict, name: str) -> float | None:
    """The contender's kernel time a call by CUPTI (``kernel_s``; its call time where CUPTI gave none)."""
    r = row["contenders"].get(name, {})
    return r.get("kernel_s") or r.get("median_s") if r.get("status") == "ok" else None


def _status(row: dict, name: str) -> str:
    t = _time(row, name)
    return f"{t * 1e6:.1f}" if t else row["contenders"].get(name, {}).get("status", "-")


def report(paths: list[Path], before: list[Path]) -> str:
    from convbw_mlir.measure.report import strategy_cell

    rows = [r for p in paths for r in json.loads(p.read_text())["problems"]]
    old = {r["key"]: r for p in before for r in json.loads(p.read_text())["problems"]}
    device = json.loads(paths[0].read_text())["device"] if paths else "-"
    by_class: dict[str, list[dict]] = {}
    for r in rows:
        by_class.setdefault(r["name"].split("_", 1)[0], []).append(r)
    lines = [f"# Per class: ours, IREE's best form, cuDNN ({device}, sm_80 code)", ""]
    lines.append(
        "Times in µs (median kernel time); cuDNN/ours > 1: ours is faster; WRONG/crashed: the runner's verdict."
    )
    for cls, members in by_class.items():
        lines += ["", f"## {cls}", ""]
        head = "| problem | ours | plan's kernel | best IREE form | cuDNN | cuDNN/ours | IREE best/ours |"
        lines += [head + (" before |" if old else ""), "|---" * (7 + bool(old)) + "|"]
        ratios: dict[str, list[float]] = {}
        for r in members:
            ours, cud = _time(r, "convbw"), _time(r, "cudnn")
            forms = [t for t in (_time(r, f) for f in IREE_FORMS) if t]
            best = min(forms) if forms else None
            vs = cud / ours if ours and cud else None
            if vs:
                ratios.setdefault(r["key"].rsplit(".", 1)[-1], []).append(vs)
            cells = [r["key"], _status(r, "convbw"), strategy_cell(r["contenders"].get("convbw", {}).get("config", {})),
                     f"{best * 1e6:.1f}" if best else "-", _status(r, "cudnn"), f"{vs:.2f}" if vs else "-",
                     f"{best / ours:.2f}" if best and ours else "-"]  # fmt: skip
            if old:
                cells.append(_status(old[r["key"]], "convbw") if r["key"] in old else "-")
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
        for dtype, vals in sorted(ratios.items()):
            g = geomean(vals)
            lines.append(f"- {dtype}: cuDNN/ours geomean {g:.2f}, worst {min(vals):.2f} ({len(vals)} problems)")
        pairs = [(_time(r, "convbw"), _time(next((o for o in members if o["key"] == r["key"].replace(".bf16", ".f16")),
                 r), "convbw")) for r in members if r["key"].endswith(".bf16")]  # fmt: skip
        pairs = [b / f for b, f in pairs if b and f]
        if pairs:
            lines.append(f"- bf16/f16 (ours): geomean {geomean(pairs):.3f}, worst {max(pairs):.3f}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = Parser(prog="classes.py", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compile")
    c.add_argument("dir", type=Path)
    c.add_argument("--types", nargs="+", default=["f16", "bf16"], choices=["f16", "bf16"])
    c.add_argument("--only", nargs="*", help="only the problems whose name holds one of these")
    r = sub.add_parser("run")
    r.add_argument("dir", type=Path)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--class", dest="classes", nargs="*", help="only these classes, each in its own results file")
    r.add_argument("--jobs", type=int, default=1, help="measuring workers on the GPU (their GPU steps take turns)")
    rep = sub.add_parser("report")
    rep.add_argument("results", type=Path, nargs="+")
    rep.add_argument("--before", type=Path, nargs="*", default=[], help="an earlier run: its 'ours' as a column")
    args = ap.parse_args(argv)
    if args.cmd == "compile":
        compile_all(args.dir, args.types, args.only)
        return 0
    if args.cmd == "run":
        return run(args.dir, args.out, args.classes, args.jobs)
    print(report(args.results, args.before), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
