#!/bin/bash
# zootune (issue 39 items 2-3): the tuning rate (bench/tune_rate.py: 16 problems through the measuring server,
# 3 through the child-a-problem runner), then zoo groups (60 problems each) through
# `python -m convbw_mlir.dispatch.tune --server --cudnn` until the budget ($PACK/ESTIMATE) is spent.
# Run from the repo root: PACK=.art/zootune OUT=<dir> bash .art/zootune/run.sh
set -u
T0=$(date +%s)
BUDGET=$(cat "$PACK/ESTIMATE")          # seconds this pack may use in all
RATE_S=90                              # the rate bench's cap
MARGIN=25                              # kept for the tarball and a slow exit
NAME=$(basename "$PACK")               # zootune or zootune2
ART=/tmp/${NAME}_art                   # the kernels, unpacked (xz: PTX text packs ~19x)
python3 -m pip install -q --no-index --no-deps --no-compile --target "/tmp/site_$NAME" "$PACK"/wheel/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site_$NAME:/tmp/site
mkdir -p "$OUT"
rm -rf "$ART" && mkdir -p "$ART"
python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$PACK/art.tar.xz" "$ART" \
  || { echo "cannot unpack $PACK/art.tar.xz"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader | tee "$OUT/card.txt"
python3 -c "import convbw_mlir; print('convbw_mlir from', convbw_mlir.__file__)" | tee -a "$OUT/card.txt"
echo "unpacked after $(( $(date +%s) - T0 )) s: $(ls "$ART/zoo" | wc -l) groups"
left() { echo $(( BUDGET - MARGIN - ($(date +%s) - T0) )); }

# 1. the rate: the server (no cuDNN: the issue's figure) and the runner on the same problems
if [ -d "$ART/rate" ] && [ -z "${SKIP_RATE-1}" ]; then  # measured 2026-12-06 call 4: skipped unless SKIP_RATE=""
  timeout -k 5 $RATE_S python3 "$PACK/tune_rate.py" run "$ART/rate" --out "$OUT/rate" --classic 3 > "$OUT/rate.log" 2>&1
  echo "rate rc=$? after $(( $(date +%s) - T0 )) s"; tail -6 "$OUT/rate.log"
fi

# 2. zoo groups: pass 1 (cuDNN timed after each problem's candidates) stops starting problems at the deadline;
# pass 2 (the close top two again) follows; a group starts only with time for some of it
for c in "$ART"/zoo/g*; do
  L=$(left)
  [ "$L" -lt 45 ] && { echo "stop before $(basename "$c"): $L s left"; break; }
  D=$(( L * 62 / 100 ))                # pass 2 and the servers' starts take the rest
  name=$(basename "$c")
  case " ${DONE_GROUPS-g00 g01 g02 g03 g04} " in *" $name "*) echo "skip $name: measured before (DONE_GROUPS)"; continue;; esac
  mkdir -p "$OUT/zoo/$name"
  PYTHONSAFEPATH=1 timeout -k 5 "$L" python3 -m convbw_mlir.dispatch.tune "$c" --out "$OUT/zoo/$name/results.json" --server --cudnn \
    --deadline "$D" > "$OUT/zoo/$name/log.txt" 2>&1
  echo "$name rc=$? deadline $D s, after $(( $(date +%s) - T0 )) s: $(tail -1 "$OUT/zoo/$name/log.txt")"
done
cd "$OUT" && tar czf zoo.tgz zoo rate 2>/dev/null && rm -rf zoo rate
echo "$NAME done in $(( $(date +%s) - T0 )) s"; ls -la "$OUT"
