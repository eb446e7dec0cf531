#!/bin/bash
# heldnow2 (issue 39 goal 1, prepared 2026-12-06 by the zoo2 helper; not yet run): on one GPU, one measuring process
# at a time, every candidate + cuDNN (NaN fences, float64 check: the tuner's server) of the 45 held-out zoo problem-types
# (bench/zoo_split.json) whose plan today was not among the candidates timed on 2026-12-06 (kernels built at zootune
# 7462f12): is today's plan within 10% of the best? (bench/results/h100_2026-12-06_zootune2: 43 of 57 measured.)
# Kernels: `bench/zoo_tune.py compile --names bench/results/h100_2026-12-06_zootune2/plan_moved_held_out.txt
# --chunk 15` on the CPU machine (branch zoo2: main c3080cd's plan rules). Candidates: today's plan, 3 neighbours,
# IREE's fusilli form (not on 1x1s), the GPU reference.
# Run from the repo root: PACK=.art/heldnow2 OUT=<dir> bash .art/heldnow2/run.sh   (ESTIMATE: 180 s)
set -u
T0=$(date +%s)
PACK=$(cd "$PACK" && pwd); mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site_heldnow2 "$PACK"/wheel/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site_heldnow2:/tmp/site PYTHONSAFEPATH=1   # the wheel, never the checkout
ART=/tmp/heldnow2_art; rm -rf "$ART"; mkdir -p "$ART"
tar xJf "$PACK/art.tar.xz" -C "$ART" || { echo "cannot unpack"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader | tee "$OUT/card.txt"
python3 -c "import convbw_mlir; print('convbw_mlir from', convbw_mlir.__file__)" | tee -a "$OUT/card.txt"
cd /tmp
for c in "$ART"/moved/c*; do
  L=$(( 175 - ($(date +%s) - T0) ))
  [ "$L" -lt 25 ] && { echo "stop before $(basename "$c"): $L s left"; break; }
  mkdir -p "$OUT/moved/$(basename "$c")"
  timeout -k 5 "$L" python3 -m convbw_mlir.dispatch.tune "$c" --out "$OUT/moved/$(basename "$c")/results.json" \
    --server --cudnn --deadline $(( L * 62 / 100 )) > "$OUT/moved/$(basename "$c")/log.txt" 2>&1
  echo "$(basename "$c") rc=$? after $(( $(date +%s) - T0 )) s: $(tail -1 "$OUT/moved/$(basename "$c")/log.txt")"
done
echo "heldnow2 done in $(( $(date +%s) - T0 )) s"
