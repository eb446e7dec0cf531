"""Build the variant contenders of the tuning run after unit dimensions stopped dropping our tiles:
python variants.py OUT (suites seeds + models, f16, sm_80).

- 1x1 problems: our MMA tile on the GEMM (gemm=mma) next to IREE's own (the default);
- problems auto splits with the MMA strategy: unsplit (k_batch=1) and twice the split;
- grouped problems with matrix cores: our tile (grouped=mma) next to IREE's own (the default).
Each folder is a bench manifest; run it with python -m convbw_mlir.bench.run.
"""

import math
import sys
from pathlib import Path

from convbw_mlir.bench.artifacts import write_artifacts
from convbw_mlir.bench.suites import load_suite
from convbw_mlir.heuristics import auto_k_batch, pick_intrinsic, plan_split_k
from convbw_mlir.targets import get_target

out = Path(sys.argv[1])
target = get_target("sm_80")
probs = [(n, p) for s in ("seeds", "models") for n, p in load_suite(s)]
gemm = [(n, p) for n, p in probs if math.prod(p.filter_size) == 1]
mma = [(n, p) for n, p in probs if pick_intrinsic(p, target) is not None]
split = [(n, p) for n, p in mma if (plan_split_k(p, target, "auto") or None) is not None]
grouped = [(n, p) for n, p in mma if p.groups > 1]
write_artifacts(gemm, "sm_80", out / "gemm", contenders=("convbw", "convbw:gemm=mma"))
write_artifacts(grouped, "sm_80", out / "grouped", contenders=("convbw", "convbw:grouped=mma"))
for n, p in split:
    kb = auto_k_batch(p, target)
    write_artifacts([(n, p)], "sm_80", out / f"split_{n}", contenders=("convbw", "convbw:k_batch=1",
                                                                         f"convbw:k_batch={2 * kb}"))
print(len(gemm), len(grouped), len(split))
