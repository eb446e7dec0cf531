#!/bin/bash
# Issue 39 item 4 (heur, held-out check): the 21 suite layers (f16) whose sm_90a plan the rules moved, each
# with the plan now and the plan before, and cuDNN, through the measuring server (one process, NaN fences, float64
# checks, CUPTI kernel time). Run: PACK=.art/heur/next OUT=<dir> bash .art/heur/next/run.sh
# Fallback where the server gave no results: the child-a-problem runner on three of them.
set -u
PACK=${PACK:-.art/heur/next}
OUT=${OUT:?OUT must name the results folder}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site_heur2 "$PACK"/wheel/*.whl || { echo "wheel install failed"; exit 1; }
export PYTHONPATH=/tmp/site_heur2:/tmp/site
WORK=/tmp/heur_work2
rm -rf "$WORK" && mkdir -p "$WORK" && tar xzf "$PACK/probe.tgz" -C "$WORK"
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm,power.limit --format=csv > "$OUT/card.txt" 2>&1
cat "$OUT/card.txt"
t0=$(date +%s)
timeout 400 python3 -m convbw_mlir.measure.run "$WORK/heur_probe" --server --timeout 60 --out "$OUT/results.json" > "$OUT/server.log" 2>&1
rc=$?
echo "server run: rc $rc, $(( $(date +%s) - t0 )) s"
if [ $rc -ne 0 ] || [ ! -s "$OUT/results.json" ]; then
  tail -40 "$OUT/server.log"
  for f in regnet_y_400mf.trunk_output.block2 vgg16.features.10 repvgg_a2; do
    timeout 120 python3 -m convbw_mlir.measure.run "$WORK/heur_probe" --filter "$f" --timeout 60 \
      --out "$OUT/classic_$f.json" > "$OUT/classic_$f.log" 2>&1
    echo "classic $f: rc $?"
    [ -s "$OUT/classic_$f.json" ] && python3 "$PACK/heur_probe.py" report "$OUT/classic_$f.json" "$WORK/heur_probe/manifest.json"
  done
else
  python3 "$PACK/heur_probe.py" report "$OUT/results.json" "$WORK/heur_probe/manifest.json" | tee "$OUT/table.md"
fi
tail -c 200000 "$OUT/server.log" > "$OUT/server.tail.log" && rm -f "$OUT/server.log"
echo "total $(( $(date +%s) - t0 )) s"
