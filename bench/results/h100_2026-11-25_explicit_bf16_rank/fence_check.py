"""Every vmfb of explicit_conv manifests run once with x and dy each followed by 1 MiB of NaN
(convbw_mlir.runtime.Kernel.to_device_fenced), dW checked against the float64 reference (harness.check).
Usage: python3 fence_check.py OUT.json DIR [DIR ...]   (run from bench/, PYTHONPATH with the repo)."""

import json
import sys
import time
from pathlib import Path

import explicit_conv as ec
import harness
import torch

from convbw_mlir.runtime import Kernel

out, dirs = Path(sys.argv[1]), [Path(d) for d in sys.argv[2:]]
rows = []
for folder in dirs:
    kernels = {}
    for e in harness.load_manifest(folder)["entries"]:
        if not e.get("vmfb"):
            continue
        rec = {"dir": folder.name, "name": e["name"], "kind": e["kind"], "problem": e["problem"]}
        t0 = time.time()
        try:
            x, dy = ec._inputs(e, torch)
            ref = ec._reference(e, x.cuda(), dy.cuda(), folder, torch).cpu()
            n, g = e["images"], e["groups"]
            xs = ec._numpy(x, torch).reshape(n, *e["input_size"], g, e["in_channels"])
            dys = ec._numpy(dy, torch).reshape(n, *e["output_size"], g, e["out_channels"])
            k = Kernel((folder / e["vmfb"]).read_bytes(), "cuda")
            got = k(k.to_device_fenced(xs), k.to_device_fenced(dys)).to_host()
            got = torch.from_numpy(got.astype("float64")).reshape(ref.shape)
            rec.update(harness.check(got, ref, e["dw_dtype"], torch))
            rec["nan_in_dw"] = int(torch.isnan(got).sum())
        except Exception as exc:
            rec["error"] = f"{type(exc).__name__}: {exc}"[:300]
        rec["s"] = round(time.time() - t0, 2)
        rows.append(rec)
        print(rec["name"], rec.get("correct"), rec.get("max_rel_err"), rec.get("error", ""), flush=True)
        out.write_text(json.dumps(rows, indent=1))
