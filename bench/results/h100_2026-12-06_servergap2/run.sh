#!/bin/bash
# Issue 39, the server gap: the measuring server (convbw_mlir/measure/server.py) timed our largest kernels 10-25%
# slower than the one-child runner protocol (large_3x3_256_n64_56 sm_80 866.6 vs 702.2 us, H100, 2026-12-06).
# This measures the same kernels (5 problems: 3 large layers, 2 small controls; ours sm_90a + our sm_80 + cuDNN)
# by three paths, one measuring process at a time, in the order a b c c b a (drift shows between a path's runs):
#   a = measure.run, a child a problem (--jobs 1)      b = the server as it was (kernel_each=False, quiet_host=False)
#   c = the server as fixed on branch servergap (each candidate's CUPTI time right after its wall clock, a warm
#       call first, as a's children; CPU workers at nice 19)
# nvidia-smi (clocks.sm, clocks.mem, temperature, power, throttle reasons) every 200 ms through the whole run and
# before/after each path: tests the clock/thermal hypothesis. Each path's rows land in $OUT as it ends.
# From the repo root:   PACK=.art/servergap OUT=<dir> bash .art/servergap/run.sh      (~145 s, ESTIMATE)
set -u
PACK=${PACK:-.art/servergap}
OUT=${OUT:?OUT must name the results folder}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
PACK=$(cd "$PACK" && pwd)
t0=$(date +%s)
rm -rf /tmp/site_servergap  # a warm machine may hold an older wheel there: --target never replaces it
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site_servergap $PACK/wheel/*.whl
export PYTHONPATH=/tmp/site_servergap:/tmp/site
ART=$(mktemp -d /tmp/servergap_art.XXXX)
tar -xJf $PACK/kernels.tar.xz -C "$ART"
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit,memory.total --format=csv
  nvidia-smi --query-compute-apps=pid,name,used_memory --format=csv
  python3 -c "import torch, convbw_mlir; print('torch', torch.__version__, 'cudnn', torch.backends.cudnn.version(), convbw_mlir.__file__)"
} > "$OUT/gpu.txt" 2>&1
echo "setup: $(( $(date +%s) - t0 )) s" | tee "$OUT/run.log"
# budget 120 s for the paths (none starts that would end past it); they are cut at 135 s, the call ends by ~150 s
timeout --kill-after=5 135 python3 $PACK/servergap.py run "$ART/servergap" --out "$OUT/results" --budget 120 \
    >> "$OUT/run.log" 2>&1
echo "servergap run: exit $? after $(( $(date +%s) - t0 )) s" | tee -a "$OUT/run.log"
python3 $PACK/servergap.py table "$OUT/results" > "$OUT/table.md" 2>&1
grep -E "^[0-9][abc] " "$OUT/run.log"
sed -n '/Kernel time/,/Wall clock/p' "$OUT/table.md" | head -30
rm -rf "$ART"
