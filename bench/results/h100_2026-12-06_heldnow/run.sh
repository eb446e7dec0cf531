#!/bin/bash
# heldnow (issue 39, prepared 2026-12-06 by the lead; not yet run): on one GPU, one measuring process at a time,
# every candidate + cuDNN (NaN fences, float64 check: the tuner's server) of
#  1. moved: the 4 held-out zoo problems (bench/zoo_split.json) whose plan moved after the 2026-12-06 tuning run
#     (two depthwise by dw90, two 1x1s by the sm90 cost rules): is today's plan within 10% of the best?
#  2. se64, se128: the 17 squeeze-excite 1x1s of that run (1x1 maps) at batch 64 and 128: where does rule
#     short-reduction-codegen (reduction <= 32 today) stop paying? (codegen vs our kernels at reductions 64 and 128)
# Kernels: `bench/zoo_tune.py compile --names {moved,se}_names.txt [--batch 64|128]` on the CPU machine (main + the rule).
# Run from the repo root: PACK=.art/heldnow OUT=<dir> bash .art/heldnow/run.sh   (ESTIMATE: 170 s)
set -u
T0=$(date +%s)
PACK=$(cd "$PACK" && pwd); mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site_heldnow "$PACK"/wheel/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site_heldnow:/tmp/site PYTHONSAFEPATH=1   # the wheel, never the checkout
ART=/tmp/heldnow_art; rm -rf "$ART"; mkdir -p "$ART"
tar xJf "$PACK/art.tar.xz" -C "$ART" || { echo "cannot unpack"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader | tee "$OUT/card.txt"
cd /tmp
for g in moved se64 se128; do
  for c in "$ART/$g"/c*; do
    L=$(( 165 - ($(date +%s) - T0) ))
    [ "$L" -lt 25 ] && { echo "stop before $g: $L s left"; break 2; }
    mkdir -p "$OUT/$g"
    timeout -k 5 "$L" python3 -m convbw_mlir.dispatch.tune "$c" --out "$OUT/$g/results.json" --server --cudnn \
      --deadline $(( L * 62 / 100 )) > "$OUT/$g/log.txt" 2>&1
    echo "$g rc=$? after $(( $(date +%s) - T0 )) s: $(tail -1 "$OUT/$g/log.txt")"
  done
done
echo "heldnow done in $(( $(date +%s) - T0 )) s"
