#!/bin/bash
# splitsum (issue 39 goal 2, docs/decisions.md#short-reduction-dense item 2): the split sum (stage 2) of the explicit
# kernels' split plans before (main c242883's wheel built them) and after (branch splitsum: its own tile where IREE's
# is scalar), on tail7's 16 layers whose plan splits (RegNetY-016 888x888 and RegNet-Y-400MF 440x440, the two slow
# sums, among them; the other 14 keep IREE's tile: the same code twice, the run-to-run spread), and cuDNN (the
# runner's). Every kernel checked against float64 with NaN after x and dy, then timed by CUPTI (kernel time, and
# each kernel by name: kernel_us_each, from the after wheel's runner), one measuring process, one timing at a time.
# Two parts (8 layers each; the two slow layers first, in part 0), each its own measure.run process one after the other,
# each writing its own JSON as it ends, so a run cut short keeps the first part.
# Run from the repo root:  PACK=.art/splitsum OUT=<dir> bash .art/splitsum/run.sh       (ESTIMATE s in all)
set -u
PACK=$(cd "${PACK:?PACK must name the pack folder}" && pwd)
OUT=${OUT:?OUT must name the results folder}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
T0=$(date +%s)
BUDGET=$(cat "$PACK/ESTIMATE")   # seconds this pack may use in all
rm -rf /tmp/site_splitsum        # a warm machine may hold an older wheel there: --target never replaces it
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site_splitsum "$PACK"/wheel/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site_splitsum:/tmp/site
export PYTHONSAFEPATH=1          # never the checkout's convbw_mlir (main): the wheel's (its runner has kernel_us_each)
export OMP_NUM_THREADS=4 OPENBLAS_NUM_THREADS=4 MKL_NUM_THREADS=4
W=/tmp/splitsum_work
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
cp "$W/kernels/manifest.json" "$OUT/manifest.json" 2>/dev/null   # the plans timed, each layer's stage-2 account
python3 "$PACK/splitsum.py" split "$W/kernels" --parts 2 > /dev/null || { echo "split failed" | tee -a "$OUT/run.log"; exit 1; }
echo "setup: $(( $(date +%s) - T0 )) s; $(head -1 "$OUT/card.txt")" | tee "$OUT/run.log"
# each part's deadline, seconds after T0: 24 contenders x 0.45 s + 8 s start each, cumulative, with slack
ENDS=(60 $(( BUDGET - 10 )))
for part in 0 1; do
  left=$(( ${ENDS[$part]} - ($(date +%s) - T0) )); [ $left -lt 20 ] && left=20
  timeout -k 5 $left python3 -m convbw_mlir.measure.run "$W/kernels.part$part" --server --timeout 60 \
    --out "$OUT/part$part.json" > "$OUT/part$part.log" 2>&1
  echo "part $part: rc $? (124: cut at $left s) at $(( $(date +%s) - T0 )) s, $(ls "$OUT/part$part.json" 2>/dev/null || echo 'no JSON')" | tee -a "$OUT/run.log"
done
ls "$OUT"/part*.json > /dev/null 2>&1 && \
  python3 "$PACK/splitsum.py" report "$OUT"/part*.json --manifest "$W/kernels/manifest.json" > "$OUT/table.md" 2> "$OUT/report.err"
cut -c1-260 "$OUT/table.md" 2>/dev/null
for f in "$OUT"/*.log; do [ $(stat -c %s "$f") -gt 300000 ] && tail -c 300000 "$f" > "$f.tail" && mv "$f.tail" "$f"; done
rm -rf "$W"
echo "splitsum done in $(( $(date +%s) - T0 )) s" | tee -a "$OUT/run.log"; ls -la "$OUT"
