#!/bin/bash
# gemv pack, round 3 = the final figures (issue 40 items 3-4): the plan now (split-reduction GEMV kernel: positions
# unrolled, x read flat, every tap checked where padded, lanes folded by a binary tree, one chunk writing dW itself)
# vs the plan before vs the GEMV kernel vs cuDNN (IREE's forms: rounds 1-2), on the rows where the GEMV kernel runs,
# with two variants (the interior branch, one position an iteration); then the fenced fuzz of its class.
# sm_90a artifacts compiled on the CPU machine (bench/gemv.py compile --gemv-only; bench/fenced_fuzz.py compile
# --profile gemv). Timing: one measuring process at a time, measure.run --server (no --jobs), folder after folder;
# NaN fences and float64 checks are the runner's. Run from the repo root: PACK=.art/gemv OUT=<dir> bash .art/gemv/run.sh
set -u
PACK=${PACK:-.art/gemv}
OUT=${OUT:?set OUT}
BUDGET=${BUDGET:-147}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site_gemv "$PACK"/wheel/*.whl || exit 1
export PYTHONPATH=/tmp/site_gemv:/tmp/site
ART=/tmp/gemv_art
rm -rf "$ART" && mkdir -p "$ART" && tar -xJf "$PACK/art.tar.xz" -C "$ART" && tar -xJf "$PACK/fuzz.tar.xz" -C "$ART" || exit 1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > "$OUT/card.txt" 2>&1
cp "$PACK/COMMIT" "$OUT/" 2>/dev/null
for g in ck vol_speech zoo; do
  left=$((BUDGET - SECONDS - 5))
  if [ "$left" -lt 15 ]; then echo "skip $g: ${left}s left" | tee -a "$OUT/skipped.txt"; continue; fi
  echo "== $g (${left}s left)"
  timeout "$left" python3 -m convbw_mlir.measure.run "$ART/$g" --server --out "$OUT/results_$g.json" > "$OUT/log_$g.txt" 2>&1
  echo "rc=$? after ${SECONDS}s" | tee -a "$OUT/log_$g.txt"
done
ls "$OUT"/results_*.json >/dev/null 2>&1 && PYTHONPATH=$PYTHONPATH:bench python3 "$PACK/gemv.py" report "$OUT"/results_*.json > "$OUT/table.md" 2> "$OUT/report_err.txt"
sed -n '/## Geomeans/,$p' "$OUT/table.md" 2>/dev/null
# the fenced fuzz of the GEMV class (numerics only, nothing timed: shards side by side), if the budget allows
left=$((BUDGET - SECONDS - 3))
if [ "$left" -ge 40 ]; then
  echo "== fuzz (${left}s left)"
  PYTHONPATH=$PYTHONPATH:bench timeout "$left" python3 "$PACK/fenced_fuzz.py" run "$ART/fuzz" --shards 12 --timeout 30 --out "$OUT/fuzz.json" > "$OUT/fuzz.md" 2> "$OUT/fuzz_log.txt"
  echo "fuzz rc=$? after ${SECONDS}s"; head -30 "$OUT/fuzz.md"
else
  echo "skip fuzz: ${left}s left" | tee -a "$OUT/skipped.txt"
fi
cat "$OUT/card.txt"
echo "total ${SECONDS}s"
