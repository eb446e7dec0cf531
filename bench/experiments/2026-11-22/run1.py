"""Experiment runner (device side): check each vmfb against torch in f64, time it."""

import json
import statistics
import sys
from pathlib import Path

import numpy as np
import torch

from convbw_mlir.runtime import Kernel, time_calls

root = Path(sys.argv[1])
results = []
for mf in sorted(root.glob("manifest_*.json")):
    for m in json.loads(mf.read_text()):
        rng = np.random.default_rng(0)
        if m["kind"] == "depthwise":
            N, H, W, G, R = m["N"], m["H"], m["W"], m["G"], m["R"]
            x = rng.uniform(-1, 1, (N, H, W, G)).astype(np.float16)
            dy = rng.uniform(-1, 1, (N, H, W, G)).astype(np.float16)
            xt = torch.from_numpy(x).cuda().double().permute(0, 3, 1, 2)
            dyt = torch.from_numpy(dy).cuda().double().permute(0, 3, 1, 2)
            ref = torch.nn.grad.conv2d_weight(xt, (G, 1, R, R), dyt, stride=1, padding=R // 2, groups=G)
            ref = ref[:, 0].cpu().numpy()
        elif m["kind"] == "pad":
            N, H, C = m["N"], m["H"], m["C"]
            x = rng.uniform(-1, 1, (N, H, H, C)).astype(np.float16)
            dy = x
            ref = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0))).astype(np.float64)
        else:
            P, K, C = m["P"], m["K"], m["C"]
            x = rng.uniform(-1, 1, (P, C)).astype(np.float16)
            dy = rng.uniform(-1, 1, (P, K)).astype(np.float16)
            ref = (torch.from_numpy(dy).cuda().double().T @ torch.from_numpy(x).cuda().double()).cpu().numpy()
        try:
            k = Kernel((root / f"{m['name']}.vmfb").read_bytes(), "cuda")
        except Exception as e:
            print(m["name"], "LOAD FAIL", str(e)[:200])
            continue
        args = [k.to_device(x), k.to_device(dy)]
        got = np.asarray(k(*args).to_host()).astype(np.float64)
        if got.shape != ref.shape:
            got = ref = np.zeros(1)
        err = np.abs(got - ref)
        scale = np.abs(ref).max() or 1.0
        rel = float(err.max() / scale)
        bad = err > 1e-2 * scale
        info = {"name": m["name"], "rel_err": rel, "bad_frac": float(bad.mean())}
        if bad.any() and got.ndim == 2:
            rows, cols = np.nonzero(bad)
            info["bad_rows"] = sorted(set((rows % 64).tolist()))[:20]
            info["bad_cols"] = sorted(set((cols % 64).tolist()))[:20]
            info["nan"] = int(np.isnan(got).sum())
        if len(sys.argv) > 3:
            only = sys.argv[3]
            if only not in m["name"]:
                continue
            for _ in range(3):
                k(*args).to_host()
            continue
        t = time_calls(k, *args)
        info["us"] = statistics.median(t) * 1e6
        print(json.dumps(info), flush=True)
        results.append(info)
out = Path(sys.argv[2])
out.parent.mkdir(parents=True, exist_ok=True)
out.write_text(json.dumps(results, indent=1))
