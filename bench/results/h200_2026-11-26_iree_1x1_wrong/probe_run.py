import json
import sys
import time

from convbw_mlir.measure.run import run_manifest


def main():
    out = sys.argv[1]
    for t in sys.argv[2:]:
        t0 = time.time()
        r = run_manifest(
            f".art/iree1x1/{t}", use_torch=False, check_only=True, timeout_s=60, jobs=3, log=lambda *a: None
        )
        json.dump(r, open(f"{out}/{t}.json", "w"), indent=1)
        print(t, "done", round(time.time() - t0, 1), "s", flush=True)
        for row in r["problems"]:
            print(
                row["key"],
                row.get("reference_check", {}).get("status"),
                {n: (c.get("status"), round(c.get("error_rms") or -1, 4)) for n, c in row["contenders"].items()},
                flush=True,
            )


if __name__ == "__main__":
    main()
