"""CPU emulator sweep of the sm_90a boxed form (issue 40 item 2): problems drawn by bench/fenced_fuzz.py's thin90
profile, each planned as the product plans it by default (decide: the boxed form for 4-16 channels a group) and, for
wider groups, with the boxed form asked for at policies.sm90.merge_for's width; every plan's kernel as the pass
builds it, run by tests/sm90_emulator.py (TMA loads with 16-byte start checks, NaN for any element never written),
against float64. Usage: python sweep.py COUNT SEED OUT.jsonl [CHECKOUT]"""

import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3] if len(sys.argv) < 5 else Path(sys.argv[4])  # the checkout
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "bench")]

from fenced_fuzz import thin90_problem  # noqa: E402
from sm90_emulator import max_error_of_plan  # noqa: E402

from convbw_mlir.plan import decide  # noqa: E402
from convbw_mlir.policies import sm90  # noqa: E402


def main() -> int:
    count, seed, out = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    r = random.Random(seed)
    with out.open("w") as f:
        for i in range(count):
            cls, p = thin90_problem(r)
            p = p.with_(dw_dtype="f32")  # the emulator's partials are f32: the check is the kernel's arithmetic
            plan = decide(p, "sm_90a")
            how = "default"
            if plan.merge is None or plan.tile is None or "WGMMA" not in (plan.tile.intrinsic or ""):
                plan = decide(p, "sm_90a", strategy="explicit", wgmma_merge=sm90.merge_for(p))
                how = "asked"
            t0 = time.perf_counter()
            try:
                err, verdict = max_error_of_plan(p, plan, seed=i), None
                verdict = "ok" if err < 1e-5 else "WRONG"
            except AssertionError as e:
                err, verdict = None, f"NaN/assert: {e}"[:200]
            row = {"i": i, "class": cls, "problem": p.to_dict(), "how": how, "merge": plan.merge.groups,
                   "k_batch": plan.k_batch, "tile_n": plan.tile.n, "error": err, "verdict": verdict,
                   "s": round(time.perf_counter() - t0, 2)}  # fmt: skip
            f.write(json.dumps(row) + "\n")
            f.flush()
            print(i, cls, how, plan.merge.groups, plan.k_batch, verdict, err, row["s"], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
