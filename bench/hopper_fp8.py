"""Issue 24 item 4: our sm_90a GEMM with fp8 operands (convbw_mlir/kernels/gemm_sm90.py) against our f16
kernel, cuBLAS (torch._scaled_mm for fp8, torch.matmul for f16) and cuDNN's f16 weight gradient, in one
run, kernel time by CUPTI.

Problems: the 4096^3 GEMM, and a 1x1 weight gradient as the TN GEMM an fp8 recipe gives (ResNet-50's 1x1
1024 -> 256 at N = 256, 14 x 14: dW[256, 1024] = dy^T x over R = 50176 rows; A = dy^T e5m2 and B = x^T
e4m3, the transposed copies the quantize step writes). fp8 inputs are quantized per tensor as the
recipes do (scale = amax / the type's largest value); the kernel gets the two scales.

    .venv/bin/python bench/hopper_fp8.py compile DIR
    python3 hopper_fp8.py run DIR --out OUT      # on the GPU machine (needs hopper_gemm.py beside it)

``run`` takes every contender in one process (the device minutes of this step were few), each with
fresh inputs, NaN fences on them, C poisoned with NaN (zeroed for split-K, whose partials add into it),
a check against float64 on the same (fp8-rounded) inputs with the bound of docs/explicit-kernels.md
"fp8", then the kernel time of a call (all its kernels, the split-K zeroing included) over back-to-back
calls. Writes ``OUT/hopper_fp8.json`` and ``.md`` after each contender.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hopper_gemm  # noqa: E402 - the sibling script: compile step, tensor maps

CALLS = 30
E4, E5 = "f8E4M3FN", "f8E5M2"
G = (4096, 4096, 4096)
W = (256, 1024, 50176)  # dW[K, C] over R = N H W: ResNet-50 1x1 1024 -> 256, N = 256, 14 x 14
P132 = {"persistent": 132}
FP8 = {"elem_bytes": 1}

# name: (m, n, k, A dtype, out, tiling fields, B dtype)
VARIANTS: dict[str, tuple] = {
    "check_fp8_e4m3_e5m2_256x512x1024": (256, 512, 1024, E4, "bf16", FP8, E5),
    "check_fp8_split4_256x512x2048": (256, 512, 2048, E5, "f32", {**FP8, "splits": 4}, E4),
    "gemm_f16_ours": (*G, "f16", "f16", P132, "f16"),
    "gemm_fp8_e4m3_e5m2_bf16": (*G, E4, "bf16", {**FP8, **P132}, E5),
    "gemm_fp8_e4m3_e4m3_bf16": (*G, E4, "bf16", {**FP8, **P132}, E4),
    "gemm_fp8_e4m3_e5m2_f32": (*G, E4, "f32", {**FP8, **P132}, E5),
    # promotion (full f32 accumulation: each k tile's partial added on the CUDA cores), and its tile without it
    "gemm_fp8_e4m3_e5m2_bf16_bn128_s6": (*G, E4, "bf16", {**FP8, "bn": 128, "stages": 6, **P132}, E5),
    "gemm_fp8_e4m3_e5m2_bf16_promote_bn128_s6": (
        *G,
        E4,
        "bf16",
        {**FP8, "bn": 128, "stages": 6, "promote": True, **P132},
        E5,
    ),  # fmt: skip
    "wgrad_f16_ours_s16": (*W, "f16", "f32", {"splits": 16}, "f16"),
    "wgrad_fp8_ours_s14": (*W, E5, "f32", {**FP8, "splits": 14}, E4),
    "wgrad_fp8_ours_bn128_s8": (*W, E5, "f32", {**FP8, "bn": 128, "splits": 8}, E4),
    "wgrad_fp8_ours_bn128_s8_promote": (*W, E5, "f32", {**FP8, "bn": 128, "splits": 8, "promote": True}, E4),
}
# name: (m, n, k, A dtype, out, B dtype): cuBLAS through torch, and cuDNN's wgrad of the same 1x1 conv
TORCH = {
    "gemm_cublas_f16": (*G, "f16", "f16", "f16"),
    "gemm_cublas_fp8_e4m3_e5m2_bf16": (*G, E4, "bf16", E5),
    "wgrad_cublas_f16": (*W, "f16", "f16", "f16"),
    "wgrad_cublas_fp8_bf16": (*W, E5, "bf16", E4),
    "wgrad_cudnn_f16": (*W, "f16", "f16", "f16"),
}
BF16_ROUNDING = 2.0**-8  # dW's own rounding to bf16, relative
F32_UNIT = 2.0**-24


def compile_all(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    entries = []
    for name, spec in VARIANTS.items():
        t0 = time.time()
        entries.append(hopper_gemm.compile_variant(name, folder, spec))
        print(f"{name}: {time.time() - t0:.1f} s", flush=True)
    for name, (m, n, k, dtype, out, dtype_b) in TORCH.items():
        entries.append({"name": name, "kind": "torch", "m": m, "n": n, "k": k, "dtype": dtype, "dtype_b": dtype_b,
                        "out": out, "flops": 2 * m * n * k})  # fmt: skip
    # ours and theirs of one problem together, the gate's pair first: a cut-short run keeps what matters
    entries.sort(key=lambda e: (not e["name"].startswith("check_"), e["name"].split("_")[0] != "gemm",
                                "f16" not in e["name"].split("_")[1:3] and e["kind"] == "ours"))  # fmt: skip
    (folder / "manifest.json").write_text(json.dumps({"entries": entries}, indent=1) + "\n")


def _inputs(e: dict) -> dict[str, Any]:
    """A [m, k], B [n, k] as the kernel reads them, their scales, the f16 originals (the cost of fp8)."""
    import torch

    types = {"f16": torch.float16, "bf16": torch.bfloat16, E4: torch.float8_e4m3fn, E5: torch.float8_e5m2}
    largest = {E4: 448.0, E5: 57344.0}
    out: dict[str, Any] = {}
    for key, rows, dtype in (("a", e["m"], e["dtype"]), ("b", e["n"], e["dtype_b"])):
        x = torch.randn(rows, e["k"], device="cuda", dtype=torch.float16)
        assert not torch.isnan(x).any()  # NaN fence
        if dtype in largest:  # per-tensor scaling, as Transformer Engine's recipes
            scale = float(x.abs().max()) / largest[dtype]
            q = (x.float() / scale).to(types[dtype])
            assert not torch.isnan(q.float()).any()  # NaN fence after the cast
        else:
            scale, q = 1.0, x.to(types[dtype])
        out[key], out[f"{key}_scale"], out[f"{key}_f16"] = q, scale, x
    return out


def _check(c: Any, x: dict, e: dict) -> dict[str, Any]:
    """Against float64 on the same (fp8-rounded) inputs: per element ``|c - ref| <= rounding(out) |ref| +
    K 2^-24 (|A| |B|^T) s`` (docs/explicit-kernels.md "fp8"); also what the fp8 rounding of the inputs
    costs against the f16 inputs' product (not a kernel error)."""
    s = x["a_scale"] * x["b_scale"]
    a, b = x["a"].double(), x["b"].double()
    ref = s * (a @ b.t())
    mag = s * (a.abs() @ b.abs().t())
    got = c.double()
    err = (got - ref).abs()
    rounding = {"f32": F32_UNIT, "bf16": BF16_ROUNDING, "f16": 2.0**-11}[e["out"]]
    bound = rounding * ref.abs() + e["k"] * F32_UNIT * mag
    exact = x["a_f16"].double() @ x["b_f16"].double().t()
    return {
        "nan": int(got.isnan().sum()),
        "rel_err": float((got - ref).norm() / ref.norm()),
        "max_err_over_bound": float((err / bound).max()),
        "acc_err_over_abs_product": float(((err - rounding * ref.abs()).clamp(min=0) / mag).max()),
        "fp8_rounding_vs_f16_rel": float((ref - exact).norm() / exact.norm()),
        "result_vs_f16_rel": float((got - exact).norm() / exact.norm()),
    }


