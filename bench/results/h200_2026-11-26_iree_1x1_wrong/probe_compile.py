"""Compile the iree1x1 probe batch: problems along each axis x contenders, plus IREE's direct form for a
target without NV_MMA_SYNC (WMMA only), per target, into manifests the runner checks (check_only)."""

import dataclasses
import datetime
import json
import sys
from pathlib import Path

from convbw_mlir.build.contenders import build_contender, compile_contenders
from convbw_mlir.build.iree import CompileError, compile_module
from convbw_mlir.problem import ConvBwdWeightProblem as P
from convbw_mlir.targets import TARGETS

Z = "1 1 1 1 0 0 0 0"
PROBS = [  # name, line, layout, dtype
    ("a_orig", "2 1 128 2048 512 1 1 7 7 " + Z, 2, "f16"),
    ("s7_n32", "2 1 32 256 256 1 1 7 7 " + Z, 2, "f16"),
    ("s14_n8", "2 1 8 256 256 1 1 14 14 " + Z, 2, "f16"),
    ("s28_n8", "2 1 8 256 256 1 1 28 28 " + Z, 2, "f16"),
    ("s56_n2", "2 1 2 256 256 1 1 56 56 " + Z, 2, "f16"),
    ("n1_7", "2 1 1 512 512 1 1 7 7 " + Z, 2, "f16"),
    ("n4_7", "2 1 4 512 512 1 1 7 7 " + Z, 2, "f16"),
    ("k64_c64", "2 1 32 64 64 1 1 14 14 " + Z, 2, "f16"),
    ("k64_c512", "2 1 32 64 512 1 1 14 14 " + Z, 2, "f16"),
    ("k512_c64", "2 1 32 512 64 1 1 14 14 " + Z, 2, "f16"),
    ("k16_c16", "2 1 32 16 16 1 1 14 14 " + Z, 2, "f16"),
    ("s7_n32_bf16", "2 1 32 256 256 1 1 7 7 " + Z, 2, "bf16"),
    ("s7_n32_l1", "2 1 32 256 256 1 1 7 7 " + Z, 1, "f16"),
    ("s7_n32_l4", "2 1 32 256 256 1 1 7 7 " + Z, 4, "f16"),
    ("s7_n32_g2", "2 2 32 128 128 1 1 7 7 " + Z, 2, "f16"),
    ("c3_14_n8", "2 1 8 256 256 3 3 14 14 1 1 1 1 1 1 1 1", 2, "f16"),
    ("c3_7_n32", "2 1 32 256 256 3 3 7 7 1 1 1 1 1 1 1 1", 2, "f16"),
    ("c3_14_n8_l4", "2 1 8 256 256 3 3 14 14 1 1 1 1 1 1 1 1", 4, "f16"),
    ("d3_28_n8", "3 1 2 128 128 1 1 1 4 28 28 1 1 1 1 1 1 0 0 0 0 0 0", 2, "f16"),
]
CODEGEN = ("convbw:strategy=codegen", "convbw:strategy=codegen,gemm=mma")
_NOSYNC = "<NV_MMA_SYNC_F32_16x8x16_F16>, <NV_MMA_SYNC_F16_16x8x16_F16>, <NV_MMA_SYNC_F32_16x8x16_BF16>, "


def nosync_target():
    t = TARGETS["sm_90a"]
    info = t.target_info.replace('arch = "sm_90a", features = "+ptx80"', 'arch = "sm_80", features = "+ptx76"')
    info = info.replace(_NOSYNC, "")
    assert "NV_MMA_SYNC" not in info
    return dataclasses.replace(t, name="sm_80", target_info=info)


def main(out, target):
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    entries = []
    only = sys.argv[3].split(",") if len(sys.argv) > 3 else None
    for name, line, layout, dtype in PROBS:
        if only and name not in only:
            continue
        p = P.from_ck(line, layout=layout, dtype=dtype)
        key = f"{name}.{dtype}"
        cs = ("reference", "iree_direct", *CODEGEN) + (("iree_torch", "iree_fusilli") if name == "a_orig" else ())
        recs = compile_contenders(p, key, target, out, cs)
        if target == "sm_80":
            text, flags = build_contender(p, "iree_direct", target)
            try:
                (out / f"{key}.iree_direct_nosync.vmfb").write_bytes(compile_module(text, nosync_target(), flags))
                recs["iree_direct_nosync"] = {"ok": True, "vmfb": f"{key}.iree_direct_nosync.vmfb", "flags": flags}
            except CompileError as e:
                recs["iree_direct_nosync"] = {"ok": False, "error": str(e).splitlines()[0][:300]}
        entries.append({"name": name, "key": key, "problem": p.to_dict(), "contenders": recs})
        print(
            key,
            {c: r.get("ok") and r.get("config", "") or r.get("error", "")[:120] for c, r in recs.items()},
            flush=True,
        )
    manifest = {
        "target": target,
        "date": str(datetime.date.today()),
        "iree_version": "3.13",
        "contenders": sorted({c for e in entries for c in e["contenders"]}),
        "problems": entries,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
