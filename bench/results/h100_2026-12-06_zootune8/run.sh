#!/bin/bash
# zootune8 (issue 39 goal 4: the rate with both passes; the zoo slice's 838 problems zootune7b did not reach): the zoo's next slice (slice order positions 600.., f16/bf16, sm_90a), compiled
# with --cubin (ptxas 13.0.88 SASS for the driver 580 = CUDA 13.0: no driver JIT at load), timed as a user tunes:
# ONE `python -m convbw_mlir.dispatch.tune slice --server --cudnn --deadline D` over ONE merged manifest, one
# measuring server for the whole run (measure.server.ServerPool, main a9d7433); then its rate table
# (tune_rate.py phases) against the 37.7/min of bench/results/h100_2026-12-06_zoorate/.
# Run from the repo root: PACK=.art/zootune7 OUT=<dir> bash .art/zootune7/run.sh
set -u
T0=$(date +%s)
PACK=$(cd "$PACK" && pwd)
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
BUDGET=$(cat "$PACK/ESTIMATE")         # seconds this pack may use in all
MARGIN=25                              # kept for the rate table, the tarball and a slow exit
NAME=$(basename "$PACK")
ART=/tmp/${NAME}_art                   # the kernels, unpacked: slice/manifest.json names them in chunks/cNN
SITE=/tmp/site_$NAME
left() { echo $(( BUDGET - MARGIN - ($(date +%s) - T0) )); }
python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$PACK"/wheel/*.whl 2>&1 | tail -2
export PYTHONPATH=$SITE:/tmp/site
rm -rf "$ART" && mkdir -p "$ART"
python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$PACK/art.tar.xz" "$ART" \
  || { echo "cannot unpack $PACK/art.tar.xz"; exit 1; }
cd "$ART"                              # nothing of the checkout on sys.path
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader | tee "$OUT/card.txt"
PYTHONSAFEPATH=1 python3 -c "import convbw_mlir, sys; print('convbw_mlir from', convbw_mlir.__file__, sys.version.split()[0])" \
  | tee -a "$OUT/card.txt"
grep -q "$SITE" "$OUT/card.txt" || { echo "not the wheel's convbw_mlir: stop"; exit 1; }
# the 152 problems zootune7b timed are left out (done_keys.txt): the slice's other 838 in order
python3 - "$PACK/done_keys.txt" slice/manifest.json <<'PY'
import json, sys
done = set(open(sys.argv[1]).read().split())
m = json.load(open(sys.argv[2]))
m["problems"] = [p for p in m["problems"] if p["key"] not in done]
json.dump(m, open(sys.argv[2], "w"))
PY
N=$(python3 -c "import json, sys; print(len(json.load(open(sys.argv[1]))['problems']))" slice/manifest.json)
echo "unpacked after $(( $(date +%s) - T0 )) s: $N problems in one manifest"

# One tuning run (main 8835734: rows land in results.json as each problem is timed, pass 2 updates them; --deadline
# is the run's whole budget, pass 2 included). The deadline is what is left less 15 s for a slow exit; the timeout
# kill stays as the backstop (a killed run still leaves a valid results.json with every problem timed so far).
L=$(left)
D=$(( L - 15 ))
mkdir -p "$OUT/zoo"
PYTHONSAFEPATH=1 timeout -k 5 "$L" python3 -m convbw_mlir.dispatch.tune "$ART/slice" --out "$OUT/zoo/results.json" \
  --server --cudnn --deadline "$D" > "$OUT/zoo/log.txt" 2>&1
echo "tune rc=$? deadline $D s of $L, after $(( $(date +%s) - T0 )) s: $(tail -1 "$OUT/zoo/log.txt")"
ls -la "$OUT/zoo"; python3 "$PACK/tune_rate.py" phases "$OUT/zoo/results.json" --out "$OUT/phases.json" | tee "$OUT/phases.md"
cd "$OUT" && tar czf zoo.tgz zoo 2>/dev/null && rm -rf zoo
echo "$NAME done in $(( $(date +%s) - T0 )) s"; ls -la "$OUT"
