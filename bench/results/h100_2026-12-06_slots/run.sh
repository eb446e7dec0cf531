#!/bin/bash
# slots (issue 37, branch slots): the tensor-map slots of the sm_90a direct launch are now a bounded pool a kernel
# (cuda_launch.MapSlots; the C++ plan alike), reused once a CUDA event says the GPU read them. Never run on a GPU.
# What it measures, most important first (a run cut short keeps the first stages; each writes its own files):
#   1. py_check   right under reuse, Python path: ResNet-50 bf16 batch 64, each of its 53 dW computed 6 times on new
#                 inputs queued back to back, unbounded pool then 2 slots a kernel (reuse every few calls, waits
#                 where the GPU still reads): NaN-fenced, bit for bit the unbounded path's, within ours'+torch's
#                 documented tolerance of torch's dW (bench/map_slots.py check; exit 1 = not ok)
#   2. py_steps   memory flat: two ResNet-50 copies training in turns (memory moves), every dW ours, 200 steps with
#                 2 slots a kernel; free device memory, torch's reserved, slots, encodings every 10 steps
#   3. build      the C++ hot path (built on first use, ~22 s on an H100 host)
#   4. cxx_check  as 1 through the C++ kernel launching the schedule itself (CONVBW_TORCH_NATIVE_LAUNCH=1): its pool
#   5. py_steps_unbounded  as 2 with an unbounded pool (the path before the fix), 100 steps: the contrast
#   6. cxx_steps  as 2 through the C++ launch
#   7. ts_check   bench/train_step.py check (C++ launch vs Python, bit for bit, NaN-fenced) with 2 slots a kernel
# Kernels: .art/host37/ts (carried by the lead with this pack). One measuring process at a time, no overlap.
#   PACK=.art/slots OUT=<dir> bash .art/slots/run.sh      (from the repo root)
set -u
T0=$(date +%s)
LIMIT=82  # seconds the stages may take (budget 90 s: install and summary included); a stage that would not fit is skipped
el() { echo $(( $(date +%s) - T0 )); }
mkdir -p "$OUT"
S=$OUT/summary.txt
ART=$PWD/.art/host37/ts
if [ ! -d "$ART/sm_90a" ]; then echo "no kernels at $ART: carry .art/host37 with this pack (NOTE.txt)" | tee $S; exit 2; fi
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site_slots $PACK/wheel/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site_slots:/tmp/site
export CONVBW_ARTIFACTS=$ART CONVBW_CACHE_DIR=/tmp/cb_slots CONVBW_TORCH_NATIVE_DIR=/tmp/native_slots
MS="python3 -P $PACK/bench/map_slots.py"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -P -c "import torch, convbw_mlir.cuda_launch as c; print('torch', torch.__version__, 'convbw_mlir from', c.__file__, 'MapSlots', hasattr(c, 'MapSlots'))"
} 2>&1 | tee $S
# stage NAME EST NATIVE ARGS...: skipped when it would not finish within LIMIT; killed at what is left
stage() {
  local name=$1 est=$2 nat=$3; shift 3
  local left=$(( LIMIT - $(el) ))
  if (( est > left )); then echo "$name: skipped (est $est s, $left s left)" | tee -a $S; return; fi
  local s=$(date +%s)
  CONVBW_TORCH_NATIVE=$nat timeout -k 5 $left "$@" > $OUT/$name.log 2>&1
  echo "$name: rc=$? $(( $(date +%s) - s )) s (elapsed $(el) s)" | tee -a $S
  grep -E "check ok|^[0-9]+ steps,|^cap |weight gradients" $OUT/$name.log | cut -c1-400 | tee -a $S
}
L="env CONVBW_TORCH_NATIVE_LAUNCH=1"  # C++ launches DirectCall's schedule itself (its own pool)
stage py_check 22 0 $MS check --slots 2 --repeats 6 --json $OUT/py_check.json
stage py_steps 16 0 env CONVBW_TENSOR_MAP_SLOTS=2 $MS steps --steps 200 --json $OUT/py_steps.json
stage build 28 1 python3 -P -c "import sys; from convbw_mlir.torch import native; sys.exit(native.load() is None)"
stage cxx_check 20 1 $L $MS check --native --slots 2 --repeats 6 --json $OUT/cxx_check.json
stage py_steps_unbounded 12 0 env CONVBW_TENSOR_MAP_SLOTS=1000000 $MS steps --steps 100 --json $OUT/py_steps_unbounded.json
stage cxx_steps 16 1 $L env CONVBW_TENSOR_MAP_SLOTS=2 $MS steps --native --steps 200 --json $OUT/cxx_steps.json
stage ts_check 15 1 $L env CONVBW_TENSOR_MAP_SLOTS=2 python3 -P $PACK/bench/train_step.py check --model resnet50 --batch 64 --repeats 4 --json $OUT/ts_check.json
echo "total $(el) s" | tee -a $S
