"""Issue 40 item 4: 3-D layers with a unit filter extent, the plan now against the same problem folded into its 2-D
twin (``fold_rank=True``: 1 x kh x kw with the depth in the batch, kd x 1 x 1 with H*W one axis; docs/decisions.md
#rank-fold), and cuDNN (the runner's), side by side. The fold is not the plan's default until these figures say so
(switch ``FOLD_RANK_BY_DEFAULT``, off).

    .venv/bin/python bench/rankfold.py compile DIR [--workers 2] [--cache CACHE]   # here (the IREE compiler)
    python3 -m convbw_mlir.measure.run DIR --server --out OUT/results.json          # on the GPU (one process)
    .venv/bin/python bench/rankfold.py report OUT/results.json --manifest DIR/manifest.json  # the table, the verdict

The layers (the zoo's and the classes suite's factorized 3-D layers at their suites' batches, real sizes; ``tune``:
the switch may be set on them; ``held``: held back, to check the switch's verdict on layers it was not set on) come
by priority, so a run cut short (``split --parts``) keeps the most important rows: the classes suite's R(2+1)D pair
and R(2+1)D-18 (f16) first, then S3D's larger layers (held), then bf16 and MC3-18 / X3D (held).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from harness import compile_manifest, geomean, probe_main, result_seconds

# (name, ckProfiler line "NDim G N K C <filter> <input> <strides> <dilations> <left pads> <right pads>", dtype, set)
_R21D = [  # convbw_mlir/suites/zoo.tsv, N = 32 (16 frames of 112x112)
    ("r2plus1d_18.stem.0", "3 1 32 45 3 1 7 7 16 112 112 1 2 2 1 1 1 0 3 3 0 3 3"),
    ("r2plus1d_18.stem.3", "3 1 32 64 45 3 1 1 16 56 56 1 1 1 1 1 1 1 0 0 1 0 0"),
    ("r2plus1d_18.layer1.0.conv1.0.0", "3 1 32 144 64 1 3 3 16 56 56 1 1 1 1 1 1 0 1 1 0 1 1"),
    ("r2plus1d_18.layer1.0.conv1.0.3", "3 1 32 64 144 3 1 1 16 56 56 1 1 1 1 1 1 1 0 0 1 0 0"),
    ("r2plus1d_18.layer2.0.conv1.0.0", "3 1 32 230 64 1 3 3 16 56 56 1 2 2 1 1 1 0 1 1 0 1 1"),
    ("r2plus1d_18.layer2.0.conv1.0.3", "3 1 32 128 230 3 1 1 16 28 28 2 1 1 1 1 1 1 0 0 1 0 0"),
    ("r2plus1d_18.layer2.0.conv2.0.0", "3 1 32 230 128 1 3 3 8 28 28 1 1 1 1 1 1 0 1 1 0 1 1"),
    ("r2plus1d_18.layer2.0.conv2.0.3", "3 1 32 128 230 3 1 1 8 28 28 1 1 1 1 1 1 1 0 0 1 0 0"),
    ("r2plus1d_18.layer2.1.conv1.0.0", "3 1 32 288 128 1 3 3 8 28 28 1 1 1 1 1 1 0 1 1 0 1 1"),
    ("r2plus1d_18.layer2.1.conv1.0.3", "3 1 32 128 288 3 1 1 8 28 28 1 1 1 1 1 1 1 0 0 1 0 0"),
    ("r2plus1d_18.layer3.0.conv1.0.0", "3 1 32 460 128 1 3 3 8 28 28 1 2 2 1 1 1 0 1 1 0 1 1"),
    ("r2plus1d_18.layer3.0.conv1.0.3", "3 1 32 256 460 3 1 1 8 14 14 2 1 1 1 1 1 1 0 0 1 0 0"),
    ("r2plus1d_18.layer3.0.conv2.0.0", "3 1 32 460 256 1 3 3 4 14 14 1 1 1 1 1 1 0 1 1 0 1 1"),
    ("r2plus1d_18.layer3.0.conv2.0.3", "3 1 32 256 460 3 1 1 4 14 14 1 1 1 1 1 1 1 0 0 1 0 0"),
    ("r2plus1d_18.layer3.1.conv1.0.0", "3 1 32 576 256 1 3 3 4 14 14 1 1 1 1 1 1 0 1 1 0 1 1"),
    ("r2plus1d_18.layer3.1.conv1.0.3", "3 1 32 256 576 3 1 1 4 14 14 1 1 1 1 1 1 1 0 0 1 0 0"),
    ("r2plus1d_18.layer4.0.conv1.0.0", "3 1 32 921 256 1 3 3 4 14 14 1 2 2 1 1 1 0 1 1 0 1 1"),
    ("r2plus1d_18.layer4.0.conv1.0.3", "3 1 32 512 921 3 1 1 4 7 7 2 1 1 1 1 1 1 0 0 1 0 0"),
    ("r2plus1d_18.layer4.0.conv2.0.0", "3 1 32 921 512 1 3 3 2 7 7 1 1 1 1 1 1 0 1 1 0 1 1"),
    ("r2plus1d_18.layer4.0.conv2.0.3", "3 1 32 512 921 3 1 1 2 7 7 1 1 1 1 1 1 1 0 0 1 0 0"),
    ("r2plus1d_18.layer4.1.conv1.0.0", "3 1 32 1152 512 1 3 3 2 7 7 1 1 1 1 1 1 0 1 1 0 1 1"),
    ("r2plus1d_18.layer4.1.conv1.0.3", "3 1 32 512 1152 3 1 1 2 7 7 1 1 1 1 1 1 1 0 0 1 0 0"),
]
_CLASSES = [  # convbw_mlir/suites/classes.tsv's foldable 3-D rows, N = 8
    ("conv3d_r2plus1d_spatial", "3 1 8 144 64 1 3 3 16 56 56 1 1 1 1 1 1 0 1 1 0 1 1"),
    ("conv3d_r2plus1d_temporal", "3 1 8 64 144 3 1 1 16 56 56 1 1 1 1 1 1 1 0 0 1 0 0"),
]
_S3D = [  # zoo.tsv, N = 32 (16 frames of 224x224): its separable convs of >= 9 GFLOP
    ("held.s3d.features.0.0.0", "3 1 32 64 3 1 7 7 16 224 224 1 2 2 1 1 1 0 3 3 0 3 3"),
    ("held.s3d.features.0.1.0", "3 1 32 64 64 7 1 1 16 112 112 2 1 1 1 1 1 3 0 0 3 0 0"),
    ("held.s3d.features.3.0.0", "3 1 32 192 64 1 3 3 8 56 56 1 1 1 1 1 1 0 1 1 0 1 1"),
    ("held.s3d.features.3.1.0", "3 1 32 192 192 3 1 1 8 56 56 1 1 1 1 1 1 1 0 0 1 0 0"),
    ("held.s3d.features.5.branch1.1.0.0", "3 1 32 128 96 1 3 3 8 28 28 1 1 1 1 1 1 0 1 1 0 1 1"),
    ("held.s3d.features.5.branch1.1.1.0", "3 1 32 128 128 3 1 1 8 28 28 1 1 1 1 1 1 1 0 0 1 0 0"),
    ("held.s3d.features.6.branch1.1.0.0", "3 1 32 192 128 1 3 3 8 28 28 1 1 1 1 1 1 0 1 1 0 1 1"),
    ("held.s3d.features.6.branch1.1.1.0", "3 1 32 192 192 3 1 1 8 28 28 1 1 1 1 1 1 1 0 0 1 0 0"),
    ("held.s3d.features.6.branch2.1.0.0", "3 1 32 96 32 1 3 3 8 28 28 1 1 1 1 1 1 0 1 1 0 1 1"),
    ("held.s3d.features.6.branch2.1.1.0", "3 1 32 96 96 3 1 1 8 28 28 1 1 1 1 1 1 1 0 0 1 0 0"),
    ("held.s3d.features.10.branch1.1.0.0", "3 1 32 256 128 1 3 3 4 14 14 1 1 1 1 1 1 0 1 1 0 1 1"),
    ("held.s3d.features.10.branch1.1.1.0", "3 1 32 256 256 3 1 1 4 14 14 1 1 1 1 1 1 1 0 0 1 0 0"),
    ("held.s3d.features.12.branch1.1.0.0", "3 1 32 320 160 1 3 3 4 14 14 1 1 1 1 1 1 0 1 1 0 1 1"),
    ("held.s3d.features.12.branch1.1.1.0", "3 1 32 320 320 3 1 1 4 14 14 1 1 1 1 1 1 1 0 0 1 0 0"),
]
_HELD_MORE = [  # MC3-18 (zoo.tsv, N = 32); X3D-M's stem (pytorchvideo x3d_m: 16 x 224^2, conv_t depthwise 5x1x1), N = 8
    ("held.mc3_18.layer2.0.conv2.0", "3 1 32 128 128 1 3 3 16 28 28 1 1 1 1 1 1 0 1 1 0 1 1"),
    ("held.mc3_18.layer3.0.conv2.0", "3 1 32 256 256 1 3 3 16 14 14 1 1 1 1 1 1 0 1 1 0 1 1"),
    ("held.mc3_18.layer4.0.conv1.0", "3 1 32 512 256 1 3 3 16 14 14 1 2 2 1 1 1 0 1 1 0 1 1"),
    ("held.x3d_m.stem.conv_xy", "3 1 8 24 3 1 3 3 16 224 224 1 2 2 1 1 1 0 1 1 0 1 1"),
    ("held.x3d_m.stem.conv_t", "3 24 8 1 1 5 1 1 16 112 112 1 1 1 1 1 1 2 0 0 2 0 0"),
]
_BF16 = ["conv3d_r2plus1d_spatial", "conv3d_r2plus1d_temporal", "r2plus1d_18.layer1.0.conv1.0.0",
         "r2plus1d_18.layer1.0.conv1.0.3", "r2plus1d_18.layer3.1.conv1.0.0",
         "r2plus1d_18.layer3.1.conv1.0.3"]  # fmt: skip
LAYERS = (
    [(n, line, "f16", "tune") for n, line in _CLASSES + _R21D]
    + [(n, line, "f16", "held") for n, line in _S3D]
    + [(n, line, "bf16", "tune") for n, line in _CLASSES + _R21D if n in _BF16]
    + [(n, line, "f16", "held") for n, line in _HELD_MORE]
)


def problem(line: str, dtype: str) -> Any:
    from convbw_mlir.problem import ConvBwdWeightProblem

    return ConvBwdWeightProblem.from_ck(line).with_(dtype=dtype, dw_dtype=dtype)


def variants(p: Any) -> list[Any]:
    """The plan now, then the folded plan (``fold_rank=True``) where its plan differs (it always does: fold_rank)."""
    from convbw_mlir.dispatch.variants import distinct

    return distinct(p, "sm_90a", [("fold", {"fold_rank": True})])


def compile_all(out: Path, workers: int, cache: Path) -> int:
    from convbw_mlir.plan import folded_twin

    items = []
    for name, line, dtype, kind in LAYERS:
        p = problem(line, dtype)
        items.append((name, p, variants(p), {"held_out": kind == "held", "fold": folded_twin(p)[1]}))
    return compile_manifest(out, items, workers, cache)


def report(results: list[Path], manifest: Path) -> int:
    """Per layer: the plan now's, the folded plan's and cuDNN's kernel time (us) and their ratios; then geomeans of
    plan now / folded (> 1: the fold faster) by fold kind (depth, plane) and kernel, the tune and the held-back
    layers apart."""
    rows = [r for f in results for r in json.loads(f.read_text())["problems"]]
    man = {e["key"]: e for e in json.loads(manifest.read_text())["problems"]}
    lines = ["| layer | dtype | fold | kernel now | kernel folded | plan now us | folded us | cuDNN us | now/folded | "
             "cuDNN/now | cuDNN/folded |", "|---|---|---|---|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    groups: dict[tuple[str, str], list[float]] = {}
    vs_cudnn: dict[str, list[float]] = {"now": [], "folded": [], "best": []}
    bad = []
    for r in rows:
        entry = man.get(r["key"]) or next(e for e in man.values() if e["name"] == r["name"])
        p, fold = entry["problem"], entry.get("extra", entry).get("fold", "?")
        times = {n: result_seconds(c) for n, c in r["contenders"].items() if n != "reference"}
        bad += [f"{r['key']} {n}: {c.get('status')} {str(c.get('error', ''))[:100]}" for n, c in r["contenders"].items()
                if n != "reference" and c.get("status") not in ("ok", None)]  # fmt: skip
        now, folded, cudnn = times.get("convbw[heuristic]"), times.get("convbw[fold]"), times.get("cudnn")

        def kernel(name: str, entry: dict[str, Any] = entry) -> str:
            plan = (entry["contenders"].get(name) or {}).get("variant", {}).get("plan") or {}
            intr = (plan.get("tile") or {}).get("intrinsic", plan.get("strategy", "-"))
            return "wgmma" if "WGMMA" in intr else ("sm80" if "MMA_SYNC" in intr else str(intr))

        def us(t: float | None) -> str:
            return f"{t * 1e6:.1f}" if t else "-"

        def ratio(a: float | None, b: float | None) -> str:
            return f"{a / b:.2f}" if a and b else "-"

        held = "held" if r["name"].startswith("held.") else "tune"
        if now and folded:
            groups.setdefault((held, f"{fold} {kernel('convbw[heuristic]')}"), []).append(now / folded)
            groups.setdefault((held, f"{fold} all"), []).append(now / folded)
        if cudnn and now and folded:
            vs_cudnn["now"].append(cudnn / now)
            vs_cudnn["folded"].append(cudnn / folded)
            vs_cudnn["best"].append(cudnn / min(now, folded))
        lines.append(f"| {r['name']} | {p['dtype']} | {fold} | {kernel('convbw[heuristic]')} | "
                     f"{kernel('convbw[fold]')} | {us(now)} | {us(folded)} | {us(cudnn)} | {ratio(now, folded)} | "
                     f"{ratio(cudnn, now)} | {ratio(cudnn, folded)} |")  # fmt: skip

    lines += ["", "| set | fold, kernel now | layers | geomean now / folded (> 1: the fold faster) | min | max |",
              "|---|---|---:|---:|---:|---:|"]  # fmt: skip
    for (held, kind), v in sorted(groups.items()):
        lines.append(f"| {held} | {kind} | {len(v)} | {geomean(v):.3f} | {min(v):.2f} | {max(v):.2f} |")
    lines += ["", "| all layers | geomean cuDNN/ours | min |", "|---|---:|---:|"]
    for k, v in vs_cudnn.items():
        if v:
            lines.append(f"| {k} | {geomean(v):.3f} | {min(v):.2f} |")
    print("\n".join(lines))
    if bad:
        print("\nnot ok:\n" + "\n".join(bad))
    return 0


def main(argv: list[str] | None = None) -> int:
    return probe_main(argv, __doc__, "rankfold", 3, compile_all, report)


if __name__ == "__main__":
    sys.exit(main())
