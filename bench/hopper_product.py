"""The sm_90a weight gradient through the product (issue 24): ``compile_op(p, "sm_90a")`` plans the sm_90a
kernel, the artifact's launch schedule carries its tensor maps, and the torch entry (``conv2d_weight`` on
channels-last tensors) picks ``sm_90a`` on a compute-capability 9.0 GPU and runs it by the direct launch
(``CONVBW_CUDA_LAUNCH=direct``: an error rather than IREE's runtime), which encodes the maps.

    .venv/bin/python bench/hopper_product.py compile ART          # here (the IREE compiler)
    CONVBW_ARTIFACTS=ART/artifacts python3 hopper_product.py run ART --out OUT   # on the H100 (torch, no compiler)

Each problem runs in its own process: x and dy at the start of buffers whose rest is NaN (an over-read shows
in dW), the caching allocator's blocks of dW's and the workspace's sizes filled with NaN and freed just before
the first call (so dW and the split-K partials start as NaN where they reuse them), dW checked against float64
(``torch.nn.grad.conv2d_weight`` in float64 on the same rounded inputs) with the project's tolerance
(``convbw_mlir.reference.assert_close``, matrix cores); then per-call time by CUDA events (median of 50, ours
through the entry, graph replays included, and torch's ``conv2d_weight``, cuDNN). Writes ``OUT/results.json``
and ``OUT/README.md``'s table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from pathlib import Path

from convbw_mlir.measure.children import run_child

# (name, ckProfiler problem, dtype): a ResNet-50 3x3 (split-K), a ResNet-50 1x1, a strided bf16 3x3, 64-channel groups,
# StreamK and narrow tiles (the rule's since 2026-11-26)
PROBLEMS = [
    ("resnet50_3x3_256_n256_14", "2 1 256 256 256 3 3 14 14 1 1 1 1 1 1 1 1", "f16"),
    ("resnet50_1x1_256to1024_n256_14", "2 1 256 1024 256 1 1 14 14 1 1 1 1 0 0 0 0", "f16"),
    ("strided_3x3_128to256_n64_56_bf16", "2 1 64 256 128 3 3 56 56 2 2 1 1 1 1 1 1", "bf16"),
    ("grouped_3x3_g2x64_n32_28", "2 2 32 64 64 3 3 28 28 1 1 1 1 1 1 1 1", "f16"),
    ("retina_k2376_100_streamk", "2 1 2 2376 256 3 3 100 100 1 1 1 1 1 1 1 1", "f16"),  # StreamK by the rule
    ("resnet50_1x1_64to64_n128_56_narrow", "2 1 128 64 64 1 1 56 56 1 1 1 1 0 0 0 0", "bf16"),  # 64 x 64 tiles
]
FENCE = 1 << 20  # NaN elements after x and dy
REPS = 50


def _problem(line: str, dtype: str):  # noqa: ANN202
    """The problem as the torch entry poses it (channels-last -> layout 2, dW in the input type)."""
    import torch

    from convbw_mlir.problem import ConvBwdWeightProblem
    from convbw_mlir.torch import problem_for

    p = ConvBwdWeightProblem.from_ck(line).with_(dtype=dtype, dw_dtype=dtype)
    dt = {"f16": torch.float16, "bf16": torch.bfloat16}[dtype]
    x = torch.empty(p.batch, p.groups * p.in_channels, *p.input_size, dtype=dt, device="meta")
    dy = torch.empty(p.batch, p.groups * p.out_channels, *p.output_size, dtype=dt, device="meta")
    cl = torch.channels_last
    w = (p.groups * p.out_channels, p.in_channels, *p.filter_size)
    problem, fmt = problem_for(x.to(memory_format=cl), w, dy.to(memory_format=cl), p.stride, p.pad_low, p.dilation,
                               p.groups)  # fmt: skip
    assert fmt == "channels_last" and problem.layout_family.name == "NHWGC/GKYXC/NHWGK", (fmt, problem)
    return problem, w


def compile_all(root: Path) -> None:
    from convbw_mlir import compile_op
    from convbw_mlir.policies import sm90

    manifest = []
    for name, line, dtype in PROBLEMS:
        problem, w = _problem(line, dtype)
        op = compile_op(problem, "sm_90a", output_arg=True, cache=False)
        assert sm90.is_sm90(op.plan) and op.launch.tensor_maps, (name, op.plan)
        op.save(root / "artifacts" / "sm_90a" / problem.name)
        manifest.append({"name": name, "line": line, "dtype": dtype, "problem": problem.name, "weight": list(w),
                         "plan": op.plan.to_dict(), "transient": op.launch.transient})  # fmt: skip
        print(f"{name}: {op.plan.tile.intrinsic}, split {op.plan.k_batch}", flush=True)
    (root / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")


def _fenced(shape_nchw: tuple[int, ...], dtype, seed: int):  # noqa: ANN001, ANN202
    """A channels-last tensor of unit normals at the start of a buffer whose rest is NaN."""
    import torch

    n, c, *spatial = shape_nchw
    numel = n * c * math.prod(spatial)
    buf = torch.full((numel + FENCE,), float("nan"), dtype=dtype, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(seed)
    buf[:numel].copy_(torch.randn(numel, generator=g, device="cuda", dtype=torch.float32))
    return buf[:numel].view(n, *spatial, c).permute(0, 3, 1, 2)  # channels-last (N, C, H, W)


def run_one(root: Path, entry: dict) -> dict:
    import torch

    import convbw_mlir.torch as ct
    from convbw_mlir.reference import ToleranceError, assert_close
    from convbw_mlir.torch import entry as te

    problem, w = _problem(entry["line"], entry["dtype"])
    dt = {"f16": torch.float16, "bf16": torch.bfloat16}[entry["dtype"]]
    x = _fenced((problem.batch, problem.groups * problem.in_channels, *problem.input_size), dt, 1)
    dy = _fenced((problem.batch, problem.groups * problem.out_channels, *problem.output_size), dt, 2)
    kw = {"stride": problem.stride, "padding": problem.pad_low, "dilation": problem.dilation, "groups": problem.groups}
    rec = {"name": entry["name"], "problem": problem.name, "device": torch.cuda.get_device_name(),
           "capability": list(torch.cuda.get_device_capability()),
           "target": ct.target_for(x.device, problem)[0]}  # fmt: skip
    for size in (entry["transient"], 2 * math.prod(w)):  # NaN in the blocks dW and the partials will reuse
        torch.empty(size // 2, dtype=dt, device="cuda").fill_(float("nan"))
    torch.cuda.synchronize()
    got = ct.conv2d_weight(x, w, dy, **kw)
    torch.cuda.synchronize()
    kernel = te.kernel_of(problem, x.device)
    rec["direct"] = type(kernel).__name__
    rec["tensor_maps"] = len(getattr(getattr(kernel, "launcher", None), "launch", None).tensor_maps)
    rec["plan"] = te.plan_of(problem, x.device)[0].to_dict()
    want = torch.nn.grad.conv2d_weight(x.double(), w, dy.double(), **kw)
    try:
        rec["max_error"] = assert_close(problem, got.double().cpu().numpy(), want.cpu().numpy(), matrix_cores=True)
        rec["correct"] = True
    except ToleranceError as e:
        rec["correct"], rec["error"] = False, str(e)
    rec["nan_in_result"] = bool(torch.isnan(got).any())

    def per_call(fn) -> float:  # noqa: ANN001
        times = []
        for _ in range(5):
            fn()
        for _ in range(REPS):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) * 1e3)
        return statistics.median(times)

    rec["ours_us"] = per_call(lambda: ct.conv2d_weight(x, w, dy, **kw))
    rec["cudnn_us"] = per_call(lambda: torch.nn.grad.conv2d_weight(x, w, dy, **kw))
    again = ct.conv2d_weight(x, w, dy, **kw)  # after graph replays: the same bits (deterministic plan)
    torch.cuda.synchronize()
    rec["repeat_bitwise_equal"] = bool(torch.equal(again, got))
    rec["gflop"] = 2 * math.prod(problem.gemm) / 1e9
    return rec


def run_all(root: Path, out: Path) -> int:
    from convbw_mlir.plan_data import Plan

    out.mkdir(parents=True, exist_ok=True)
    manifest = json.loads((root / "manifest.json").read_text())
    env = {**os.environ, "CONVBW_ARTIFACTS": str(root / "artifacts"), "CONVBW_CUDA_LAUNCH": "direct"}
    rows = []
    for entry in manifest:
        got = run_child([sys.executable, __file__, "run-one", str(root), entry["name"]], 300, env)
        rec = (
            got.row
            if got.row is not None
            else {"name": entry["name"], "crashed": got.ended, "stderr": got.stderr[-2000:]}
        )
        print(json.dumps(rec), flush=True)
        rows.append(rec)
    (out / "results.json").write_text(json.dumps(rows, indent=1) + "\n")
    lines = ["| problem | GFLOP | target, path | plan (wgmma N, splits) | correct (max error) | ours us | cuDNN us |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        if "crashed" in r:
            lines.append(f"| {r['name']} | | | | crashed ({r['crashed']}) | | |")
            continue
        plan = Plan.from_dict(r["plan"])
        wgmma_n = plan.tile.n if plan.tile else None
        lines.append(f"| {r['name']} | {r['gflop']:.1f} | {r['target']}, {r['direct']} ({r['tensor_maps']} maps) | "
                     f"{wgmma_n}, {plan.k_batch} | {r['correct']} ({r.get('max_error', r.get('error'))}) | "
                     f"{r['ours_us']:.1f} | {r['cudnn_us']:.1f} |")  # fmt: skip
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if all(r.get("correct") for r in rows) else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("compile").add_argument("root", type=Path)
    r = sub.add_parser("run")
    r.add_argument("root", type=Path)
    r.add_argument("--out", type=Path, required=True)
    o = sub.add_parser("run-one")
    o.add_argument("root", type=Path)
    o.add_argument("name")
    a = ap.parse_args(argv)
    if a.cmd == "compile":
        compile_all(a.root)
        return 0
    if a.cmd == "run":
        return run_all(a.root, a.out)
    entry = next(e for e in json.loads((a.root / "manifest.json").read_text()) if e["name"] == a.name)
    print(json.dumps(run_one(a.root, entry)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
