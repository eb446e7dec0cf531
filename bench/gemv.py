"""Issue 40 items 3-4: the split-reduction GEMV kernel against the plan before it, IREE's forms and cuDNN.

    python bench/gemv.py compile .art/gemv [--types f16 bf16] [--only S ...]     (here: IREE compiler, sm_90a)
    python3 -m convbw_mlir.measure.run .art/gemv --server --out OUT/results.json (GPU machine: one process)
    python bench/gemv.py report OUT/results.json > table.md

The problems (:func:`problems`): CK's own test list, the issue's CK 3-D case at 32^3, wav2vec 2.0 / HuBERT conv0
(C = 1, K = 512, 10 taps, stride 5) at batches 4-16 and 16k-250k samples, the zoo's layers with K or C <= 8 (SE
blocks' 1x1s on 1x1 images, pointwise layers, stems), small 3-D layers (32^3-64^3, 3x3x3, <= 64 channels). Each
is compiled for sm_90a, channels-last (layout 2), with these contenders:

    convbw                   the plan now (the GEMV kernel where rule gemv-by-default takes the problem)
    convbw:strategy=codegen  where the plan now is the GEMV kernel: the plan before it (codegen; checked equal)
    convbw:strategy=gemv     where the plan now is another kernel: the GEMV kernel beside it
    iree_direct, iree_torch, iree_fusilli   IREE's own forms (f16, CK's list and the issue's case: cheap)

The run is the product's runner in its one-process mode (``--server``: nothing else on the GPU while a kernel is
timed; NaN fences; float64 checks); cuDNN in the same process. ``report`` gives per problem ours (the plan now),
before, the GEMV kernel, the best correct IREE form, cuDNN and the ratios, per class the geomeans.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import geomean  # noqa: E402

IREE_FORMS = ("iree_direct", "iree_torch", "iree_fusilli")
BEFORE, GEMV = "convbw:strategy=codegen", "convbw:strategy=gemv"

# wav2vec 2.0 / HuBERT conv0 (the same layer): batch, samples
SPEECH = ((4, 16000), (8, 16000), (16, 16000), (8, 64000), (4, 250000))
# Zoo layers (convbw_mlir/suites/zoo.tsv) with K or C <= 8 in at most four groups: SE 1x1s, pointwise, stems
ZOO = (
    "regnet_y_400mf.trunk_output.block1.block1-0.f.se.fc1.n32",
    "regnet_y_400mf.trunk_output.block1.block1-0.f.se.fc2.n32",
    "regnet_y_3_2gf.trunk_output.block1.block1-0.f.se.fc2.n32",
    "mobilenet_v3_small.features.1.block.1.fc1.n32",
    "mobilenet_v3_small.features.1.block.1.fc2.n32",
    "efficientnet_b0.features.1.0.block.1.fc2.n32",
    "efficientnet_b0.features.2.0.block.2.fc1.n32",
    "efficientnet_b0.features.2.0.block.2.fc2.n32",
    "efficientnet_b0.features.2.1.block.2.fc1.n32",
    "efficientnet_b0.features.2.1.block.2.fc2.n32",
    "mixnet_s.blocks.1.0.conv_pw.0.n32",
    "ghostnet_100.blocks.0.0.ghost1.primary_conv.0.n32",
    "lcnet_050.blocks.0.0.conv_pw.n32",
    "repvgg_a2.stem.conv_1x1.conv.n32",
    "sew.feature_extractor.conv_layers.0.conv.n32",
    "mobilenet_v3_large.features.0.0.n32",
    "lcnet_050.conv_stem.n32",
)
# Small 3-D: the CK case at 32^3, a 3-D U-Net's single-channel stem and a 4-modality one, a thin level, a
# segmentation head (3 classes)
SMALL_3D = {
    "3d_ck_k1_c32_32": "3 1 1 1 32 3 3 3 32 32 32 1 1 1 1 1 1 1 1 1 1 1 1",
    "3d_unet_stem_c1_k32_64": "3 1 2 32 1 3 3 3 64 64 64 1 1 1 1 1 1 1 1 1 1 1 1",
    "3d_unet_stem_c4_k16_64": "3 1 2 16 4 3 3 3 64 64 64 1 1 1 1 1 1 1 1 1 1 1 1",
    "3d_thin_c8_k8_32": "3 1 4 8 8 3 3 3 32 32 32 1 1 1 1 1 1 1 1 1 1 1 1",
    "3d_head_c32_k3_64": "3 1 2 3 32 3 3 3 64 64 64 1 1 1 1 1 1 1 1 1 1 1 1",
}


def problems(types: list[str], only: list[str] | None = None) -> list[tuple[str, Any, bool]]:
    """(name, problem, with IREE's forms) of every measured entry."""
    from convbw_mlir.problem import ConvBwdWeightProblem
    from convbw_mlir.suites import load_suite

    zoo = dict(load_suite("zoo", dtype="f16"))
    out: list[tuple[str, Any, bool]] = []
    for dtype in types:
        f16 = dtype == "f16"
        for name, p in load_suite("ck_test_grouped_convnd_bwd_weight", dtype=dtype):
            if f16 or min(p.in_channels, p.out_channels) <= 8:
                out.append((f"ck_{name}", p, f16))
        for name, ck in SMALL_3D.items():
            out.append((name, ConvBwdWeightProblem.from_ck(ck, dtype=dtype), f16 and name == "3d_ck_k1_c32_32"))
        for n, samples in SPEECH:
            p = ConvBwdWeightProblem.from_ck(f"1 1 {n} 512 1 10 {samples} 5 1 0 0", dtype=dtype)
            out.append((f"speech_wav2vec2_conv0_n{n}_{samples // 1000}k", p, False))
        if f16:
            out += [(f"zoo_{name}", zoo[name], False) for name in ZOO]
    return [e for e in out if not only or any(s in e[0] for s in only)]


def contenders(p: Any, iree: bool) -> tuple[str, ...]:
    """What one problem runs (the module docstring); the plan before is checked to be codegen's plan as named."""
    from convbw_mlir.plan import PlanError, decide
    from convbw_mlir.policies import switches

    now = decide(p, "sm_90a")
    forms = ["convbw", "reference"]
    if now.gemv is not None:
        switches.GEMV_BY_DEFAULT = False
        try:
            before = decide(p, "sm_90a")
        finally:
            switches.GEMV_BY_DEFAULT = True
        if before.to_dict() != decide(p, "sm_90a", strategy="codegen").to_dict():
            raise AssertionError(f"{p.name}: the plan before is not codegen's plan as strategy=codegen gives it")
        forms.append(BEFORE)
    else:
        try:
            decide(p, "sm_90a", strategy="gemv")
            forms.append(GEMV)
        except PlanError:
            pass
    return (*forms, *(IREE_FORMS if iree else ()))


def compile_all(folder: Path, types: list[str], only: list[str] | None, gemv_only: bool = False) -> None:
    """Every entry's contenders into ``folder`` (one manifest; each problem compiled in a child process);
    ``gemv_only``: only the entries where the GEMV kernel runs (the others' plan is the same as before)."""
    from classes import merge_manifests

    from convbw_mlir.build.contenders import write_artifacts

    groups: dict[tuple[str, ...], list] = {}
    for name, p, iree in problems(types, only):
        forms = contenders(p, iree)
        if gemv_only and BEFORE not in forms and GEMV not in forms:
            continue
        groups.setdefault(forms, []).append((name, p))
    parts = []
    for i, (forms, probs) in enumerate(groups.items()):
        parts.append(write_artifacts(probs, "sm_90a", folder.with_name(f"{folder.name}.part{i}"), forms))
    merge_manifests(parts, folder)


def _time(row: dict, name: str) -> float | None:
    """The contender's kernel time a call by CUPTI (its call time where CUPTI gave none); None unless correct."""
    r = row["contenders"].get(name, {})
    return r.get("kernel_s") or r.get("median_s") if r.get("status") == "ok" else None


def _cell(row: dict, name: str) -> str:
    t = _time(row, name)
    if t:
        return f"{t * 1e6:.1f}"
    status = row["contenders"].get(name, {}).get("status")
    return status or "-"


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a and b else "-"


def report(paths: list[Path], fill: list[Path] | None = None, iree_from: list[Path] | None = None) -> str:
    """The table of ``paths``' rows; ``fill``: an earlier run's rows of the problems ``paths`` lack (marked);
    ``iree_from``: an earlier run's IREE forms for the rows that have none (IREE's kernels do not change)."""
    data = [json.loads(p.read_text()) for p in paths]
    rows = [r for d in data for r in d["problems"]]
    iree = {r["key"]: r["contenders"] for p in iree_from or [] for r in json.loads(p.read_text())["problems"]}
    for r in rows:
        if not any(f in r["contenders"] for f in IREE_FORMS) and r["key"] in iree:
            r["contenders"].update({f: iree[r["key"]][f] for f in IREE_FORMS if f in iree[r["key"]]})
    have = {r["key"] for r in rows}
    for path in fill or []:
        for r in json.loads(path.read_text())["problems"]:
            if r["key"] not in have:
                rows.append(dict(r, name=f"{r['name']} ({path.parent.name})"))
    device = data[0].get("device", "-") if data else "-"
    lines = [f"# The GEMV kernel: the plan now, before, IREE's best form, cuDNN ({device}, sm_90a code)", ""]
    lines.append("Times in µs (median kernel time by CUPTI); ratios > 1: the plan now is faster. now = the plan "
                 "with rule gemv-by-default; before = the plan without it (= where the same);"
                 " gemv = the GEMV kernel asked for.")  # fmt: skip
    by_class: dict[str, list[dict]] = {}
    for r in rows:
        by_class.setdefault(r["name"].split("_", 1)[0], []).append(r)
    summary = []
    for cls, members in by_class.items():
        lines += ["", f"## {cls}", ""]
        lines += ["| problem | type | now | before | gemv | best IREE | cuDNN | cuDNN/now | before/now | "
                  "IREE/now | cuDNN/gemv |", "|---" * 11 + "|"]  # fmt: skip
        ratios: dict[str, list[float]] = {"cudnn/now": [], "before/now": [], "cudnn/gemv": [], "iree/now": []}
        for r in members:
            now, cud = _time(r, "convbw"), _time(r, "cudnn")
            changed = BEFORE in r["contenders"]  # the plan now is the GEMV kernel, the plan before is codegen's
            gem = now if changed else _time(r, GEMV)
            forms = [t for t in (_time(r, f) for f in IREE_FORMS) if t]
            best = min(forms) if forms else None
            for key, (a, b) in {"cudnn/now": (cud, now), "before/now": (_time(r, BEFORE), now),
                                "cudnn/gemv": (cud, gem), "iree/now": (best, now)}.items():  # fmt: skip
                if a and b:
                    ratios[key].append(a / b)
            before_cell = _cell(r, BEFORE) if changed else "="
            gemv_cell = "now" if changed else (_cell(r, GEMV) if GEMV in r["contenders"] else "-")
            lines.append(
                f"| {r['name']} | {r['key'].rsplit('.', 1)[-1]} | {_cell(r, 'convbw')} | {before_cell} | {gemv_cell}"
                f" | {f'{best * 1e6:.1f}' if best else '-'} | {_cell(r, 'cudnn')} | {_ratio(cud, now)}"
                f" | {_ratio(_time(r, BEFORE), now)} | {_ratio(best, now)} | {_ratio(cud, gem)} |"
            )
        cells = {k: (f"{geomean(v):.2f} (min {min(v):.2f}, n={len(v)})" if v else "-") for k, v in ratios.items()}
        summary.append(f"| {cls} | " + " | ".join(cells.values()) + " |")
    lines += ["", "## Geomeans", "", "| class | cuDNN/now | before/now | cuDNN/gemv | IREE/now |",
              "|---|---|---|---|---|", *summary]  # fmt: skip
    variants = sorted({n for r in rows for n in r["contenders"] if n.startswith("gemv_")})
    if variants:  # the GEMV kernel with one policy constant changed (compiled beside, same run)
        head = "| problem | type | rule | " + " | ".join(variants) + " |"
        lines += ["", "## The GEMV kernel's rule against variants (µs)", "", head, "|---" * (3 + len(variants)) + "|"]
        for r in rows:
            if not any(v in r["contenders"] for v in variants):
                continue
            rule_cell = _cell(r, "convbw") if BEFORE in r["contenders"] else _cell(r, GEMV)
            cells = " | ".join(_cell(r, v) if v in r["contenders"] else "=" for v in variants)
            lines.append(f"| {r['name']} | {r['key'].rsplit('.', 1)[-1]} | {rule_cell} | {cells} |")
    verdicts: dict[str, dict[str, int]] = {}
    for r in rows:
        for name, rec in r["contenders"].items():
            status = rec.get("status", "?")
            verdicts.setdefault(name, {}).setdefault(status, 0)
            verdicts[name][status] += 1
    lines += ["", "## Verdicts (contender: status counts)", ""]
    lines += [f"- {name}: " + ", ".join(f"{k} {v}" for k, v in sorted(c.items())) for name, c in verdicts.items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compile")
    c.add_argument("folder", type=Path)
    c.add_argument("--types", nargs="+", default=["f16", "bf16"])
    c.add_argument("--only", nargs="*")
    c.add_argument("--list", action="store_true", help="print the entries and their contenders, compile nothing")
    c.add_argument("--gemv-only", action="store_true", help="only the entries where the GEMV kernel runs")
    r = sub.add_parser("report")
    r.add_argument("results", type=Path, nargs="+")
    r.add_argument("--fill", type=Path, nargs="*", help="an earlier run's results: its rows of the problems missing")
    r.add_argument("--iree-from", type=Path, nargs="*", help="an earlier run's results: its IREE forms' figures")
    args = ap.parse_args(argv)
    if args.cmd == "compile":
        if args.list:
            for name, p, iree in problems(args.types, args.only):
                print(name, p.dtype, " ".join(contenders(p, iree)))
            return 0
        compile_all(args.folder, args.types, args.only, args.gemv_only)
        return 0
    print(report(args.results, args.fill, args.iree_from), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
