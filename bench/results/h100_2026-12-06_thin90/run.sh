#!/bin/bash
# thin90 (issue 40 item 2, branch thin90): thin and medium groups on Hopper. The wgmma kernel's new boxed form
# (m groups of C < 64 channels in one 64-channel TMA im2col box a tap, the block diagonal stored) against the plan
# now (the sm_80 kernel on sm_90a, merged for 4-16 channels), the sm_80 merged form at 24/32 channels, and cuDNN,
# side by side through the measuring server (one process at a time: NaN fences, float64 checks, CUPTI kernel time).
# Why: the boxed form is not the plan's default until measured (switch WGMMA_MERGE_BY_DEFAULT, off); NOTE.txt says
# what to flip from these figures. Then the fenced fuzz of the boxed form (--profile thin90, 228 kernels, check only).
# Priority: part 0 (the 14 key layers), part 1 (13 more, 6 held back), then the fuzz; each writes its own files.
# Run: PACK=.art/thin90 OUT=<dir> bash .art/thin90/run.sh   (from the repo root; ~150 s)
set -u
PACK=$(cd "${PACK:-.art/thin90}" && pwd)
OUT=${OUT:?OUT must name the results folder}
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site_thin90 "$PACK"/wheel/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site_thin90:/tmp/site
export OMP_NUM_THREADS=4 OPENBLAS_NUM_THREADS=4 MKL_NUM_THREADS=4
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm,power.limit --format=csv > "$OUT/card.txt" 2>&1
cat "$OUT/card.txt"
W=/tmp/thin90_work; rm -rf "$W"; mkdir -p "$W"
tar xJf "$PACK/side.txz" -C "$W" && tar xJf "$PACK/fuzz.txz" -C "$W" || { echo "untar failed"; exit 1; }
python3 "$PACK/thin90.py" split "$W/side" --parts 2 > /dev/null || { echo "split failed"; exit 1; }
cd "$W"   # not the repo root: the children import convbw_mlir from the wheel, not main's tree
for part in 0 1; do
  left=$(( (part == 0 ? 62 : 118) - SECONDS )); [ $left -lt 15 ] && left=15
  timeout -k 5 $left python3 -m convbw_mlir.measure.run "$W/side.part$part" --server --timeout 60 \
    --out "$OUT/side_part$part.json" > "$OUT/side_part$part.log" 2>&1
  echo "side part $part: rc $? at ${SECONDS}s, $(grep -c ' ok' "$OUT/side_part$part.log") ok lines"
done
ls "$OUT"/side_part*.json > /dev/null 2>&1 && \
  python3 "$PACK/thin90.py" report "$OUT"/side_part*.json --manifest "$W/side/manifest.json" > "$OUT/table.md" 2>&1
tail -40 "$OUT/table.md" 2>/dev/null | cut -c1-220
# the fenced fuzz of the boxed form: every kernel checked against float64 with NaN after x and dy, nothing timed
left=$(( 163 - SECONDS )); [ $left -lt 10 ] && left=10
timeout -k 5 $left python3 "$PACK/fenced_fuzz.py" run "$W/fuzz" --server --timeout 30 --out "$OUT/fuzz.json" > "$OUT/fuzz.log" 2>&1
echo "fuzz rc=$? at ${SECONDS}s, ok: $(grep -c ' ok' "$OUT/fuzz.log"), lines not ok: $(grep -E '^thin90[0-9]' "$OUT/fuzz.log" | grep -vc ' ok')"
grep -E '^thin90[0-9]' "$OUT/fuzz.log" | grep -v ' ok' | head -20 | cut -c1-200
for f in "$OUT"/*.log; do [ $(stat -c %s "$f") -gt 300000 ] && tail -c 300000 "$f" > "$f.tail" && mv "$f.tail" "$f"; done
echo "total ${SECONDS}s"
