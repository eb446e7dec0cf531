"""Issue 24's gate: our sm_90a GEMM (wgmma + TMA + mbarrier ring, warp-specialized;
convbw_mlir/kernels/gemm_sm90.py) against cuBLAS (torch.matmul) in one run, kernel time by CUPTI.

Compile here (needs the IREE compiler), run there (needs torch; the direct launch of
convbw_mlir.cuda_launch, no IREE runtime):

    .venv/bin/python bench/hopper_gemm.py compile DIR
    python3 hopper_gemm.py run DIR --out OUT      # on the GPU machine, one process per contender

``compile`` builds each variant's module, compiles it for ``sm_90a`` to IREE's ``hal`` phase and writes
the kernel's PTX and its export (block, dynamic shared memory) to ``DIR``. ``run`` starts one child per
contender: it encodes the two tensor maps (``cuTensorMapEncodeTiled``, 128-byte swizzle) for its A and
B, poisons C with NaN, launches, checks every element against a float64 product of the same inputs
(fresh random inputs per contender), then times ``single`` (median of calls separated by a pause) and
``sustained`` (back to back) kernel time. Writes ``OUT/hopper_gemm.json`` and ``.md``.
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

from convbw_mlir.measure.children import run_child

SINGLE_REPS = 10
SUSTAINED_CALLS = 100
GATE_TFLOPS = 620.0
CHILD_SECONDS = 60

# name: (m, n, k, dtype, out, tiling fields)
VARIANTS: dict[str, tuple] = {
    "check_ws128x256_s4_256x512x1024": (256, 512, 1024, "f16", "f32", {}),
    "check_ws128x256_s4_p3_512x768x512": (512, 768, 512, "f16", "f32", {"persistent": 3}),
    "check_ws128x256_s4_c2_p4_512x512x1024": (512, 512, 1024, "f16", "f32", {"cluster": 2, "persistent": 4}),
    "ws128x256_s4_f16": (4096, 4096, 4096, "f16", "f16", {}),
    "ws128x256_s4_f16_c2_p132": (4096, 4096, 4096, "f16", "f16", {"cluster": 2, "persistent": 132}),
    "ws128x256_s4_f16_c2": (4096, 4096, 4096, "f16", "f16", {"cluster": 2}),
    # fewer clusters than SM pairs: a GPC with an odd count of free SMs cannot hold a pair, and a persistent
    # cluster that does not fit waits a whole wave
    "ws128x256_s4_f16_c2_p128": (4096, 4096, 4096, "f16", "f16", {"cluster": 2, "persistent": 128}),
    "ws128x256_s4_f16_p132": (4096, 4096, 4096, "f16", "f16", {"persistent": 132}),
    "ws128x256_s4_f32_p132": (4096, 4096, 4096, "f16", "f32", {"persistent": 132}),
    "ws128x256_s4_f16_nomaxnreg": (4096, 4096, 4096, "f16", "f16", {"producer_regs": 0, "consumer_regs": 0}),
    "ws128x128_s6_f16_p132": (4096, 4096, 4096, "f16", "f16", {"bn": 128, "stages": 6, "persistent": 132}),
    "ws64x256_s4_f16": (4096, 4096, 4096, "f16", "f16", {"consumers": 1}),
    "ws128x256_s3_f16_p132": (4096, 4096, 4096, "f16", "f16", {"stages": 3, "persistent": 132}),
    "ws128x256_s4_bf16_p132": (4096, 4096, 4096, "bf16", "bf16", {"persistent": 132}),
}
TORCH = {"cublas_f16": (4096, 4096, 4096, "f16"), "cublas_bf16": (4096, 4096, 4096, "bf16")}


# -- compile side ------------------------------------------------------------------------------------
def compile_variant(name: str, folder: Path, spec: tuple | None = None) -> dict[str, Any]:
    """The variant's PTX (``DIR/<name>.ptx``) and its manifest entry (``spec``: a ``VARIANTS`` value,
    optionally with B's dtype last; the variant's own if None)."""
    from convbw_mlir.build.cuda_schedule import read_cuda_executable
    from convbw_mlir.build.iree import compile_module
    from convbw_mlir.ir_imports import ir, new_context
    from convbw_mlir.kernels.gemm_sm90 import Sm90Tiling, gemm_entry, gemm_module

    m, n, k, dtype, out, fields, *rest = spec or VARIANTS[name]
    dtype_b = rest[0] if rest else dtype
    t = Sm90Tiling(**fields)
    with new_context(), ir.Location.unknown():
        module = gemm_module(m, n, k, t, dtype, out, dtype_b)
        entry = gemm_entry(m, n, k, t, ir.Type.parse(dtype), ir.Type.parse(out), ir.Type.parse(dtype_b))
        text = str(module)
    hal = compile_module(text, "sm_90a", ["--compile-to=hal"])
    with new_context() as ctx:
        parsed = ir.Module.parse(hal, ctx)
        binaries = [o for o in _walk(parsed.operation) if o.name == "hal.executable.binary"]
        data = bytes(memoryview(ir.DenseIntElementsAttr(binaries[0].attributes["data"])).cast("B"))
    (export,), (ptx,) = read_cuda_executable(data)
    (folder / f"{name}.ptx").write_bytes(ptx)
    return {"name": name, "kind": "ours", "m": m, "n": n, "k": k, "dtype": dtype, "dtype_b": dtype_b, "out": out,
            "tiling": {**vars(t), "bm": t.bm}, "kernel": export.name, "grid": list(entry.grid),
            "block": list(export.block), "shared": export.shared_memory, "flops": 2 * m * n * k}  # fmt: skip


def _walk(op: Any):
    yield op
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                yield from _walk(inner.operation)


def compile_all(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    entries = []
    for name in VARIANTS:
        t0 = time.time()
        entries.append(compile_variant(name, folder))
        print(f"{name}: {time.time() - t0:.1f} s", flush=True)
    for name, (m, n, k, dtype) in TORCH.items():
        entries.append({"name": name, "kind": "torch", "m": m, "n": n, "k": k, "dtype": dtype, "out": dtype,
                        "flops": 2 * m * n * k})  # fmt: skip
    (folder / "manifest.json").write_text(json.dumps({"entries": entries}, indent=1) + "\n")


# -- run side ----------------------------------------------------------------------------------------
def _encode_maps(lib: Any, a: Any, b: Any, e: dict) -> bytes:
    """A's and B's CUtensorMap by the product's encoder (``cuda_launch.encode_tensor_map``): 2-D {K, rows}, box
    {one 128-byte row: 64 16-bit or 128 8-bit elements, bm | bn}, 128-byte swizzle, L2 promotion 256 B; 256
    bytes, A's first."""
    from convbw_mlir.cuda_launch import TensorMap, encode_tensor_map

    # CU_TENSOR_MAP_DATA_TYPE_FLOAT16 / _BFLOAT16 / _UINT8 (fp8: TMA moves bytes)
    dtype, size = {"f16": (6, 2), "bf16": (9, 2), "f8E4M3FN": (0, 1), "f8E5M2": (0, 1)}[e["dtype"]]
    half = e["tiling"]["cluster"]  # in a cluster each workgroup loads 1/cluster of B (multicast)
    operands = ((a, e["m"], e["tiling"]["bm"]), (b, e["n"], e["tiling"]["bn"] // half))
    out = b""
    for slot, (tensor, rows, box) in enumerate(operands):
        m = TensorMap(kernel=e.get("kernel", "gemm_sm90"), binding=slot, maps_binding=2, slot=slot, mode="tiled",
                      dtype=dtype, dims=(e["k"], rows), strides=(e["k"] * size,), box=(128 // size, box),
                      element_strides=(1, 1))  # fmt: skip
        out += encode_tensor_map(lib, m, tensor.data_ptr())
    return out


def run_one(folder: Path, name: str) -> dict[str, Any]:
    import torch

    from convbw_mlir.cuda_launch import CudaLauncher, Dispatch, ExportDef, Launch, _libcuda
    from convbw_mlir.measure.cupti import kernel_events

    e = next(x for x in json.loads((folder / "manifest.json").read_text())["entries"] if x["name"] == name)
    dt = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}
    torch.manual_seed(hash(name) % 2**31)  # fresh inputs per contender
    a = torch.randn(e["m"], e["k"], device="cuda").to(dt[e["dtype"]])
    b = torch.randn(e["n"], e["k"], device="cuda").to(dt[e["dtype"]])
    for x in (a, b):  # NaN fence on the inputs: a NaN would poison the check
        assert not torch.isnan(x).any()
    c = torch.full((e["m"], e["n"]), float("nan"), device="cuda", dtype=dt[e["out"]])
    rec: dict[str, Any] = {"name": name, "kind": e["kind"], "flops": e["flops"], "tiling": e.get("tiling")}
    if e["kind"] == "torch":

        def call() -> None:
            torch.matmul(a, b.t(), out=c)
    else:
        lib = _libcuda()
        maps = torch.frombuffer(bytearray(_encode_maps(lib, a, b, e)), dtype=torch.uint8).cuda()
        export = ExportDef(e["kernel"], 0, tuple(e["block"]), e["shared"], 0, 4)
        binds = tuple((f"arg{i}", 0) for i in range(4))
        launch = Launch("main", [Dispatch(e["kernel"], tuple(e["grid"]), binds)], 0, (0, 0, 0, 0),
                        {e["kernel"]: export}, [(folder / f"{name}.ptx").read_bytes()])  # fmt: skip
        launcher = CudaLauncher(launch, torch.cuda.current_device())
        ptrs = (a.data_ptr(), b.data_ptr(), maps.data_ptr(), c.data_ptr())
        rec["shared"] = e["shared"]

        def call() -> None:
            launcher(ptrs, torch.cuda.current_stream().cuda_stream)

    call()
    torch.cuda.synchronize()
    ref = a.double() @ b.double().t()
    got = c.double()
    rec["unwritten_or_nan"] = int(torch.isnan(got).sum())
    rec["rel_err"] = float((got - ref).norm() / ref.norm())
    tol = {"f32": 1e-5, "f16": 1e-3, "bf16": 8e-3}[e["out"]]
    rec["correct"] = rec["unwritten_or_nan"] == 0 and rec["rel_err"] < tol
    del ref, got
    if e["m"] * e["n"] * e["k"] < 2**30:  # numerics-only problems
        return rec
    for _ in range(10):
        call()
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CUDA]
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "single.json"
        with torch.profiler.profile(activities=acts) as prof:
            for _ in range(SINGLE_REPS):
                call()
                torch.cuda.synchronize()
                time.sleep(0.02)
        prof.export_chrome_trace(str(trace))
        single = [d for _, d, _ in kernel_events(trace)]
        trace = Path(tmp) / "sustained.json"
        with torch.profiler.profile(activities=acts) as prof:
            for _ in range(SUSTAINED_CALLS):
                call()
            torch.cuda.synchronize()
        prof.export_chrome_trace(str(trace))
        sustained = kernel_events(trace)
    rec["kernel_names"] = sorted({n for _, _, n in sustained})[:3]
    rec["single_us"] = statistics.median(single)
    rec["sustained_us"] = statistics.median(d for _, d, _ in sustained)
    for key in ("single", "sustained"):
        rec[f"{key}_tflops"] = e["flops"] / (rec[f"{key}_us"] * 1e-6) / 1e12
    # the result once more after the timed calls: a race shows as a moving error
    c.fill_(float("nan"))
    call()
    torch.cuda.synchronize()
    again = c.double()
    rec["rel_err_after"] = float((again - a.double() @ b.double().t()).norm() / (a.double() @ b.double().t()).norm())
    rec["correct"] = rec["correct"] and not torch.isnan(again).any().item() and rec["rel_err_after"] < tol
    return rec


def run_all(folder: Path, out: Path, only: list[str] | None) -> int:
    import torch

    out.mkdir(parents=True, exist_ok=True)
    entries = json.loads((folder / "manifest.json").read_text())["entries"]
    rows = []
    for e in entries:
        if only and not any(o in e["name"] for o in only):
            continue
        # a kernel that hangs (an mbarrier never completing) costs one child, not the run
        got = run_child([sys.executable, __file__, "run-one", str(folder), e["name"]], CHILD_SECONDS)
        if got.returncode is None:
            row = {"name": e["name"], "crashed": f"timed out after {CHILD_SECONDS} s (a hang?)"}
        else:
            row = got.row if got.row is not None else {"name": e["name"], "crashed": got.stderr[-800:]}
        rows.append(row)
        print(json.dumps(row), flush=True)
    device = torch.cuda.get_device_name(0)
    doc = {"device": device, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rows": rows}
    (out / "hopper_gemm.json").write_text(json.dumps(doc, indent=1) + "\n")
    head = "| contender | correct | rel err | single us | TFLOP/s | sustained us | TFLOP/s |"
    lines = [f"# sm_90a GEMM (issue 24 gate): {device}, {doc['date']}", "", head, "|---|---|---|---|---|---|---|"]
    for r in rows:
        ok = "crashed" if "crashed" in r else ("yes" if r.get("correct") else "WRONG")
        cells = [f"{r[k]:.3g}" if isinstance(r.get(k), float) else "-" for k in ("rel_err",)]
        cells += [f"{r[k]:.1f}" if r.get(k) else "-" for k in ("single_us", "single_tflops", "sustained_us",
                                                                 "sustained_tflops")]  # fmt: skip
        lines.append(f"| {r['name']} | {ok} | " + " | ".join(cells) + " |")
    lines += ["", _verdict(rows)]
    (out / "hopper_gemm.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def _verdict(rows: list[dict]) -> str:
    """The gate's line: our best correct 4096^3 f16-in kernel (single-call kernel time) against 620 TFLOP/s
    and against cuBLAS f16 of the same run."""
    ours = [r for r in rows if r.get("kind") == "ours" and r.get("correct") and r.get("single_tflops")
            and "bf16" not in r["name"] and not r["name"].startswith("check_")]  # fmt: skip
    cublas = next((r for r in rows if r["name"] == "cublas_f16" and r.get("single_tflops")), None)
    if not ours:
        return f"Gate (>= {GATE_TFLOPS} TFLOP/s on 4096^3 f16, correct): no correct kernel of ours timed."
    best = max(ours, key=lambda r: r["single_tflops"])
    ratio = f", {best['single_tflops'] / cublas['single_tflops']:.2f}x cuBLAS f16" if cublas else ""
    met = "MET" if best["single_tflops"] >= GATE_TFLOPS else "NOT met"
    return (f"Gate (>= {GATE_TFLOPS} TFLOP/s on 4096^3 f16, correct, kernel time): {met}: best {best['name']} "
            f"{best['single_tflops']:.1f} TFLOP/s{ratio}.")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compile")
    c.add_argument("dir", type=Path)
    r = sub.add_parser("run")
    r.add_argument("dir", type=Path)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--only", nargs="*")
    o = sub.add_parser("run-one")
    o.add_argument("dir", type=Path)
    o.add_argument("name")
    a = ap.parse_args(argv)
    if a.cmd == "compile":
        compile_all(a.dir)
        return 0
    if a.cmd == "run":
        return run_all(a.dir, a.out, a.only)
    print(json.dumps(run_one(a.dir, a.name)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
