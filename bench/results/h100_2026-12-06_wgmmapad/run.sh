#!/bin/bash
# wgmmapad (issue 39 goal 2): the sm_90a wgmma kernel on dense layers whose in-channels C are a multiple of 8 but
# not of 64 (wgmma-pad-channels=true: each tap's channels padded to whole 64-channel boxes), never run on a GPU before
# this pack. 12 layers: bench/tail7.py's 8 the wgmma kernel takes only padded (5 of tuned models: FIT; 3 of held-out
# models: CHECK) then 2 held-back rows with C % 64 != 0 (DenseNet-201 denselayer48 C 1760, Xception block5 pointwise
# C 728) in both types (4 rows: CHECK), a grid a layer (bench/wgmmapad.py): the plan now (the sm_80 kernel), the
# padded plan's own split (p_auto), padded x wgmma-rows 128 and 64 x bn 64, 128 x k_batch 1, 2, 4; 167 kernels, and
# cuDNN (the runner's), through the measuring server: every kernel checked against float64 with NaN after x and dy,
# then timed by CUPTI (kernel time), one measuring process, one timing at a time, no --jobs.
# Two parts (6 layers each: 0 the tuned models' layers and the first held, 1 the rest), each its own measure.run process one
# after another, each writing its own JSON as it ends, so a run cut short keeps the first part.
# Run from the repo root:  PACK=.art/wgmmapad OUT=<dir> bash .art/wgmmapad/run.sh       (ESTIMATE s in all)
set -u
PACK=$(cd "${PACK:?PACK must name the pack folder}" && pwd)
OUT=${OUT:?OUT must name the results folder}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
T0=$(date +%s)
BUDGET=$(cat "$PACK/ESTIMATE")   # seconds this pack may use in all
rm -rf /tmp/site_wgmmapad         # a warm machine may hold an older wheel there: --target never replaces it
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site_wgmmapad "$PACK"/wheel/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site_wgmmapad:/tmp/site
export PYTHONSAFEPATH=1          # never the checkout's convbw_mlir (main): the wheel's
export OMP_NUM_THREADS=4 OPENBLAS_NUM_THREADS=4 MKL_NUM_THREADS=4
W=/tmp/wgmmapad_work
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
python3 "$PACK/wgmmapad.py" split "$W/kernels" --parts 2 > /dev/null || { echo "split failed" | tee -a "$OUT/run.log"; exit 1; }
echo "setup: $(( $(date +%s) - T0 )) s; $(head -1 "$OUT/card.txt")" | tee "$OUT/run.log"
# each part's deadline, seconds after T0: ~90 contenders x 0.45 s + 8 s start each, cumulative, with slack
ENDS=(70 $(( BUDGET - 10 )))
for part in 0 1; do
  left=$(( ${ENDS[$part]} - ($(date +%s) - T0) )); [ $left -lt 20 ] && left=20
  timeout -k 5 $left python3 -m convbw_mlir.measure.run "$W/kernels.part$part" --server --timeout 60 \
    --out "$OUT/part$part.json" > "$OUT/part$part.log" 2>&1
  echo "part $part: rc $? (124: cut at $left s) at $(( $(date +%s) - T0 )) s, $(ls "$OUT/part$part.json" 2>/dev/null || echo 'no JSON')" | tee -a "$OUT/run.log"
done
ls "$OUT"/part*.json > /dev/null 2>&1 && \
  python3 "$PACK/wgmmapad.py" report "$OUT"/part*.json --manifest "$W/kernels/manifest.json" > "$OUT/table.md" 2> "$OUT/report.err"
tail -30 "$OUT/table.md" 2>/dev/null | cut -c1-220
echo "contenders not ok (WRONG, failed, crashed): $(grep -c '^[0-9]' "$OUT/table.md" 2>/dev/null || echo 0) (table.md's 'not ok:')"
for f in "$OUT"/*.log; do [ $(stat -c %s "$f") -gt 300000 ] && tail -c 300000 "$f" > "$f.tail" && mv "$f.tail" "$f"; done
rm -rf "$W"
echo "wgmmapad done in $(( $(date +%s) - T0 )) s" | tee -a "$OUT/run.log"; ls -la "$OUT"
