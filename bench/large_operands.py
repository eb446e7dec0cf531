"""Problems whose x or dy crosses 2 GiB and 4 GiB: compile here, run and check on a GPU machine.

CK tests its weight-gradient kernels on images over 2 GB because 32-bit offsets wrap there; IREE 3.13
addresses every buffer of this path with 64 bits (docs/limits.md). This script checks that on a GPU:

    python3 bench/large_operands.py --compile-only --out DIR     # here: one saved CompiledOp per case
    python3 bench/large_operands.py --run DIR                    # there: needs iree-base-runtime + numpy

``--run`` draws x and dy (seeded), runs each kernel once, and compares sampled dW entries (the first,
the last and random ones) with float64 computed on the host for those entries only
(:func:`convbw_mlir.reference.sample_reference`, a dot product over the reduction each). It prints one
line per case and writes ``DIR/results.json``; the exit code is 1 if any case is wrong or fails.
``--tiny`` builds the same cases a thousand times smaller (for a CPU run of the script itself).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import traceback
from pathlib import Path

try:
    import convbw_mlir  # noqa: F401
except ImportError:  # run as a plain script from a checkout: the package is beside bench/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from convbw_mlir.problem import DTYPES, ConvBwdWeightProblem
from convbw_mlir.reference import sample_indices, sample_reference, tolerance


def cases(tiny: bool = False) -> dict[str, ConvBwdWeightProblem]:
    """The problems, by name: x or dy just under 2 GiB, just over 2 GiB, over 4 GiB (f16, NHWGC).

    The convolutions pad their input (the lowering materialises x with its pads, one more large
    buffer); ``gemm_x_over_4g`` is a 1x1 (the explicit-GEMM path); ``dy_over_4g`` has a small x.
    """
    s = 1 if not tiny else 32  # tiny: spatial sizes / 32, so about a thousand times fewer elements

    def conv(n: int, c: int, k: int, hw: int, f: int = 3, pad: int = 1) -> ConvBwdWeightProblem:
        return ConvBwdWeightProblem(1, n, c, k, (hw // s, hw // s), (f, f), pad_low=pad, pad_high=pad)

    return {
        "x_under_2g": conv(8, 64, 64, 1448),  # x 2,147,024,896 B: under 2**31 - 1
        "x_over_2g": conv(8, 64, 64, 1450),  # x 2,152,960,000 B
        "x_over_4g": conv(16, 64, 64, 1450),  # x 4,305,920,000 B
        "gemm_x_over_4g": conv(16, 64, 64, 1450, f=1, pad=0),
        "dy_over_4g": conv(4, 16, 256, 1450),  # x 269 MB, dy 4,305,920,000 B
    }


def compile_all(out: Path, target: str, tiny: bool, only: str) -> None:
    from convbw_mlir import compile_op

    for name, p in cases(tiny).items():
        if only not in name:
            continue
        t0 = time.perf_counter()
        op = compile_op(p, target)
        op.save(out / name)
        sizes = ", ".join(f"{t} {math.prod(p.shape(t)) * DTYPES[p.dtype]:,} B" for t in ("x", "dy"))
        print(f"{name}: {p.to_ck()} ({sizes}) compiled for {target} in {time.perf_counter() - t0:.1f} s")
    (out / "cases.json").write_text(json.dumps({"target": target, "tiny": tiny}) + "\n")


def tail_inputs(p: ConvBwdWeightProblem, seed: int) -> tuple[np.ndarray, np.ndarray, int]:
    """x and dy that are zero except in the images whose bytes, in the larger of the two, reach past the
    last 2 GiB or 4 GiB boundary it crosses; those images random. dW then comes from those images alone:
    a kernel whose offsets wrap at the boundary reads zeros there instead and gets dW wrong by its whole
    size, far beyond any rounding. Returns x, dy and the first such image."""
    elem = DTYPES[p.dtype]
    big = "x" if math.prod(p.x_shape) >= math.prod(p.dy_shape) else "dy"
    total = math.prod(p.shape(big)) * elem
    boundary = 2**32 if total > 2**32 else 2**31
    first = min(boundary // (total // p.batch), p.batch - 1)
    rng = np.random.default_rng(seed)
    arrays = []
    for t in ("x", "dy"):
        a = np.zeros(p.shape(t), dtype=np.float16)  # calloc: untouched pages cost nothing
        n_axis = p.dims(t).index("N")
        tail = [slice(None)] * a.ndim
        tail[n_axis] = slice(first, None)
        a[tuple(tail)] = rng.standard_normal(a[tuple(tail)].shape, dtype=np.float32)
        arrays.append(a)
    return arrays[0], arrays[1], first


def run_case(path: Path, samples: int, seed: int, device: int | None, tail: bool = False) -> dict:
    """Run one saved case and check ``samples`` dW entries against float64; the result as a dict."""
    from convbw_mlir.build.artifact import CompiledOp
    from convbw_mlir.reference import random_inputs

    op = CompiledOp.load(path)
    p = op.problem
    row: dict = {"case": path.name, "problem": p.to_ck(), "target": op.target, "x_bytes": 0, "dy_bytes": 0}
    t0 = time.perf_counter()
    if tail:
        x, dy, row["first_nonzero_image"] = tail_inputs(p, seed)
    else:
        x, dy = random_inputs(p, seed)
    row.update(x_bytes=x.nbytes, dy_bytes=dy.nbytes, inputs_s=round(time.perf_counter() - t0, 2))
    t0 = time.perf_counter()
    dw = op.run(x, dy, device=device)
    row["run_s"] = round(time.perf_counter() - t0, 2)
    idx = sample_indices(p, samples, seed)
    t0 = time.perf_counter()
    want = sample_reference(p, x, dy, idx)
    row["reference_s"] = round(time.perf_counter() - t0, 2)
    got = dw[tuple(idx.T)].astype(np.float64)
    # the error measure of reference.assert_close, scaled by the RMS of the sampled entries
    scale = float(np.sqrt(np.mean(want**2))) or 1.0
    err = np.abs(got - want) / (np.abs(want) + scale)
    worst = int(np.nanargmax(np.where(np.isfinite(err), err, np.inf)))
    rtol, _ = tolerance(p, matrix_cores=op.target != "host")  # GPU kernels may accumulate in matrix instructions
    row.update(
        samples=len(idx),
        max_error=float(err[worst]) if np.isfinite(err[worst]) else "non-finite",
        tolerance=rtol,
        worst_index=[int(i) for i in idx[worst]],
        got=float(got[worst]),
        want=float(want[worst]),
        ok=bool(np.isfinite(err).all() and err.max() <= rtol),
    )
    return row


def run_all(art: Path, samples: int, seed: int, device: int | None, only: str, tail: bool = False) -> int:
    rows = []
    names = only.split(",")
    for path in sorted(d for d in art.iterdir() if (d / "op.json").is_file() and any(n in d.name for n in names)):
        try:
            row = run_case(path, samples, seed, device, tail)
        except Exception as e:  # one failing case (device fault, memory) must not hide the others
            row = {"case": path.name, "ok": False, "error": f"{type(e).__name__}: {e}"}
            traceback.print_exc(file=sys.stderr)
        rows.append(row)
        if "error" in row:
            print(f"{row['case']}: FAILED {row['error']}")
        else:
            verdict = "PASS" if row["ok"] else "WRONG"
            print(
                f"{row['case']}: x {row['x_bytes']:,} B, dy {row['dy_bytes']:,} B: "
                f"max error {row['max_error']} over {row['samples']} samples (tolerance {row['tolerance']:.3g}) "
                f"{verdict}; run {row['run_s']} s, inputs {row['inputs_s']} s, reference {row['reference_s']} s"
            )
        (art / "results.json").write_text(
            json.dumps(rows, indent=1) + "\n"
        )  # after each case: a timeout keeps the rest
    return 0 if rows and all(r["ok"] for r in rows) else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--compile-only", action="store_true", help="compile the cases into --out")
    mode.add_argument("--run", metavar="DIR", type=Path, help="run and check the cases saved in DIR")
    ap.add_argument("--out", type=Path, help="artifact folder for --compile-only")
    ap.add_argument("--target", default="sm_80", help="compile target (default sm_80)")
    ap.add_argument("--tiny", action="store_true", help="the same cases with spatial sizes / 32")
    ap.add_argument("--filter", default="", help="only cases whose name contains one of these (comma-separated)")
    ap.add_argument(
        "--tail",
        action="store_true",
        help="inputs zero but past the last 2/4 GiB boundary (a wrapped offset reads zeros: dW ~ 0)",
    )
    ap.add_argument("--samples", type=int, default=64, help="dW entries checked per case (default 64)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", type=int, default=None, help="device index of the target's driver")
    args = ap.parse_args(argv)
    if args.compile_only:
        if args.out is None:
            ap.error("--compile-only needs --out DIR")
        compile_all(args.out, args.target, args.tiny, args.filter)
        return 0
    return run_all(args.run, args.samples, args.seed, args.device, args.filter, args.tail)


if __name__ == "__main__":
    sys.exit(main())
