#!/bin/bash
# heldback_c (issue 39, goals 2 and 3): the SECOND held-back set, bench/heldback/dense2d_b.tsv (25 dense 2-D layers of
# 11 models outside every suite and outside the first set; chosen 2026-12-06 before the learned selector and the
# 600-entry database were installed: it judges them), bf16 then f16, channels-last, 50 rows. Each row: the variant a
# user gets on sm_90a (select(): now the learned selector on problems no database entry holds) against cuDNN and
# IREE's fusilli form (not built on the 1x1s, known wrong there; fails to build in IREE on PilotNet's 5x5: "no kernel").
# Kernels compiled on the CPU machine for sm_90a (IREE 3.13) by
#   .venv/bin/python bench/heldback.py compile ART --set bench/heldback/dense2d_b.tsv --workers 2   (main; see COMMIT)
# How it measures: bench/heldback.py run = class_table.run = the product's runner in its one-process form
# (convbw_mlir.measure.run server=True): every kernel checked against float64 (256-entry sample) with NaN placed
# after x and dy, then timed by CUPTI (kernel time a call), cuDNN checked and timed after it in the same process;
# one measuring process, one timing at a time, no --jobs. Each finished row is appended to $OUT/rows.jsonl.
# Order: every bf16 row, then every f16 row: a run cut short keeps the whole bf16 table.
# Run from the repo root:  PACK=.art/heldback_c OUT=<dir> bash .art/heldback/run.sh
set -u
PACK=$(cd "${PACK:?PACK must name the pack folder}" && pwd)
OUT=${OUT:?OUT must name the results folder}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
T0=$(date +%s)
BUDGET=$(cat "$PACK/ESTIMATE")   # seconds this pack may use in all
MARGIN=15                        # the report, a slow exit
rm -rf /tmp/site_heldback_c        # a warm machine may hold an older wheel there: --target never replaces it
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site_heldback_c "$PACK"/wheel/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site_heldback_c:/tmp/site
export PYTHONSAFEPATH=1          # never the checkout's convbw_mlir (main): the wheel's (zootune's lesson)
export OMP_NUM_THREADS=4 OPENBLAS_NUM_THREADS=4 MKL_NUM_THREADS=4
W=/tmp/heldback_c_work
rm -rf "$W" && mkdir -p "$W"
python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$PACK/art.tar.xz" "$W" \
  || { echo "cannot unpack $PACK/art.tar.xz" | tee "$OUT/run.log"; exit 1; }
cd "$W"                          # not the repo root: the measuring children import the wheel's convbw_mlir
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,temperature.gpu,utilization.gpu --format=csv,noheader
  nvidia-smi --query-compute-apps=pid,name,used_memory --format=csv,noheader
  python3 -c "import torch, convbw_mlir; print('torch', torch.__version__, 'cudnn', torch.backends.cudnn.version(), 'convbw_mlir from', convbw_mlir.__file__)"
} > "$OUT/card.txt" 2>&1
CARD=$(head -1 "$OUT/card.txt" | cut -d, -f1)
cp "$PACK/COMMIT" "$OUT/COMMIT" 2>/dev/null
cp "$W/art/manifest.json" "$OUT/manifest.json" 2>/dev/null   # the plans timed, their path and rule (140 KB)
echo "setup: $(( $(date +%s) - T0 )) s, $(python3 -c "import json,sys; print(len(json.load(open(sys.argv[1]))['problems']))" "$W/art/manifest.json") rows in the manifest; $(head -1 "$OUT/card.txt")" | tee "$OUT/run.log"
LEFT=$(( BUDGET - MARGIN - ($(date +%s) - T0) ))
timeout -k 5 "$LEFT" python3 "$PACK/heldback.py" run "$W/art" --out "$OUT" >> "$OUT/run.log" 2>&1
RC=$?
touch "$OUT/rows.jsonl"           # a run that measured nothing still reports (no rows)
ROWS=$(wc -l < "$OUT/rows.jsonl")
echo "run: rc=$RC (124: cut at $LEFT s) after $(( $(date +%s) - T0 )) s, $ROWS rows measured" | tee -a "$OUT/run.log"
R="$OUT/results.json"; [ -f "$R" ] || R="$OUT/rows.jsonl"   # the whole results where the run finished
python3 "$PACK/heldback.py" report "$R" --card "$CARD" \
  --command "PACK=.art/heldback_c OUT=OUT bash .art/heldback/run.sh (= python3 heldback.py run ART --out OUT)" \
  > "$OUT/table.md" 2> "$OUT/report.err"
sed -n '/^| rows/,/^$/p' "$OUT/table.md"
echo "rows with a WRONG contender (ours, IREE or cuDNN): $(grep -c '"status": "WRONG"' "$OUT/rows.jsonl")"
tail -3 "$OUT/run.log" | cut -c1-200
rm -rf "$W"
echo "heldback_c done in $(( $(date +%s) - T0 )) s"; ls -la "$OUT"
