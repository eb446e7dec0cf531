"""Compile GEMV-kernel variants (policy constants patched) for the vol_speech entries and add them to its manifest."""

import json
import shutil
import sys
from pathlib import Path

from convbw_mlir.build.contenders import compile_contenders
from convbw_mlir.policies import gemv
from convbw_mlir.problem import ConvBwdWeightProblem

folder = Path(sys.argv[1])
m = json.loads((folder / "manifest.json").read_text())
VARIANTS = {"gemv_waves1": {"WAVES": 1}, "gemv_acc80": {"MAX_ACCUMULATORS": 80}, "gemv_unroll2": {"UNROLL": 2}}
base = {k: getattr(gemv, k) for v in VARIANTS.values() for k in v}
for e in m["problems"]:
    p = ConvBwdWeightProblem.from_dict(e["problem"])
    default = gemv.rule(p, __import__("convbw_mlir.targets", fromlist=["x"]).get_target("sm_90a"))
    for name, patch in VARIANTS.items():
        for k, v in patch.items():
            setattr(gemv, k, v)
        try:
            plan = gemv.rule(p, __import__("convbw_mlir.targets", fromlist=["x"]).get_target("sm_90a"))
            if plan == default:
                continue
            tmp = folder / f".{name}"
            tmp.mkdir(exist_ok=True)
            rec = compile_contenders(p, e["key"], "sm_90a", tmp, ("convbw:strategy=gemv",))["convbw:strategy=gemv"]
            if rec.get("ok"):
                new = rec["vmfb"].replace(".vmfb", f".{name}.vmfb")
                shutil.move(tmp / rec["vmfb"], folder / new)
                rec["vmfb"] = new
                rec["variant"] = str(plan)
            e["contenders"][name] = rec
            print(e["key"], name, plan, rec.get("ok"), flush=True)
        finally:
            for k, v in base.items():
                setattr(gemv, k, v)
m["contenders"] = sorted(set(m["contenders"]) | set(VARIANTS))
(folder / "manifest.json").write_text(json.dumps(m, indent=1) + "\n")
for name in VARIANTS:
    shutil.rmtree(folder / f".{name}", ignore_errors=True)
