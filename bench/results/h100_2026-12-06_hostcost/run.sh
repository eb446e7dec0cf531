#!/bin/bash
# hostcost (issue 37 item 3, branch hostcost): the torch switch's host cost a weight-gradient call, goal <= 15 us.
# What it measures, most important first (a run cut short keeps the first rows; each stage writes its own files):
#   1. build      the C++ hot path (convbw_mlir/torch/native), built on first use (~22 s on an H100 host)
#   2. r50_check  right first: every dW of a ResNet-50 bf16 batch-64 step alone, C++ launching DirectCall's schedule
#                 itself (CONVBW_TORCH_NATIVE_LAUNCH=1, never run on a GPU before) vs the Python switch bit for bit,
#                 NaN-fenced (bench/train_step.py check; exit 1 = a dW differs or is not finite)
#   3-6. hc_*     one model training alone (its memory repeats step to step, as a user's loop): torch, ours, torch
#                 again in one process (torch twice: its spread), eager bf16 autocast channels-last batch 64;
#                 host us a call over torch's, step times, where the host time goes (bench/host_cost.py):
#                 ResNet-50 C++ launch, ResNet-50 Python, EfficientNet-B0 C++ launch, EfficientNet-B0 Python
#   7-8. ts_r50_* bench/train_step.py run: three copies in turns (torch, ours, torch2), whose memory moves call to
#                 call (new tensor maps encoded): ResNet-50 C++ launch, then Python (the branch's faster encoder)
#   9. stub_cpu   bench/host_path.py on this host's CPU, the driver stubbed (no GPU work): the CPU figure here, to
#                 tell the Python/C++ part of the GPU figures from the driver's
# Kernels: .art/host37/ts (sm_90a/sm_80, carried by the lead with this pack). One measuring process at a time.
#   PACK=.art/hostcost OUT=<dir> bash .art/hostcost/run.sh      (from the repo root)
set -u
T0=$(date +%s)
LIMIT=185  # seconds of device time the stages may take (budget 200, install and summary included)
el() { echo $(( $(date +%s) - T0 )); }
mkdir -p "$OUT"
S=$OUT/summary.txt
ART=$PWD/.art/host37/ts
if [ ! -d "$ART/sm_90a" ]; then echo "no kernels at $ART: carry .art/host37 with this pack (NOTE.txt)" | tee $S; exit 2; fi
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site_hostcost $PACK/wheel/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site_hostcost:/tmp/site
export CONVBW_ARTIFACTS=$ART CONVBW_CACHE_DIR=/tmp/cb_hostcost CONVBW_TORCH_NATIVE_DIR=/tmp/native_hostcost
TS="python3 -P $PACK/bench/train_step.py"
HC="python3 -P $PACK/bench/host_cost.py --steps 16"
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
  grep -E "host us a call|check ok|^our calls|^(torch|ours) +step|\| (resnet50|efficientnet_b0) " $OUT/$name.log | cut -c1-300 | tee -a $S
}
L="env CONVBW_TORCH_NATIVE_LAUNCH=1"  # the C++ hot path launches DirectCall's schedule itself (no graph, no Python)
stage build 30 1 python3 -P -c "import sys; from convbw_mlir.torch import native; sys.exit(native.load() is None)"
stage r50_check 20 1 $L $TS check --model resnet50 --batch 64 --repeats 4 --json $OUT/r50_check.json
stage hc_r50_launch 30 1 $L $HC --native --model resnet50 --out $OUT/hc_r50_launch
stage hc_r50_python 30 0 $HC --model resnet50 --out $OUT/hc_r50_python
stage hc_eff_launch 30 1 $L $HC --native --model efficientnet_b0 --out $OUT/hc_eff_launch
stage hc_eff_python 30 0 $HC --model efficientnet_b0 --out $OUT/hc_eff_python
stage ts_r50_launch 25 1 $L $TS run --out $OUT/ts_launch --models resnet50 --batches 64 --modes eager --steps 24 --warmup 6 --sides torch,ours,torch2 --timeout 100
stage ts_r50_python 25 0 $TS run --out $OUT/ts_python --models resnet50 --batches 64 --modes eager --steps 24 --warmup 6 --sides torch,ours,torch2 --timeout 100
stage stub_cpu 20 1 python3 -P $PACK/bench/host_path.py --artifacts $ART --passes 8 --no-profile --out $OUT/host_path_cpu.json
for d in ts_launch ts_python; do [ -d $OUT/$d ] && $TS table $OUT/$d > $OUT/$d.md 2>&1; done
echo "total $(el) s" | tee -a $S