def _call(e: dict, x: dict, c: Any, folder: Path):
    """The contender's call, returning its result (torch's own output tensors: no copy in the timed call)."""
    import torch

    if e["kind"] == "torch" and e["name"].startswith("wgrad_cudnn"):
        # cuDNN's weight gradient of the 1x1 conv: dy [N, K, 14, 14] and x [N, C, 14, 14] channels-last
        n_img, hw = e["k"] // 196, 14
        dy = x["a"].t().contiguous().reshape(n_img, hw, hw, e["m"]).permute(0, 3, 1, 2)
        xx = x["b"].t().contiguous().reshape(n_img, hw, hw, e["n"]).permute(0, 3, 1, 2)
        w = torch.empty(e["m"], e["n"], 1, 1, device="cuda", dtype=torch.float16)

        def run() -> Any:
            gw = torch.ops.aten.convolution_backward(dy, xx, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1,
                                                     [False, True, False])[1]  # fmt: skip
            return gw.view(e["m"], e["n"])

        return run
    if e["kind"] == "torch" and e["dtype"] in (E4, E5):
        sa = torch.tensor(x["a_scale"], device="cuda")
        sb = torch.tensor(x["b_scale"], device="cuda")
        return lambda: torch._scaled_mm(x["a"], x["b"].t(), scale_a=sa, scale_b=sb, out_dtype=c.dtype)
    if e["kind"] == "torch":
        return lambda: torch.matmul(x["a"], x["b"].t(), out=c)
    from convbw_mlir.cuda_launch import CudaLauncher, Dispatch, ExportDef, Launch, _libcuda

    maps = torch.frombuffer(bytearray(hopper_gemm._encode_maps(_libcuda(), x["a"], x["b"], e)), dtype=torch.uint8)
    x["maps"] = maps.cuda()
    ptrs = [x["a"].data_ptr(), x["b"].data_ptr(), x["maps"].data_ptr()]
    if e["dtype"] in (E4, E5):
        x["scales"] = torch.tensor([x["a_scale"], x["b_scale"]], device="cuda", dtype=torch.float32)
        ptrs.append(x["scales"].data_ptr())
    ptrs.append(c.data_ptr())
    export = ExportDef(e["kernel"], 0, tuple(e["block"]), e["shared"], 0, len(ptrs))
    binds = tuple((f"arg{i}", 0) for i in range(len(ptrs)))
    launch = Launch("main", [Dispatch(e["kernel"], tuple(e["grid"]), binds)], 0, (0,) * len(ptrs),
                    {e["kernel"]: export}, [(folder / f"{e['name']}.ptx").read_bytes()])  # fmt: skip
    launcher = CudaLauncher(launch, torch.cuda.current_device())
    split = e["tiling"]["splits"] > 1

    def run() -> Any:
        if split:  # split-K adds its partials into C
            c.zero_()
        launcher(tuple(ptrs), torch.cuda.current_stream().cuda_stream)
        return c

    return run


