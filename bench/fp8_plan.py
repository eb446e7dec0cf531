"""fp8 weight gradients through the plan (issue 24 item 4): ``compile_op`` of an fp8 problem (e4m3 x, e5m2 dy, dW
bf16, the per-tensor scales as the scale epilogue) for sm_90a, against our f16 kernel (the plan's sm_90a conv
kernel) and cuDNN's f16 weight gradient, on >= 4 GFLOP ResNet-50 1x1 layers, in one run, by the direct launch.

    .venv/bin/python bench/fp8_plan.py compile ART     # here (the IREE compiler)
    python3 fp8_plan.py run ART --out OUT               # on the GPU machine (torch, a wheel of the product)

Each problem runs in its own process: f16 x and dy (unit normals) at the start of buffers whose rest is NaN
(fp8's code 0x7f, NaN in both types), quantized with fixed per-tensor scales (delayed scaling, as Transformer
Engine's recipe: the scale is known before the step, so the plan's constant fits; x * 2^6 in e4m3, dy * 2^12 in
e5m2, alpha = 2^-18); dW and the workspace filled with NaN before the first call. ours fp8 is checked against
float64 on the same fp8 inputs with the documented bound (``convbw_mlir.reference.fp8_bound``, per element), ours
f16 and cuDNN against float64 on the f16 inputs (``assert_close``, matrix cores). Kernel time by CUPTI
(torch.profiler): a call's kernels summed over 30 back-to-back calls; ours fp8 also split into the K-major
copies (the quantize step of a recipe writes them), the GEMM and the split's stage 2.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from convbw_mlir.measure.children import run_child

# (name, N, C, K, H = W, stride): ResNet-50's 1x1 layers (>= 4 GFLOP at these batches)
PROBLEMS = [
    ("res2_1x1_64to256_n128_56", 128, 64, 256, 56, 1),
    ("res3_1x1_512to128_n256_28", 256, 512, 128, 28, 1),
    ("res3_1x1_128to512_n128_28", 128, 128, 512, 28, 1),
    ("res4_1x1_1024to256_n256_14", 256, 1024, 256, 14, 1),
    ("res4_1x1_256to1024_n256_14", 256, 256, 1024, 14, 1),
    ("res5_1x1_2048to512_n256_7", 256, 2048, 512, 7, 1),
    ("res4_shortcut_1x1_512to1024_s2_n256_28", 256, 512, 1024, 28, 2),
]
X_SCALE, DY_SCALE = 2.0**-6, 2.0**-12  # x / scale in e4m3 (|64 x| <= 448), dy / scale in e5m2
FENCE = 1 << 20  # elements after x and dy
CALLS = 30


def problems(name: str, n: int, c: int, k: int, hw: int, s: int) -> dict[str, Any]:
    from convbw_mlir.problem import ConvBwdWeightProblem

    base = ConvBwdWeightProblem(1, n, c, k, (hw, hw), (1, 1), stride=s, layout=2)
    fp8 = base.with_(dtype="e4m3", dy_dtype="e5m2", dw_dtype="bf16",
                     epilogue={"kind": "scale", "alpha": X_SCALE * DY_SCALE})  # fmt: skip
    # stride 1: the same fp8 problem with x and dy K-major (problem.K_MAJOR), the copies the quantize step writes
    return {"f16": base, "fp8": fp8, **({"fp8k": fp8.with_(layout="k_major")} if s == 1 else {})}


def compile_all(root: Path) -> None:
    from convbw_mlir import compile_op
    from convbw_mlir.policies import sm90, sm90_fp8

    manifest = []
    for spec in PROBLEMS:
        entry: dict[str, Any] = {"name": spec[0], "spec": list(spec)}
        for kind, p in problems(*spec).items():
            op = compile_op(p, "sm_90a", output_arg=True, cache=False)
            assert (sm90.is_sm90 if kind == "f16" else sm90_fp8.is_fp8)(op.plan), (spec, op.plan)
            assert op.launch is not None and op.launch.refused is None, (spec, kind, op.launch)
            op.save(root / kind / p.name)
            entry[kind] = {"problem": p.to_dict(), "dir": f"{kind}/{p.name}", "plan": op.plan.to_dict(),
                           "transient": op.launch.transient}  # fmt: skip
            print(f"{spec[0]} {kind}: {op.plan.tile.intrinsic}, split {op.plan.k_batch}", flush=True)
        manifest.append(entry)
    (root / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")


def _fenced(shape: tuple[int, ...], seed: int):  # noqa: ANN202
    """f16 unit normals, channels-last, at the start of a buffer of NaN."""
    import torch

    numel = math.prod(shape)
    buf = torch.full((numel + FENCE,), float("nan"), dtype=torch.float16, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(seed)
    buf[:numel].copy_(torch.randn(numel, generator=g, device="cuda", dtype=torch.float32))
    assert not torch.isnan(buf[:numel]).any()  # NaN fence: the data itself is finite
    return buf[:numel].view(shape)


def _quantized(t, scale: float, dtype):  # noqa: ANN001, ANN202
    """``t / scale`` in fp8 at the start of a buffer of NaN codes (0x7f)."""
    import torch

    q = (t.float() / scale).to(dtype)
    assert not torch.isnan(q.float()).any()  # NaN fence after the cast: no code saturated to NaN
    return _fenced_fp8(q)


def _fenced_fp8(q):  # noqa: ANN001, ANN202
    """A contiguous copy of fp8 ``q`` at the start of a buffer of NaN codes (0x7f: NaN in e4m3 and e5m2)."""
    import torch

    q = q.contiguous()
    dtype = q.dtype
    buf = torch.full((q.numel() + FENCE,), 0x7F, dtype=torch.uint8, device="cuda")
    buf[: q.numel()].copy_(q.reshape(-1).view(torch.uint8))
    return buf[: q.numel()].view(dtype).view(q.shape)


def _launcher(root: Path, entry: dict, kind: str):  # noqa: ANN202
    from convbw_mlir.build.artifact import CompiledOp
    from convbw_mlir.cuda_launch import CudaLauncher

    op = CompiledOp.load(root / entry[kind]["dir"])
    return CudaLauncher(op.launch, 0), op


def _kernel_times(call) -> dict[str, float]:  # noqa: ANN001
    """us a call, by kernel name, over CALLS back-to-back calls (CUPTI through torch.profiler)."""
    import torch

    from convbw_mlir.measure.cupti import kernel_events

    for _ in range(5):
        call()
    torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "t.json"
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(CALLS):
                call()
            torch.cuda.synchronize()
        prof.export_chrome_trace(str(trace))
        events = kernel_events(trace)
    out: dict[str, float] = {}
    for _, dur, name in events:
        out[name[:80]] = out.get(name[:80], 0.0) + dur / CALLS
    return out


def run_one(root: Path, entry: dict) -> dict[str, Any]:
    import torch

    from convbw_mlir.problem import ConvBwdWeightProblem
    from convbw_mlir.reference import ToleranceError, assert_close

    f16 = ConvBwdWeightProblem.from_dict(entry["f16"]["problem"])
    fp8 = ConvBwdWeightProblem.from_dict(entry["fp8"]["problem"])
    rec: dict[str, Any] = {"name": entry["name"], "device": torch.cuda.get_device_name(),
                           "gflop": f16.flops / 1e9, "fp8_plan": entry["fp8"]["plan"],
                           "f16_plan": entry["f16"]["plan"]}  # fmt: skip
    n, (h, w), (ho, wo), c, k = f16.batch, f16.input_size, f16.output_size, f16.in_channels, f16.out_channels
    x = _fenced((n, h, w, 1, c), 1)  # layout 2: NHWGC
    dy = _fenced((n, ho, wo, 1, k), 2)
    xq, dyq = _quantized(x, X_SCALE, torch.float8_e4m3fn), _quantized(dy, DY_SCALE, torch.float8_e5m2)
    s = f16.stride[0]
    x_rows = x[:, ::s, ::s].reshape(-1, c).double()
    dy_rows = dy.reshape(-1, k).double()
    want16 = (dy_rows.t() @ x_rows).cpu().numpy().reshape(f16.dw_shape)
    xq_rows, dyq_rows = xq[:, ::s, ::s].reshape(-1, c).double(), dyq.reshape(-1, k).double()
    alpha = fp8.epilogue.alpha  # X_SCALE * DY_SCALE, the plan's constant
    want8 = alpha * (dyq_rows.t() @ xq_rows)
    mag = alpha * (dyq_rows.abs().t() @ xq_rows.abs())
    bound = 2.0**-8 * want8.abs() + dy_rows.shape[0] * 2.0**-24 * mag  # fp8_bound's, bf16 dW
    rec["fp8_rounding_vs_f16_rel"] = float(
        (want8.cpu().numpy().reshape(f16.dw_shape) - want16).std() / want16.std()
    )  # what the recipe's quantization costs (not a kernel error)

    def ours(kind: str, xs: Any, dys: Any, dtype: Any) -> tuple[Any, Any]:
        launcher, op = _launcher(root, entry, kind)
        out = torch.full(f16.dw_shape, float("nan"), dtype=dtype, device="cuda")
        transient = torch.full((max(op.launch.transient, 1) // 2 + 1,), float("nan"), dtype=torch.float16,
                               device="cuda")  # fmt: skip
        ptrs = (xs.data_ptr(), dys.data_ptr(), out.data_ptr(), transient.data_ptr())
        stream = torch.cuda.current_stream().cuda_stream
        return out, lambda: launcher(ptrs, stream)

    # ours fp8
    out8, call8 = ours("fp8", xq, dyq, torch.bfloat16)
    call8()
    torch.cuda.synchronize()
    got = out8.double().reshape(k, c)
    err = (got - want8).abs()
    rec["fp8_nan"] = int(torch.isnan(got).sum())
    rec["fp8_err_over_bound"] = float((err / bound).max())
    rec["fp8_rel_err"] = float((got - want8).norm() / want8.norm())
    rec["fp8_correct"] = rec["fp8_nan"] == 0 and rec["fp8_err_over_bound"] <= 1.0
    rec["fp8_kernels"] = _kernel_times(call8)
    rec["fp8_us"] = sum(rec["fp8_kernels"].values())
    rec["fp8_copies_us"] = sum(v for n_, v in rec["fp8_kernels"].items() if "transpose" in n_ or "memcpy" in n_)
    rec["fp8_gemm_us"] = sum(v for n_, v in rec["fp8_kernels"].items() if "convbw_explicit" in n_)
    if "fp8k" in entry:  # the caller's K-major copies (the quantize step's, made here before the timing)
        xk = _fenced_fp8(xq.reshape(n, h, w, c).permute(3, 0, 1, 2))
        dyk = _fenced_fp8(dyq.reshape(n, ho, wo, k).permute(3, 0, 1, 2))
        outk, callk = ours("fp8k", xk, dyk, torch.bfloat16)
        callk()
        torch.cuda.synchronize()
        gotk = outk.double().reshape(k, c)
        rec["fp8k_nan"] = int(torch.isnan(gotk).sum())
        rec["fp8k_err_over_bound"] = float(((gotk - want8).abs() / bound).max())
        rec["fp8k_correct"] = rec["fp8k_nan"] == 0 and rec["fp8k_err_over_bound"] <= 1.0
        rec["fp8k_kernels"] = _kernel_times(callk)
        rec["fp8k_us"] = sum(rec["fp8k_kernels"].values())
    # ours f16 (the plan's sm_90a conv kernel)
    out16, call16 = ours("f16", x, dy, torch.float16)
    call16()
    torch.cuda.synchronize()
    try:
        rec["f16_max_error"] = assert_close(f16, out16.double().cpu().numpy(), want16, matrix_cores=True)
        rec["f16_correct"] = True
    except ToleranceError as e:
        rec["f16_correct"], rec["f16_error"] = False, str(e)
    rec["f16_kernels"] = _kernel_times(call16)
    rec["f16_us"] = sum(rec["f16_kernels"].values())
    # cuDNN f16 (torch's conv2d_weight on channels-last tensors)
    xt = x.reshape(n, h, w, c).permute(0, 3, 1, 2)
    dyt = dy.reshape(n, ho, wo, k).permute(0, 3, 1, 2)
    wshape = (k, c, 1, 1)

    def cudnn() -> Any:
        return torch.nn.grad.conv2d_weight(xt, wshape, dyt, stride=s)

    got16 = cudnn().permute(0, 2, 3, 1).reshape(f16.dw_shape)
    torch.cuda.synchronize()
    try:
        rec["cudnn_max_error"] = assert_close(f16, got16.double().cpu().numpy(), want16, matrix_cores=True)
        rec["cudnn_correct"] = True
    except ToleranceError as e:
        rec["cudnn_correct"], rec["cudnn_error"] = False, str(e)
    rec["cudnn_kernels"] = _kernel_times(cudnn)
    rec["cudnn_us"] = sum(rec["cudnn_kernels"].values())
    for key in ("fp8", "fp8k", "f16", "cudnn"):
        if f"{key}_us" in rec:
            rec[f"{key}_tflops"] = f16.flops / (rec[f"{key}_us"] * 1e-6) / 1e12
    return rec


def run_all(root: Path, out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    manifest = json.loads((root / "manifest.json").read_text())
    rows = []
    try:
        import cudnn  # noqa: F401 - cuDNN's frontend: its fp8 wgrad graph would be the fp8 rival

        rivals = "cudnn frontend python importable"
    except ImportError as e:
        rivals = f"cudnn frontend python not installed ({e})"
    for entry in manifest:
        got = run_child([sys.executable, __file__, "run-one", str(root), entry["name"]], 60, os.environ.copy())
        rec = (
            got.row
            if got.row is not None
            else {"name": entry["name"], "crashed": got.ended, "stderr": got.stderr[-3000:]}
        )
        print(json.dumps(rec), flush=True)
        rows.append(rec)
        (out / "results.json").write_text(json.dumps({"rivals": rivals, "rows": rows}, indent=1) + "\n")
    (out / "table.md").write_text(table(rows, rivals))
    print(table(rows, rivals))
    return 0 if all(r.get("fp8_correct") and r.get("fp8k_correct", True) for r in rows) else 1


def table(rows: list[dict], rivals: str) -> str:
    lines = ["| problem | GFLOP | fp8 plan (bn, splits) | fp8 err/bound | ours fp8 us (copies + GEMM) | "
             "ours fp8 K-major us | ours f16 us | cuDNN f16 us | K-major fp8 / our f16 | K-major fp8 / cuDNN f16 | "
             "whole fp8 op / our f16 |", "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        if "crashed" in r:
            lines.append(f"| {r['name']} | crashed ({r['crashed']}) |" + " |" * 9)
            continue
        t, split = r["fp8_plan"]["tile"], r["fp8_plan"].get("split", {}).get("k_batch", 1)
        ok = all(r.get(f"{key}_correct", True) for key in ("fp8", "fp8k", "f16", "cudnn"))
        bound = max(r["fp8_err_over_bound"], r.get("fp8k_err_over_bound", 0.0))
        kmaj = r.get("fp8k_us")
        cells = [f"{kmaj:.1f}", f"{r['f16_us'] / kmaj:.2f}x", f"{r['cudnn_us'] / kmaj:.2f}x"] if kmaj else ["-"] * 3
        lines.append(
            f"| {r['name']} | {r['gflop']:.1f} | {t['n']}, {split} | {bound:.3g}{'' if ok else ' (WRONG)'} | "
            f"{r['fp8_us']:.1f} ({r['fp8_copies_us']:.1f} + {r['fp8_gemm_us']:.1f}) | {cells[0]} | {r['f16_us']:.1f} | "
            f"{r['cudnn_us']:.1f} | {cells[1]} | {cells[2]} | {r['f16_us'] / r['fp8_us']:.2f}x |"
        )
    return "\n".join([*lines, "", f"cuDNN fp8: {rivals}"]) + "\n"


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
