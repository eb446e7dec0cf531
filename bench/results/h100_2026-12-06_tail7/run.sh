#!/bin/bash
# tail7 (issue 39): the dense short-reduction class searched on Hopper. 24 zoo layers (N Ho Wo of 1,568 or 3,136:
# the last stage of ImageNet CNNs and R(2+1)D/R3D/S3D's, 0.31-0.96x cuDNN after the zoo's tuning; 18 of tuned
# models first, then 6 of held-out models, bench/zoo_split.json), each with a GRID of our kernel families on sm_90a
# (bench/tail7.py: the plan now; wgmma bn 64/128/192/256 x k_batch; wgmma StreamK; the sm_80 mma.sync kernel's own
# tiling, tile_m 64/128 x k_batch, 4 stages, wave specialization; IREE codegen), 12 kernels a layer (288 in all), and
# cuDNN (the runner's), through the measuring server: every kernel checked against float64 with NaN after x and dy,
# then timed by CUPTI (kernel time), one measuring process, one timing at a time, no --jobs.
# Four parts (6 layers each: parts 0-2 the tuned models' layers, worst loss first; part 3 the held-out ones), each its
# own measure.run process one after another, each writing its own JSON as it ends, so a run cut short keeps the
# first parts (a part killed at its deadline loses its JSON; its .log keeps a line a finished layer).
# Run from the repo root:  PACK=.art/tail7 OUT=<dir> bash .art/tail7/run.sh       (ESTIMATE s in all)
set -u
PACK=$(cd "${PACK:?PACK must name the pack folder}" && pwd)
OUT=${OUT:?OUT must name the results folder}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
T0=$(date +%s)
BUDGET=$(cat "$PACK/ESTIMATE")   # seconds this pack may use in all
rm -rf /tmp/site_tail7           # a warm machine may hold an older wheel there: --target never replaces it
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site_tail7 "$PACK"/wheel/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site_tail7:/tmp/site
export PYTHONSAFEPATH=1          # never the checkout's convbw_mlir (main): the wheel's
export OMP_NUM_THREADS=4 OPENBLAS_NUM_THREADS=4 MKL_NUM_THREADS=4
W=/tmp/tail7_work
rm -rf "$W" && mkdir -p "$W"
python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$PACK/kernels.tar.xz" "$W" \
  || { echo "cannot unpack $PACK/kernels.tar.xz" | tee "$OUT/run.log"; exit 1; }
cd "$W"                          # not the repo root: the measuring children import the wheel's convbw_mlir
{ nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm,power.limit,temperature.gpu,utilization.gpu --format=csv,noheader
  nvidia-smi --query-compute-apps=pid,name,used_memory --format=csv,noheader
  python3 -c "import torch, convbw_mlir; print('torch', torch.__version__, 'cudnn', torch.backends.cudnn.version(), 'convbw_mlir from', convbw_mlir.__file__)"
} > "$OUT/card.txt" 2>&1
cat "$OUT/card.txt"
cp "$PACK/COMMIT" "$OUT/COMMIT" 2>/dev/null
cp "$W/kernels/manifest.json" "$OUT/manifest.json" 2>/dev/null   # the plans timed and each grid's account
python3 "$PACK/tail7.py" split "$W/kernels" --parts 4 > /dev/null || { echo "split failed" | tee -a "$OUT/run.log"; exit 1; }
echo "setup: $(( $(date +%s) - T0 )) s; $(head -1 "$OUT/card.txt")" | tee "$OUT/run.log"
# each part's deadline, seconds after T0: ~6 x 13 contenders x 0.35 s + 8 s start = ~35 s a part (0.45 s: ~43), with slack
ENDS=(62 118 172 $(( BUDGET - 15 )))
for part in 0 1 2 3; do
  left=$(( ${ENDS[$part]} - ($(date +%s) - T0) )); [ $left -lt 20 ] && left=20
  timeout -k 5 $left python3 -m convbw_mlir.measure.run "$W/kernels.part$part" --server --timeout 60 \
    --out "$OUT/part$part.json" > "$OUT/part$part.log" 2>&1
  echo "part $part: rc $? (124: cut at $left s) at $(( $(date +%s) - T0 )) s, $(ls "$OUT/part$part.json" 2>/dev/null || echo 'no JSON')" | tee -a "$OUT/run.log"
done
ls "$OUT"/part*.json > /dev/null 2>&1 && \
  python3 "$PACK/tail7.py" report "$OUT"/part*.json --manifest "$W/kernels/manifest.json" > "$OUT/table.md" 2> "$OUT/report.err"
tail -32 "$OUT/table.md" 2>/dev/null | cut -c1-220
echo "contenders not ok (WRONG, failed, crashed): $(grep -c '^[0-9]' "$OUT/table.md" 2>/dev/null || echo 0) (table.md's 'not ok:')"
for f in "$OUT"/*.log; do [ $(stat -c %s "$f") -gt 300000 ] && tail -c 300000 "$f" > "$f.tail" && mv "$f.tail" "$f"; done
rm -rf "$W"
echo "tail7 done in $(( $(date +%s) - T0 )) s" | tee -a "$OUT/run.log"; ls -la "$OUT"
