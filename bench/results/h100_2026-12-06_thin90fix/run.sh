#!/bin/bash
# thin90fix (issue 40 item 2, branch thin90fix): the wgmma boxed form's fenced fuzz again, after the box-start
# alignment refusal. Part 1 (recheck): the thin90 fuzz problems whose width put a box start off 16 bytes (the 12
# that crashed with cudaErrorIllegalInstruction on the H100 and 32 of those the run did not reach), each at the
# width the policy picks now (merge_for: the most groups a box whose starts align) and, for the 12, the fewest
# aligned too (47 kernels). Part 2 (fresh): 40 new thin90 problems (seed 91) of the new generator (aligned widths
# only; 37 kernels, 3 refused at compile: a split past tiny problems' k tiles). Check only: NaN after x and dy,
# float64 reference; nothing timed. Expected: every line "ok" (no crashed, WRONG, reads past).
# Run: PACK=.art/thin90fix OUT=<dir> bash .art/thin90fix/run.sh   (from the repo root; ~190 s)
set -u
PACK=$(cd "${PACK:-.art/thin90fix}" && pwd)
OUT=${OUT:?OUT must name the results folder}
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site_thin90fix "$PACK"/wheel/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site_thin90fix:/tmp/site
export OMP_NUM_THREADS=4 OPENBLAS_NUM_THREADS=4 MKL_NUM_THREADS=4
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm,power.limit --format=csv > "$OUT/card.txt" 2>&1
cat "$OUT/card.txt"
W=/tmp/thin90fix_work; rm -rf "$W"; mkdir -p "$W"
tar xJf "$PACK/recheck.txz" -C "$W" && tar xJf "$PACK/fresh.txz" -C "$W" || { echo "untar failed"; exit 1; }
cd "$W"   # not the repo root: the children import convbw_mlir from the wheel, not main's tree
for part in fuzz fresh; do
  if [ "$part" = fuzz ]; then end=120; else end=230; fi
  left=$(( end - SECONDS )); [ $left -lt 10 ] && left=10
  timeout -k 5 $left python3 "$PACK/fenced_fuzz.py" run "$W/$part" --server --timeout 30 --out "$OUT/$part.json" \
    > "$OUT/$part.log" 2>&1
  rc=$?
  echo "$part rc=$rc at ${SECONDS}s, ok: $(grep -E '^thin90[0-9]' "$OUT/$part.log" | grep -cE ' ok$'), not ok: $(grep -E '^thin90[0-9]' "$OUT/$part.log" | grep -vcE ' ok$')"
  grep -E '^thin90[0-9]' "$OUT/$part.log" | grep -vE ' ok$' | head -20 | cut -c1-200
done
cp "$W/fuzz/manifest.json" "$OUT/recheck_manifest.json"; cp "$W/fresh/manifest.json" "$OUT/fresh_manifest.json"
echo "total ${SECONDS}s"