def run_one(folder: Path, e: dict) -> dict[str, Any]:
    import torch

    from convbw_mlir.measure.cupti import kernel_events

    torch.manual_seed(hash(e["name"]) % 2**31)
    x = _inputs(e)
    dt = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}
    c = torch.full((e["m"], e["n"]), float("nan"), device="cuda", dtype=dt[e["out"]])
    rec: dict[str, Any] = {"name": e["name"], "kind": e["kind"], "flops": e["flops"], "tiling": e.get("tiling"),
                           "types": f"{e['dtype']} x {e['dtype_b']} -> {e['out']}"}  # fmt: skip
    call = _call(e, x, c, folder)
    result = call()
    torch.cuda.synchronize()
    rec.update(_check(result, x, e))
    del result
    rec["correct"] = rec["nan"] == 0 and rec["max_err_over_bound"] <= 1.0
    if e["name"].startswith("check_"):
        return rec
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
    rec["kernel_names"] = sorted({n[:60] for _, _, n in events})[:4]
    rec["us"] = sum(d for _, d, _ in events) / CALLS
    rec["largest_kernel_us"] = statistics.median(sorted(d for _, d, _ in events)[-CALLS:])
    rec["tflops"] = e["flops"] / (rec["us"] * 1e-6) / 1e12
    return rec


