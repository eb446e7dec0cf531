#!/bin/bash
# Issue 37 item 2, the whole-model table (model x mode x batch): for each row of $ROWS (default $PACK/rows.txt,
# priority order), bench/train_step.py trains one model in one process, four copies from one seed in turns step by
# step (torch; ours = enable(benchmark=False), every dW ours; default = enable(), ours per layer only where it
# measured faster than cuDNN's wgrad; torch again with cudnn.benchmark = torch's own spread), bf16 autocast,
# channels-last, SGD lr 1e-3, 50 steps (10 warm-up): median step time, host time a step, device time by kind (3
# profiled steps), calls ours / torch's and why, losses. torch.compile rows run torch, default, torch again (each
# side compiles its own copy). Before a model x batch's first row: train_step.py check --python (every dW of one
# step ours, NaN-fenced: a dW nobody wrote shows; distance to torch's). The Python switch (the default path).
#   PACK=.art/modeltable1 OUT=<dir> bash .art/modeltable1/run.sh   (repo root; H100/H200; one measuring process)
# A row that would not finish within LIMIT is skipped (OUT/rows/<row>.skipped says so) and the next, smaller, tried;
# each row's JSON lands in OUT/rows as it finishes and OUT/table.md is rewritten after each: a run killed at the
# call's limit keeps what it measured.
set -u
T0=$(date +%s)
LIMIT=${LIMIT:-530}  # seconds this pack may take in all (its budget: 540)
ROWS=${ROWS:-$PACK/rows.txt}
NAME=$(basename "$PACK")
el() { echo $(( $(date +%s) - T0 )); }
mkdir -p "$OUT/rows"
S=$OUT/summary.txt
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site_$NAME $PACK/wheel/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site_$NAME:/tmp/site
rm -rf /tmp/ts_$NAME && mkdir -p /tmp/ts_$NAME && tar -xJf $PACK/kernels.tar.xz -C /tmp/ts_$NAME
# verdicts (the default's per-layer measurements) kept across this pack's rows, as a user's later processes keep them
export CONVBW_ARTIFACTS=/tmp/ts_$NAME CONVBW_CACHE_DIR=/tmp/cb_$NAME CONVBW_TORCH_NATIVE=0
TS="python3 -P $PACK/bench/train_step.py"
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader
  python3 -P -c "import torch, convbw_mlir; print('torch', torch.__version__, 'convbw_mlir from', convbw_mlir.__file__)"
  echo "kernels: $(find /tmp/ts_$NAME -mindepth 3 -maxdepth 3 -name op.json | wc -l), set up in $(el) s; rows: $ROWS, limit $LIMIT s"
} 2>&1 | tee $S
checked=" "
while read -r model batch mode sides est <&3; do
  case "$model" in ''|'#'*) continue ;; esac
  stem=${model}_${batch}_${mode}
  check=0
  if [[ "$checked" != *" ${model}_$batch "* ]]; then check=15; [ "$model" = unet_sd ] && check=25; fi
  left=$(( LIMIT - $(el) ))
  if (( est + check > left )); then
    echo "est $est s (+ check $check s), $left s left in this pack" > $OUT/rows/$stem.skipped
    echo "$stem: skipped (est $est+$check s, $left s left)" | tee -a $S; continue
  fi
  if (( check )); then
    s=$(date +%s)
    timeout -k 5 $(( left - est )) $TS check --python --model $model --batch $batch --repeats 2 \
      --json $OUT/check_${model}_$batch.json > $OUT/check_${model}_$batch.log 2>&1 < /dev/null
    echo "check ${model}_$batch: rc=$? $(( $(date +%s) - s )) s; $(tail -1 $OUT/check_${model}_$batch.log | cut -c1-300)" | tee -a $S
    checked="$checked${model}_$batch "
  fi
  left=$(( LIMIT - $(el) ))
  s=$(date +%s)
  # run kills its row's process at --timeout (nothing of it stays on the GPU); the outer timeout is a backstop
  timeout -k 5 $(( left + 10 )) $TS run --out $OUT/rows --models $model --batches $batch --modes $mode \
    --steps 50 --warmup 10 --sides $sides --timeout $left > $OUT/rows/$stem.run.txt 2>&1 < /dev/null
  echo "$stem: rc=$? $(( $(date +%s) - s )) s (est $est; elapsed $(el) s)" | tee -a $S
  $TS table $OUT/rows > $OUT/table.md 2>&1
  grep -F "| $model | $batch | $mode |" $OUT/table.md | head -1 | cut -c1-250
done 3< "$ROWS"
cat $OUT/table.md
# many small files: one tarball (a run killed before here leaves them as files, as good)
tar -czf $OUT/rows.tgz -C $OUT rows && rm -rf $OUT/rows
echo "total $(el) s" | tee -a $S
