#!/bin/bash
# classtable (issue 40, "the per-class table"): the product's UNTUNED sm_90a plan of every layer of the classes
# suite, the two layers issue 40 names that no suite holds (Mamba's causal depthwise conv, CK's 3-D K = 1 case) and
# up to 8 zoo layers a class (held-back models first), in f16 and bf16, each against cuDNN in the same process:
# 99 layers, 198 rows, 8 classes (first, conv1d, conv3d, dw, thin, medium, gemv, dense); on the 6 rows whose plan is
# the GEMV kernel, also the plan the GEMV rule replaced (contender before_gemv). Why: no single per-class
# table exists, and the final forms of the depthwise and GEMV kernels (main since the dw90/gemv merges) were never
# measured against cuDNN through the product's plan. Kernels compiled on the CPU machine for sm_90a by
#   .venv/bin/python bench/class_table.py compile ART --workers 2          (branch classtable; see COMMIT)
# How it measures: bench/class_table.py run = the product's runner in its one-process form
# (convbw_mlir.measure.run server=True): every kernel checked against float64 (256-entry sample) with NaN placed
# after x and dy, then timed by CUPTI (kernel time a call, every kernel of the call summed), cuDNN checked and timed
# after it in the same process; one measuring process, one timing at a time, no --jobs.
# Order: round-robin over the classes (each layer's f16 and bf16 rows together), so a run cut short still holds every
# class; each finished row is appended to $OUT/rows.jsonl as it comes.
# Run from the repo root:  PACK=.art/classtable OUT=<dir> bash .art/classtable/run.sh
set -u
PACK=$(cd "${PACK:?PACK must name the pack folder}" && pwd)
OUT=${OUT:?OUT must name the results folder}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
T0=$(date +%s)
BUDGET=$(cat "$PACK/ESTIMATE")   # seconds this pack may use in all
MARGIN=20                        # the report, the tarball, a slow exit
rm -rf /tmp/site_classtable      # a warm machine may hold an older wheel there: --target never replaces it
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site_classtable "$PACK"/wheel/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site_classtable:/tmp/site
export PYTHONSAFEPATH=1          # never the checkout's convbw_mlir (main): the wheel's (zootune's lesson)
export OMP_NUM_THREADS=4 OPENBLAS_NUM_THREADS=4 MKL_NUM_THREADS=4
W=/tmp/classtable_work
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
echo "setup: $(( $(date +%s) - T0 )) s, $(python3 -c "import json,sys; print(len(json.load(open(sys.argv[1]))['problems']))" "$W/art/manifest.json") rows in the manifest; $(cat "$OUT/card.txt" | head -1)" | tee "$OUT/run.log"
LEFT=$(( BUDGET - MARGIN - ($(date +%s) - T0) ))
timeout -k 5 "$LEFT" python3 "$PACK/class_table.py" run "$W/art" --out "$OUT" >> "$OUT/run.log" 2>&1
RC=$?
touch "$OUT/rows.jsonl"           # a run that measured nothing still reports (no rows)
ROWS=$(wc -l < "$OUT/rows.jsonl")
echo "run: rc=$RC (124: cut at $LEFT s) after $(( $(date +%s) - T0 )) s, $ROWS rows measured" | tee -a "$OUT/run.log"
R="$OUT/results.json"; [ -f "$R" ] || R="$OUT/rows.jsonl"   # the whole results where the run finished
python3 "$PACK/class_table.py" report "$R" --card "$CARD" \
  --command "PACK=.art/classtable OUT=OUT bash .art/classtable/run.sh (= python3 class_table.py run ART --out OUT)" \
  > "$OUT/table.md" 2> "$OUT/report.err"
sed -n '/^| class/,/^$/p' "$OUT/table.md"
echo "rows with a WRONG contender (ours or cuDNN): $(grep -c '"status": "WRONG"' "$OUT/rows.jsonl")"
tail -3 "$OUT/run.log" | cut -c1-200
rm -rf "$W"
echo "classtable done in $(( $(date +%s) - T0 )) s"; ls -la "$OUT"
