"""Run each kernel of a bench manifest twice (for ncu): python once.py DIR FILTER CONTENDER"""

import json
import sys
from pathlib import Path

from convbw_mlir.problem import ConvBwdWeightProblem
from convbw_mlir.reference import random_inputs
from convbw_mlir.runtime import Kernel

d = Path(sys.argv[1])
m = json.loads((d / "manifest.json").read_text())
for e in m["problems"]:
    if sys.argv[2] not in e["key"]:
        continue
    p = ConvBwdWeightProblem.from_dict(e["problem"])
    x, dy = random_inputs(p, seed=1)
    rec = e["contenders"][sys.argv[3]]
    k = Kernel((d / rec["vmfb"]).read_bytes(), "cuda")
    a = [k.to_device(x), k.to_device(dy)]
    for _ in range(2):
        k(*a).to_host()
