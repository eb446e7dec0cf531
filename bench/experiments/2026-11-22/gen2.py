"""Experiment 2: product convbw (+ variants with extra IREE flags) in the bench manifest format."""

import json
import sys
from pathlib import Path

from convbw_mlir.bench.artifacts import build_contender
from convbw_mlir.bench.suites import load_suite
from convbw_mlir.compiler import compile_module

OUT = Path(sys.argv[1])
names = sys.argv[2].split(",")
variants = {  # contender name -> (pipeline contender, extra flags)
    "convbw": ("convbw", []),
}
for v in sys.argv[3:]:
    key, _, rest = v.partition("=")
    contender, _, flags = rest.partition("@")
    variants[key] = (contender, [f for f in flags.split(";") if f])
OUT.mkdir(parents=True, exist_ok=True)
entries = []
problems = [p for s in ("seeds", "models") for p in load_suite(s)]
for name, problem in problems:
    if name not in names:
        continue
    problem = problem.with_(dtype="f16", dw_dtype="f16")
    key = f"{name}.f16"
    recs = {}
    for cname, (contender, flags) in [("reference", ("reference", []))] + list(variants.items()):
        try:
            text, f0 = build_contender(problem, contender, "sm_80")
            vmfb = compile_module(text, "sm_80", f0 + flags)
            path = f"{key}.{cname}.vmfb"
            (OUT / path).write_bytes(vmfb)
            recs[cname] = {"ok": True, "vmfb": path, "flags": f0 + flags}
            print("ok", key, cname, flush=True)
        except Exception as e:  # noqa: BLE001
            recs[cname] = {"ok": False, "error": str(e)[:300]}
            print("FAIL", key, cname, str(e)[:300], flush=True)
    entries.append({"name": name, "key": key, "problem": problem.to_dict(), "contenders": recs})
manifest = {
    "target": "sm_80",
    "date": "2026-11-22",
    "iree_version": "3.13",
    "contenders": list(variants),
    "problems": entries,
}
(OUT / "manifest.json").write_text(json.dumps(manifest, indent=1))
