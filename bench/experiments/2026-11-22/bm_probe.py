"""Time kernels of a bench manifest with iree-benchmark-module (C++ invoke loop, device-resident
inputs) instead of the Python runner: python bm_probe.py DIR FILTER CONTENDER...; prints us per call."""

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import iree.runtime  # locates the binary beside the package
import numpy as np

from convbw_mlir.problem import ConvBwdWeightProblem
from convbw_mlir.reference import random_inputs

tool = Path(iree.runtime.__file__).parent.parent / "_runtime_libs" / "iree-benchmark-module"
d = Path(sys.argv[1])
m = json.loads((d / "manifest.json").read_text())
for e in m["problems"]:
    if sys.argv[2] not in e["key"]:
        continue
    p = ConvBwdWeightProblem.from_dict(e["problem"])
    x, dy = random_inputs(p, seed=1)
    with tempfile.TemporaryDirectory() as t:
        np.save(f"{t}/x.npy", x)
        np.save(f"{t}/dy.npy", dy)
        for c in sys.argv[3:]:
            rec = e["contenders"].get(c, {})
            if not rec.get("ok"):
                continue
            out = subprocess.run([str(tool), f"--module={d / rec['vmfb']}", "--device=cuda", "--function=conv_bwd_weight",
                                  f"--input=@{t}/x.npy", f"--input=@{t}/dy.npy", "--benchmark_min_time=0.3s",
                                  "--benchmark_format=json"], capture_output=True, text=True)
            try:
                runs = json.loads(out.stdout)["benchmarks"]
                print(e["key"], c, [(r["name"][-20:], round(r["real_time"], 4), r["time_unit"]) for r in runs])
            except Exception:
                print(e["key"], c, "FAILED", out.stderr[-400:])