def run_all(folder: Path, out: Path, only: list[str] | None) -> int:
    import torch

    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for e in json.loads((folder / "manifest.json").read_text())["entries"]:
        if only and not any(o in e["name"] for o in only):
            continue
        try:
            row = run_one(folder, e)
        except Exception as exc:  # one contender's failure is a row, not the end of the run
            row = {"name": e["name"], "crashed": f"{type(exc).__name__}: {str(exc)[:300]}"}
        torch.cuda.empty_cache()
        rows.append(row)
        print(json.dumps(row), flush=True)
        _write(out, rows, torch.cuda.get_device_name(0))
    return 0


def _write(out: Path, rows: list[dict], device: str) -> None:
    doc = {"device": device, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rows": rows}
    (out / "hopper_fp8.json").write_text(json.dumps(doc, indent=1) + "\n")
    lines = [f"# fp8 on the sm_90a GEMM (issue 24 item 4): {device}, {doc['date']}", "",
             "| contender | types | correct | err / bound | rel err | fp8 rounding vs f16 | us | TFLOP/s |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        ok = "crashed" if "crashed" in r else ("yes" if r.get("correct") else "WRONG")
        cells = [f"{r[k]:.3g}" if isinstance(r.get(k), float) else "-"
                 for k in ("max_err_over_bound", "rel_err", "fp8_rounding_vs_f16_rel")]  # fmt: skip
        cells += [f"{r[k]:.1f}" if r.get(k) else "-" for k in ("us", "tflops")]
        lines.append(f"| {r['name']} | {r.get('types', '-')} | {ok} | " + " | ".join(cells) + " |")
    lines += ["", *verdict(rows)]
    (out / "hopper_fp8.md").write_text("\n".join(lines) + "\n")


def verdict(rows: list[dict]) -> list[str]:
    """The goal's lines: our best correct fp8 kernel of each problem against our f16 kernel of it (>= 1.6x)."""
    out = []
    for prob in ("gemm", "wgrad"):
        ours = [r for r in rows if r["name"].startswith(f"{prob}_") and r.get("kind") == "ours" and r.get("correct")
                and r.get("tflops")]  # fmt: skip
        fp8 = [r for r in ours if "fp8" in r["name"]]
        f16 = [r for r in ours if "fp8" not in r["name"]]  # by name: "bf16" (an fp8 kernel's out) holds "f16"
        if not fp8 or not f16:
            out.append(f"{prob}: no correct fp8 and f16 kernel of ours timed.")
            continue
        best, base = max(fp8, key=lambda r: r["tflops"]), max(f16, key=lambda r: r["tflops"])
        ratio = best["tflops"] / base["tflops"]
        met = "MET" if ratio >= 1.6 else "NOT met"
        out.append(f"{prob}: fp8 >= 1.6x our f16: {met}: {best['name']} {best['tflops']:.1f} TFLOP/s, "
                   f"{ratio:.2f}x {base['name']} {base['tflops']:.1f}.")  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compile")
    c.add_argument("dir", type=Path)
    r = sub.add_parser("run")
    r.add_argument("dir", type=Path)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--only", nargs="*")
    a = ap.parse_args(argv)
    if a.cmd == "compile":
        compile_all(a.dir)
        return 0
    return run_all(a.dir, a.out, a.only)


if __name__ == "__main__":
    sys.exit(main())
