#!/bin/bash
# Issue 39 item 1: the --jobs claims re-measured with one measuring process on the GPU. From the repo root:
#   PACK=.art/remeasure OUT=<dir> bash .art/remeasure/run.sh
# (the pack: wheel/ of branch remeasure, remeasure.py and bench/{hopper_conv,explicit_conv,harness,classes}.py of
# the branch, kernels.tar.xz: remeasure/<group>/ of `bench/remeasure.py compile` and hc13/ of
# `hopper_conv.py compile --product --only <the 13>`)
# 1. bench/remeasure.py run: each claim group through one persistent measuring server (measure.run --server's
#    path), one group after another; a group starts only while its projected end is within the budget.
# 2. If time is left: hopper_conv.py run --jobs 1 on the suite's 13 dense layers (the claim's own script and
#    protocol, one child at a time), to tell the protocol's share from --jobs's in any change.
set -u
PACK=${PACK:-.art/remeasure}
OUT=${OUT:?OUT must name the results folder}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
PACK=$(cd "$PACK" && pwd)
t0=$(date +%s)
rm -rf /tmp/site_remeasure  # a warm machine may hold an older wheel there: --target never replaces it
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site_remeasure $PACK/wheel/*.whl
export PYTHONPATH=/tmp/site_remeasure:/tmp/site
ART=$(mktemp -d /tmp/remeasure_art.XXXX)
tar -xJf $PACK/kernels.tar.xz -C "$ART"
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv
  nvidia-smi --query-compute-apps=pid,name,used_memory --format=csv
  python3 -c "import torch, convbw_mlir; print('torch', torch.__version__, 'cudnn', torch.backends.cudnn.version(), convbw_mlir.__file__)"
} > "$OUT/gpu.txt" 2>&1
echo "setup: $(( $(date +%s) - t0 )) s" | tee "$OUT/run.log"
timeout --kill-after=5 290 python3 $PACK/remeasure.py run "$ART/remeasure" --out "$OUT/results" --budget 240 \
    >> "$OUT/run.log" 2>&1
echo "remeasure run: exit $? after $(( $(date +%s) - t0 )) s" | tee -a "$OUT/run.log"
left=$(( 312 - ($(date +%s) - t0) ))
if [ $left -gt 40 ]; then
  mkdir -p "$OUT/hopper13"
  ( cd $PACK/bench && timeout --kill-after=5 $left python3 hopper_conv.py run "$ART/hc13" --out "$OUT/hopper13" \
      --budget $(( left - 25 )) --jobs 1 > "$OUT/hopper13/log.txt" 2>&1 )
  echo "hopper_conv --jobs 1: exit $? after $(( $(date +%s) - t0 )) s" | tee -a "$OUT/run.log"
else
  echo "hopper_conv --jobs 1: skipped ($left s left)" | tee -a "$OUT/run.log"
fi
grep -E "^[a-z0-9]+: " "$OUT/run.log" | tail -12
python3 $PACK/remeasure.py summary "$OUT/results" 2>&1 | tail -12
tail -5 "$OUT/hopper13/hopper_conv.md" 2>/dev/null
rm -rf "$ART"
