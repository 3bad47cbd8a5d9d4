#!/usr/bin/env bash
# Run the benchmarks on the GPU machine, one after the other, each under a time limit; a failing
# benchmark is logged and the others still run. Results: one JSON per benchmark in $OUT (default
# benchmarks/results/<date>-<commit>-<bench>-<gpu> from harness.run_folder_name, e.g.
# 20261206-894df79-classification-h100; several benchmarks joined by "+", the four "gpu-suite",
# "-8cores" after the bench under taskset -c 0-7), logs in $OUT/logs, results.md (tables) and ledger.jsonl.
#
#   benchmarks/run_gpu.sh                          # all four (about 22 minutes: split it, see README)
#   benchmarks/run_gpu.sh classification           # about 7 minutes
#   benchmarks/run_gpu.sh yolo                     # about 7-8 minutes
#   benchmarks/run_gpu.sh transforms overhead      # about 7 minutes
#
# Environment: OUT, PYTHON (python3), PO_BENCH_TOTAL_S (wall guard for this call, default 575 s),
# PO_BENCH_ARGS (extra arguments for every script, e.g. "--rounds 2"), PO_BENCH_ARGS_<name> (one
# script's own, instead of PO_BENCH_ARGS), PO_COMMIT (when .git is absent).
set -u
cd "$(dirname "$0")/.."
COMMIT="${PO_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
export PO_COMMIT="$COMMIT"
PY="${PYTHON:-python3}"
TOTAL="${PO_BENCH_TOTAL_S:-575}"
ARGS="${PO_BENCH_ARGS:-}"
export PIPELINE_OPT_CACHE="${PIPELINE_OPT_CACHE:-/tmp/pipeline_opt_cache}"
export PYTHONUNBUFFERED=1
BENCHES="${*:-classification yolo transforms overhead}"
if [ -z "${OUT:-}" ]; then
  # shellcheck disable=SC2086
  name=$("$PY" -m benchmarks.harness --folder-name $BENCHES) \
    || name="$(date -u +%Y%m%d)-${COMMIT:0:7}-$(echo $BENCHES | tr ' _' '+-')-unknown"
  OUT="benchmarks/results/$name"
fi
mkdir -p "$OUT/logs"

cap() {  # the most seconds one benchmark may take (its own budget is below this)
  case "$1" in
    classification) echo 520 ;; yolo) echo 560 ;; transforms) echo 150 ;; overhead) echo 300 ;; yolo_gap) echo 420 ;; yolo_decide) echo 300 ;; yolo_trainer) echo 560 ;; batch_size) echo 450 ;; *) echo 300 ;;
  esac
}

start=$(date +%s)
status=()
for b in $BENCHES; do
  left=$(( TOTAL - ($(date +%s) - start) ))
  limit=$(cap "$b"); [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -lt 30 ]; then
    echo "[run_gpu] bench_$b skipped: only ${left}s left of the ${TOTAL}s guard"
    status+=("bench_$b: skipped (time guard)")
    continue
  fi
  echo "[run_gpu] bench_$b (limit ${limit}s) -> $OUT/logs/bench_$b.log"
  t0=$(date +%s)
  own="PO_BENCH_ARGS_$b"  # e.g. PO_BENCH_ARGS_yolo_gap="--rows default_(": this benchmark's own, replacing PO_BENCH_ARGS
  args="${!own-$ARGS}"
  # shellcheck disable=SC2086
  timeout -k 15 "$limit" "$PY" -m "benchmarks.bench_$b" --out "$OUT" $args > "$OUT/logs/bench_$b.log" 2>&1
  rc=$?
  dt=$(( $(date +%s) - t0 ))
  if [ "$rc" -eq 0 ]; then
    status+=("bench_$b: ok (${dt}s)")
  else
    [ "$rc" -eq 124 ] && why="killed by the ${limit}s limit" || why="exit status $rc"
    status+=("bench_$b: FAILED, $why (${dt}s)")
    echo "[run_gpu] bench_$b failed ($why); last lines of its log:"
    tail -n 15 "$OUT/logs/bench_$b.log"
  fi
done

echo
"$PY" -m benchmarks.harness "$OUT" --ledger "$OUT/ledger.jsonl" || echo "[run_gpu] summary failed"
echo
printf '%s\n' "${status[@]}"
echo "[run_gpu] results in $OUT ($(( $(date +%s) - start ))s)"
