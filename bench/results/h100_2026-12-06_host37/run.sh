#!/bin/bash
# host37 (issue 37 item 3): the C++ hot path's graph launch from C++ vs the Python switch, whole models, H100/H200.
# PACK=.art/host37 OUT=<dir> bash .art/host37/run.sh   (from the repo root; one measuring process at a time)
set -u
T0=$(date +%s)
LIMIT=190  # seconds of device time this pack may take (budget 200)
el() { echo $(( $(date +%s) - T0 )); }
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site_host37 $PACK/wheel/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site_host37:/tmp/site
export CONVBW_ARTIFACTS=$PWD/$PACK/ts CONVBW_CACHE_DIR=/tmp/cb_host37 CONVBW_TORCH_NATIVE_DIR=/tmp/native_host37
TS="python3 -P $PACK/bench/train_step.py"
S=$OUT/summary.txt
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader
  python3 -P -c "import torch, convbw_mlir; print('torch', torch.__version__, 'convbw_mlir from', convbw_mlir.__file__)"
} 2>&1 | tee $S
# stage NAME EST NATIVE ARGS...: skipped when it would not finish within LIMIT; killed at what is left
stage() {
  local name=$1 est=$2 nat=$3; shift 3
  local left=$(( LIMIT - $(el) ))
  if (( est > left )); then echo "$name: skipped (est $est s, $left s left)" | tee -a $S; return; fi
  local s=$(date +%s)
  CONVBW_TORCH_NATIVE=$nat timeout -k 5 $left "$@" > $OUT/$name.log 2>&1
  echo "$name: rc=$? $(( $(date +%s) - s )) s (elapsed $(el) s)" | tee -a $S
  tail -4 $OUT/$name.log | cut -c1-400
}
# the C++ extension, built on first use (counted)
stage build 60 1 python3 -P -c "import sys; from convbw_mlir.torch import native; sys.exit(native.load() is None)"
stage r50_eager_cxx 40 1 $TS run --out $OUT/cxx --models resnet50 --batches 64 --modes eager --steps 30 --warmup 8 --timeout 170
stage r50_eager_python 35 0 $TS run --out $OUT/python --models resnet50 --batches 64 --modes eager --steps 30 --warmup 8 --timeout 170
# the C++ path's dW bit for bit the Python path's, finite (NaN fence), its graphs launched from C++
stage r50_check 30 1 $TS check --model resnet50 --batch 64 --repeats 5 --json $OUT/check_resnet50.json
stage r50_reduce_overhead_cxx 70 1 $TS run --out $OUT/cxx --models resnet50 --batches 64 --modes reduce-overhead --steps 20 --warmup 8 --sides torch,ours_bench --timeout 170
stage effnet_eager_cxx 35 1 $TS run --out $OUT/cxx --models efficientnet_b0 --batches 64 --modes eager --steps 30 --warmup 8 --timeout 170
stage effnet_eager_python 35 0 $TS run --out $OUT/python --models efficientnet_b0 --batches 64 --modes eager --steps 30 --warmup 8 --timeout 170
stage r50_compile_cxx 60 1 $TS run --out $OUT/cxx --models resnet50 --batches 64 --modes compile --steps 20 --warmup 8 --sides torch,ours_bench --timeout 170
for d in cxx python; do [ -d $OUT/$d ] && $TS table $OUT/$d > $OUT/$d.md 2>&1; done
echo "== C++ (CONVBW_TORCH_NATIVE=1)"; cat $OUT/cxx.md 2>/dev/null
echo "== Python"; cat $OUT/python.md 2>/dev/null
echo "total $(el) s" | tee -a $S
