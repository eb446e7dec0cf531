#!/bin/bash
# classthin (issue 40, the per-class table's thin class again): the 13 thin layers of .art/classtable's table (the
# classes suite's 5 and 8 zoo layers, 7 of them held back), f16 and bf16, 26 rows, each the product's UNTUNED
# sm_90a plan against cuDNN in the same process. Why: the classtable run (bench/results/h100_2026-12-06_class_table)
# timed these rows on the sm_80 kernel (mma.sync: thin geomean 0.65, 2 layers below 0.5); since main's thin90fix
# merge the wgmma boxed form is the plan of all 13 (docs/decisions.md#wgmma-groups), never timed in this table.
# Kernels compiled on the CPU machine for sm_90a by
#   .venv/bin/python bench/class_table.py compile ART --classes thin --workers 2        (branch classthin; COMMIT)
# The rows keep the whole table's keys and order (004-..., 012-..., ...089-...), so each compares one to one.
# How it measures: the same as .art/classtable: bench/class_table.py run = the product's runner in its one-process
# form (convbw_mlir.measure.run server=True): every kernel checked against float64 (256-entry sample) with NaN
# placed after x and dy, then timed by CUPTI (kernel time a call, every kernel of the call summed), cuDNN checked and
# timed after it in the same process; one measuring process, one timing at a time, no --jobs. Each finished row is
# appended to $OUT/rows.jsonl as it comes. After the table, compare.md: each key against the whole table's row
# (the checkout's bench/results/h100_2026-12-06_class_table/rows.jsonl), then and now.
# Run from the repo root:  PACK=.art/classthin OUT=<dir> bash .art/classthin/run.sh
set -u
ROOT=$(pwd)
PACK=$(cd "${PACK:?PACK must name the pack folder}" && pwd)
OUT=${OUT:?OUT must name the results folder}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
T0=$(date +%s)
BUDGET=$(cat "$PACK/ESTIMATE")   # seconds this pack may use in all
MARGIN=20                        # the report, the comparison, a slow exit
rm -rf /tmp/site_classthin       # a warm machine may hold an older wheel there: --target never replaces it
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site_classthin "$PACK"/wheel/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site_classthin:/tmp/site
export PYTHONSAFEPATH=1          # never the checkout's convbw_mlir (main): the wheel's (zootune's lesson)
export OMP_NUM_THREADS=4 OPENBLAS_NUM_THREADS=4 MKL_NUM_THREADS=4
W=/tmp/classthin_work
rm -rf "$W" && mkdir -p "$W"
python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$PACK/art.tar.xz" "$W" \
  || { echo "cannot unpack $PACK/art.tar.xz" | tee "$OUT/run.log"; exit 1; }
cd "$W"                          # not the repo root: the measuring children import the wheel's convbw_mlir
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,temperature.gpu,utilization.gpu --format=csv,noheader
  nvidia-smi --query-compute-apps=pid,name,used_memory --format=csv,noheader
  python3 -c "import torch, convbw_mlir; print('torch', torch.__version__, 'cudnn', torch.backends.cudnn.version(), 'convbw_mlir from', convbw_mlir.__file__)"
} > "$OUT/card.txt" 2>&1
CARD=$(head -1 "$OUT/card.txt" | cut -d, -f1)
cp "$PACK/COMMIT" "$OUT/COMMIT" 2>/dev/null
cp "$W/art/manifest.json" "$OUT/manifest.json" 2>/dev/null   # the plans timed (small: 26 rows)
echo "setup: $(( $(date +%s) - T0 )) s, $(python3 -c "import json,sys; print(len(json.load(open(sys.argv[1]))['problems']))" "$W/art/manifest.json") rows in the manifest; $(cat "$OUT/card.txt" | head -1)" | tee "$OUT/run.log"
LEFT=$(( BUDGET - MARGIN - ($(date +%s) - T0) ))
timeout -k 5 "$LEFT" python3 "$PACK/class_table.py" run "$W/art" --out "$OUT" >> "$OUT/run.log" 2>&1
RC=$?
touch "$OUT/rows.jsonl"           # a run that measured nothing still reports (no rows)
ROWS=$(wc -l < "$OUT/rows.jsonl")
echo "run: rc=$RC (124: cut at $LEFT s) after $(( $(date +%s) - T0 )) s, $ROWS rows measured" | tee -a "$OUT/run.log"
R="$OUT/results.json"; [ -f "$R" ] || R="$OUT/rows.jsonl"   # the whole results where the run finished
python3 "$PACK/class_table.py" report "$R" --card "$CARD" \
  --command "PACK=.art/classthin OUT=OUT bash .art/classthin/run.sh (= python3 class_table.py run ART --out OUT)" \
  > "$OUT/table.md" 2> "$OUT/report.err"
sed -n '/^| class/,/^$/p' "$OUT/table.md"
# then (the whole table's row of the same key: the sm_80 kernel) and now, by key; stdlib only
THEN="$ROOT/bench/results/h100_2026-12-06_class_table/rows.jsonl"
python3 - "$PACK" "$OUT/rows.jsonl" "$THEN" > "$OUT/compare.md" 2>> "$OUT/report.err" <<'PY'
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import class_table as ct
now = [json.loads(s) for s in Path(sys.argv[2]).read_text().splitlines() if s.strip()]
then = {r["key"]: r for r in (json.loads(s) for s in Path(sys.argv[3]).read_text().splitlines() if s.strip())}
def ratio(r):
    o, c = ct.kernel_us(r, "convbw"), ct.kernel_us(r, "cudnn")
    return c / o if o and c else None
def kern(r):
    return r.get("contenders", {}).get("convbw", {}).get("config", {}).get("kernel", "-")
print("| key | kernel then | ours then µs | cuDNN then µs | cuDNN/ours then | kernel now | ours now µs "
      "| cuDNN now µs | cuDNN/ours now | ours then/now |")
print("|---" * 10 + "|")
for r in now:
    t = then.get(r["key"], {})
    o0, o1 = ct.kernel_us(t, "convbw"), ct.kernel_us(r, "convbw")
    print(f"| {r['key']} | {kern(t)} | {ct._status(t, 'convbw')} | {ct._status(t, 'cudnn')} | {ct._f(ratio(t))} "
          f"| {kern(r)} | {ct._status(r, 'convbw')} | {ct._status(r, 'cudnn')} | {ct._f(ratio(r))} "
          f"| {ct._f(o0 / o1 if o0 and o1 else None)} |")
PY
echo "rows with a WRONG contender (ours or cuDNN): $(grep -c '"status": "WRONG"' "$OUT/rows.jsonl")"
echo "rows on the boxed form (kernel wgmma merge): $(grep -c '"kernel": "wgmma merge' "$OUT/rows.jsonl") of $ROWS"
tail -3 "$OUT/run.log" | cut -c1-200
rm -rf "$W"
echo "classthin done in $(( $(date +%s) - T0 )) s"; ls -la "$OUT"
