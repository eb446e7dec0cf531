"""Run side of the benchmark: needs only iree-base-runtime, numpy and (if importable) torch.

    python -m convbw_mlir.bench.run DIR [--filter SUBSTR] [--out results.json] [--device N] [--driver D]

For each problem of ``DIR/manifest.json``: random x and dy (seeded), device-resident; the GPU reference
computes dW, checked against the numpy float64 reference where that takes seconds; every contender's
dW is checked against the GPU reference (a wrong result is reported as wrong and not timed as a win);
each contender is timed the same way (warm-up, then batches of calls each ended by reading the
result back, at least 20 batches and 0.2 s, median and spread); cuDNN through torch
(``torch.backends.cudnn.benchmark = True``, channels-last, the same layout and type) is timed the same way.
Writes JSON, a markdown table and a PNG plot next to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from convbw_mlir.problem import ConvBwdWeightProblem
from convbw_mlir.reference import ToleranceError, assert_close, random_inputs, reference
from convbw_mlir.runtime import Kernel, time_calls

__all__ = ["main", "run_manifest"]

# numpy's float64 reference runs at a few GFLOP/s: use it where it takes seconds.
NUMPY_REFERENCE_MAX_FLOPS = 4e10


def _stats(samples: list[float]) -> dict[str, float]:
    s = sorted(samples)
    q = lambda f: s[min(len(s) - 1, int(f * (len(s) - 1)))]  # noqa: E731
    return {"median_s": statistics.median(s), "p10_s": q(0.1), "p90_s": q(0.9), "n": len(s)}


class Torch:
    """cuDNN through torch, for layouts torch can express (channels-last and NCHW families)."""

    def __init__(self) -> None:
        import torch

        self.torch = torch
        self.ok = torch.cuda.is_available()
        if self.ok:
            torch.backends.cudnn.benchmark = True
            self.name = torch.cuda.get_device_name(0)

    def supports(self, p: ConvBwdWeightProblem) -> str | None:
        """None if supported, else why not."""
        if p.pad_low != p.pad_high:
            return "asymmetric pads"
        if p.dw_dtype != p.dtype:
            return "mixed dW type"
        if p.layout_family.x not in ("NHWGC", "NHWC", "NGCHW", "NCHW"):
            return f"layout {p.layout}"
        if p.layout_family.w not in ("GKYXC", "KYXC", "GKCYX", "KCYX"):
            return f"layout {p.layout}"
        return None

    def _tensor(self, a: np.ndarray, dtype: str) -> Any:
        t = self.torch
        if dtype == "bf16":
            return t.from_numpy(a.view(np.int16)).view(t.bfloat16)
        return t.from_numpy(a)

    def prepare(self, p: ConvBwdWeightProblem, x: np.ndarray, dy: np.ndarray) -> tuple[Any, Any]:
        """A callable computing dW with torch, and a function turning its result into our dW layout."""
        t = self.torch
        rank = p.rank
        lay = p.layout_family
        n, g, c, k = p.batch, p.groups, p.in_channels, p.out_channels
        ins, outs = p.input_size, p.output_size
        # torch views [N, G*C, spatial...] over our memory; 1-D runs as 2-D with H=1 (channels-last exists).
        pad1 = (1,) if rank == 1 else ()
        if lay.x in ("NHWGC", "NHWC"):
            xt = self._tensor(x, p.dtype).reshape(n, *pad1, *ins, g * c)
            yt = self._tensor(dy, p.dtype).reshape(n, *pad1, *outs, g * k)
            nd = xt.dim()
            perm = (0, nd - 1, *range(1, nd - 1))
            xt, yt = xt.permute(perm), yt.permute(perm)
        else:
            xt = self._tensor(x, p.dtype).reshape(n, g * c, *pad1, *ins)
            yt = self._tensor(dy, p.dtype).reshape(n, g * k, *pad1, *outs)
        xt, yt = xt.to("cuda"), yt.to("cuda")  # preserve_format keeps the strides (channels-last or not)
        filt = (*pad1, *p.filter_size)
        w = t.empty((g * k, c, *filt), dtype=xt.dtype, device="cuda")
        if lay.x in ("NHWGC", "NHWC"):
            w = w.to(memory_format=t.channels_last if w.dim() == 4 else t.channels_last_3d)
        one = (1,) if rank == 1 else ()
        stride, dil, pad = (*one, *p.stride), (*one, *p.dilation), ((0,) if rank == 1 else ()) + p.pad_low

        def call() -> Any:
            return t.ops.aten.convolution_backward(
                yt, xt, w, None, list(stride), list(pad), list(dil), False, [0] * len(stride), g, [False, True, False]
            )[1]

        def to_ours(dw: Any) -> np.ndarray:
            dw = dw.float().cpu()
            if lay.w in ("GKYXC", "KYXC"):
                dw = dw.permute(0, *range(2, dw.dim()), 1)  # [GK, filt..., C]
            arr = dw.contiguous().numpy().reshape(p.dw_shape)
            return arr

        return call, to_ours

    def sync(self) -> None:
        self.torch.cuda.synchronize()


def _torch() -> Torch | None:
    try:
        tw = Torch()
    except ImportError:
        return None
    return tw if tw.ok else None


def run_manifest(folder: str | Path, filt: str = "", device: int | None = None, driver: str | None = None,
                 use_torch: bool = True, log=print) -> dict:  # fmt: skip
    """Run every problem of a manifest; returns the results dictionary (see the module docstring)."""
    from convbw_mlir.targets import RUNS_SM80, get_target

    folder = Path(folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    target = get_target(manifest["target"])
    driver = driver or target.driver
    torch_ = _torch() if use_torch and driver == "cuda" else None
    device_name = torch_.name if torch_ else driver
    roof = next((t for key, t in RUNS_SM80.items() if key in device_name), None)
    results: dict[str, Any] = {
        "device": device_name,
        "driver": driver,
        "target": manifest["target"],
        "iree_version": manifest["iree_version"],
        "date": time.strftime("%Y-%m-%d"),
        "problems": [],
    }
    for entry in manifest["problems"]:
        if filt and filt not in entry["key"]:
            continue
        p = ConvBwdWeightProblem.from_dict(entry["problem"])
        row: dict[str, Any] = {"name": entry["name"], "key": entry["key"], "flops": p.flops, "bytes": p.min_bytes}
        row["depthwise_or_grouped"] = p.groups > 1
        if roof:
            row["roofline_s"] = roof.roofline_seconds(p.flops, p.min_bytes, p.dtype)
        x, dy = random_inputs(p, seed=7)
        contenders = entry["contenders"]
        want = None
        ref = contenders.get("reference", {})
        if ref.get("ok"):
            try:
                kernel = Kernel((folder / ref["vmfb"]).read_bytes(), driver, device)
                want = kernel.run(x, dy).astype(np.float64)
            except Exception as e:  # noqa: BLE001 - recorded, the run goes on
                row["reference_error"] = str(e)[:300]
        if p.flops <= NUMPY_REFERENCE_MAX_FLOPS:
            exact = reference(p, x, dy)
            if want is not None:
                try:
                    assert_close(p.with_(dw_dtype="f32"), want, exact)
                    row["reference_checked"] = "numpy"
                except ToleranceError as e:
                    row["reference_checked"] = f"GPU reference WRONG vs numpy: {e}"
            want = exact if want is None else want
        row["contenders"] = {}
        for name, rec in contenders.items():
            if name == "reference":
                continue
            res: dict[str, Any] = {}
            if not rec.get("ok"):
                res = {"status": "no kernel", "error": rec.get("error", "")}
            else:
                try:
                    kernel = Kernel((folder / rec["vmfb"]).read_bytes(), driver, device)
                    xd, dyd = kernel.to_device(x), kernel.to_device(dy)
                    got = np.asarray(kernel(xd, dyd).to_host())
                    err = assert_close(p, got, want) if want is not None else None
                    res = {"status": "ok", "max_error": err}
                    res |= _stats(time_calls(kernel, xd, dyd))
                except ToleranceError as e:
                    res = {"status": "WRONG", "error": str(e)}
                except Exception as e:  # noqa: BLE001 - recorded, the run goes on
                    res = {"status": "failed", "error": str(e).strip().splitlines()[0][:300]}
            if "config" in rec:
                res["config"] = rec["config"]
            row["contenders"][name] = res
        if torch_:
            why = torch_.supports(p)
            if why:
                row["contenders"]["cudnn"] = {"status": "n/a", "error": why}
            else:
                try:
                    call, to_ours = torch_.prepare(p, x, dy)
                    got = to_ours(call())
                    err = assert_close(p, got, want) if want is not None else None
                    res = {"status": "ok", "max_error": err}
                    res |= _stats(time_calls(call, sync=torch_.sync))
                except ToleranceError as e:
                    res = {"status": "WRONG", "error": str(e)}
                except Exception as e:  # noqa: BLE001
                    res = {"status": "failed", "error": str(e).strip().splitlines()[0][:300]}
                row["contenders"]["cudnn"] = res
        results["problems"].append(row)
        log(_line(row))
    return results


def _line(row: dict) -> str:
    parts = [f"{row['key']:<42}"]
    for name, r in row["contenders"].items():
        if r.get("status") == "ok":
            parts.append(f"{name} {r['median_s'] * 1e6:9.1f}us")
        else:
            parts.append(f"{name} {r.get('status')}")
    return "  ".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m convbw_mlir.bench.run", description=__doc__.split("\n\n")[0])
    ap.add_argument("folder")
    ap.add_argument("--filter", default="")
    ap.add_argument("--out", default=None, help="results JSON (default FOLDER/results.json)")
    ap.add_argument("--device", type=int, default=None)
    ap.add_argument("--driver", default=None, help="override the manifest target's driver")
    ap.add_argument("--no-torch", action="store_true")
    args = ap.parse_args(argv)
    from convbw_mlir.bench.report import write_report

    t0 = time.time()
    results = run_manifest(args.folder, args.filter, args.device, args.driver, not args.no_torch)
    out = Path(args.out or Path(args.folder) / "results.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")
    write_report(results, out)
    print(f"wrote {out} and its .md/.png ({len(results['problems'])} problems, {time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
