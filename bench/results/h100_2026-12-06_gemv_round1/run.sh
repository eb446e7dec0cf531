#!/bin/bash
# gemv pack (issue 40 items 3-4): the plan now (split-reduction GEMV kernel) vs the plan before vs the GEMV kernel
# vs IREE's forms vs cuDNN; sm_90a artifacts compiled on the CPU machine (bench/gemv.py compile). One measuring
# process at a time: measure.run --server (no --jobs), folder after folder; NaN fences and float64 checks are the
# runner's. Run from the repo root: PACK=.art/gemv OUT=<dir> bash .art/gemv/run.sh
set -u
PACK=${PACK:-.art/gemv}
OUT=${OUT:?set OUT}
BUDGET=${BUDGET:-145}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site_gemv "$PACK"/wheel/*.whl || exit 1
export PYTHONPATH=/tmp/site_gemv:/tmp/site
ART=/tmp/gemv_art
rm -rf "$ART" && mkdir -p "$ART" && tar -xJf "$PACK/art.tar.xz" -C "$ART" || exit 1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > "$OUT/card.txt" 2>&1
git rev-parse HEAD > "$OUT/tree_commit.txt" 2>/dev/null
cp "$PACK/COMMIT" "$OUT/" 2>/dev/null
for g in ck vol_speech zoo; do
  left=$((BUDGET - SECONDS - 5))
  if [ "$left" -lt 15 ]; then echo "skip $g: ${left}s left" | tee -a "$OUT/skipped.txt"; continue; fi
  echo "== $g (${left}s left)"
  timeout "$left" python3 -m convbw_mlir.measure.run "$ART/$g" --server --out "$OUT/results_$g.json" > "$OUT/log_$g.txt" 2>&1
  echo "rc=$? after ${SECONDS}s" | tee -a "$OUT/log_$g.txt"
done
ls "$OUT"/results_*.json >/dev/null 2>&1 && PYTHONPATH=$PYTHONPATH:bench python3 "$PACK/gemv.py" report "$OUT"/results_*.json > "$OUT/table.md" 2> "$OUT/report_err.txt"
cat "$OUT/card.txt"
sed -n '/## Geomeans/,$p' "$OUT/table.md" 2>/dev/null
grep -h -c '"WRONG"\|"wrong"' "$OUT"/results_*.json 2>/dev/null | paste -sd' ' | sed 's/^/wrong-status counts: /'
echo "total ${SECONDS}s"
