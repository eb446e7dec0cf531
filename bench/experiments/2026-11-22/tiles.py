"""Build tile variants of every MMA-strategy problem of seeds + models (f16, sm_80), now that IREE
compiles our tiles: python tiles.py OUT PART PARTS (PART of PARTS, to build in parallel).

Contenders: our default tile, a 128-deep reduction step (IREE's own choice on video_r3d 64: reduction
8 x 16), half the N tile, M of 32.
"""

import sys

from convbw_mlir.bench.artifacts import write_artifacts
from convbw_mlir.bench.suites import load_suite
from convbw_mlir.heuristics import pick_intrinsic
from convbw_mlir.targets import get_target

out, part, parts = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
target = get_target("sm_80")
probs = [(n, p) for s in ("seeds", "models") for n, p in load_suite(s)]
mma = [(n, p) for n, p in probs
       if pick_intrinsic(p, target) is not None and p.groups == 1 and max(p.filter_size) > 1]
write_artifacts(mma[part::parts], "sm_80", out, contenders=(
    "convbw", "convbw:tile_k=128", "convbw:tile_n=64", "convbw:tile_m=32"))
print(len(mma[part::parts]))
