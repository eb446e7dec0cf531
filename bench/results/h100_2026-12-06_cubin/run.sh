#!/bin/bash
# cubin (issue 39 item 2): where the measuring server's ~3 s a problem go, and whether ahead-of-time cubins
# (ptxas's SASS in place of PTX, branch cubin) remove the driver's JIT from them.
#
# What it measures, most important first (a run cut short still leaves the first rows; each step writes its
# files into $OUT as it ends):
#   1. load/   bench/kernel_load.py: every kernel image of the two folders loaded by cuModuleLoadData in one
#              process on a fresh driver cache: cold (the JIT of PTX) then warm (the cache); the driver's
#              registers / spills / shared memory of each kernel, PTX against cubin (must be equal).
#   2. rate/   bench/tune_rate.py run (the measuring server, no cuDNN: the issue's 20.3/min protocol) on the same
#              8 problems (the first 8 of the zootune rate set) and the same candidates, compiled twice:
#              cubin_cold, ptx_cold (each on a fresh CUDA_CACHE_PATH), then ptx_warm, cubin_warm (the same
#              cache again). The order gives any warm-up advantage to PTX, not to the cubins.
#              Each writes tune_rate.json (problems a minute, the phases summed: load, reference, timing ...)
#              and server.json (every row, its per-problem `phases` record, kernel times).
#   3. compare.{json,md}: the runs side by side; kernel_s of each against ptx_cold (the cubin must not change
#              the kernel: same time within noise).
# One measuring process at a time (no --jobs); the server NaN-fences and float64-checks every candidate.
# Run from the repo root: PACK=.art/cubin OUT=<dir> bash .art/cubin/run.sh
set -u
T0=$(date +%s)
PACK=$(cd "$PACK" && pwd)
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
BUDGET=$(cat "$PACK/ESTIMATE")
MARGIN=8
left() { echo $(( BUDGET - MARGIN - ($(date +%s) - T0) )); }
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site_cubin "$PACK"/wheel/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site_cubin:/tmp/site
export PYTHONSAFEPATH=1   # `python -m` children (the server) must import the wheel, not the checkout's convbw_mlir
ART=/tmp/cubin_art
rm -rf "$ART" && mkdir -p "$ART"
python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$PACK/art.tar.xz" "$ART" \
  || { echo "cannot unpack $PACK/art.tar.xz"; exit 1; }
cd "$ART"   # nothing of the checkout on sys.path
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader | tee "$OUT/card.txt"
python3 -c "import convbw_mlir, sys; print('convbw_mlir from', convbw_mlir.__file__, sys.version.split()[0])" \
  | tee -a "$OUT/card.txt"
grep -q site_cubin "$OUT/card.txt" || { echo "not the wheel's convbw_mlir: stop"; exit 1; }
echo "ready after $(( $(date +%s) - T0 )) s"

# 1. module loads, PTX vs cubin, cold then warm (no kernel runs)
mkdir -p "$OUT/load"
CUDA_CACHE_PATH=$(mktemp -d /tmp/nvcache.XXXX) timeout -k 5 40 python3 "$PACK/kernel_load.py" "$ART/ptx" "$ART/cubin" \
  --out "$OUT/load/load.json" > "$OUT/load/log.txt" 2>&1
echo "load rc=$? after $(( $(date +%s) - T0 )) s"; tail -4 "$OUT/load/log.txt"

# 2. the server's rate, PTX vs cubin, cold and warm driver cache
CACHE_CUBIN=$(mktemp -d /tmp/nvcache.XXXX)
CACHE_PTX=$(mktemp -d /tmp/nvcache.XXXX)
for run in cubin_cold ptx_cold ptx_warm cubin_warm; do
  L=$(left)
  [ "$L" -lt 30 ] && { echo "stop before $run: $L s left"; break; }
  kind=${run%_*}
  cache=$CACHE_PTX; [ "$kind" = cubin ] && cache=$CACHE_CUBIN
  mkdir -p "$OUT/rate/$run"
  CUDA_CACHE_PATH=$cache timeout -k 5 $(( L < 45 ? L : 45 )) python3 "$PACK/tune_rate.py" run "$ART/$kind" \
    --out "$OUT/rate/$run" --classic 0 > "$OUT/rate/$run/log.txt" 2>&1
  echo "$run rc=$? after $(( $(date +%s) - T0 )) s (cache $(du -sh "$cache" | cut -f1))"; tail -3 "$OUT/rate/$run/log.txt"
done

# 3. side by side
python3 "$PACK/tune_rate.py" compare "$OUT"/rate/ptx_cold "$OUT"/rate/cubin_cold "$OUT"/rate/ptx_warm \
  "$OUT"/rate/cubin_warm --out "$OUT/compare.json" > "$OUT/compare.log" 2>&1
cat "$OUT/compare.log"
echo "cubin done in $(( $(date +%s) - T0 )) s"; du -sh "$OUT"
