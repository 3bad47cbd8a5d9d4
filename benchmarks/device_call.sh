#!/usr/bin/env bash
# One call on the lent GPU machine: install the carried wheels, then run the named steps.
#   benchmarks/device_call.sh cuda-tests classification       (the first call)
#   benchmarks/device_call.sh yolo                            (the second call; transforms overhead: the third)
#   benchmarks/device_call.sh worker-stages yolo_trainer      (yolo_worker_stages, then a benchmark)
#   benchmarks/device_call.sh cuda-tests replay-parity classification   (PO_BENCH_ARGS_classification="--pipeline train")
# carry [".whl"] (kornia, ultralytics wheels) and, for the Pillow-SIMD rows, ".whl_simd".
# Results go to $OUT/bench.tgz (the benchmark folder) and $OUT/*.log, so few files come back; the last
# line names the folder to unpack bench.tgz into: benchmarks/results/<date>-<commit>-<bench>-<gpu>.
set -u
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || { echo "wheel install failed"; exit 1; }
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 PO_COMMIT="${PO_COMMIT:-unknown}"
# a Pillow-SIMD wheel (benchmarks/build_pillow_simd_wheel.sh) goes to its own site directory: only
# bench_transforms' child process imports it, next to the stock Pillow rows
for w in .whl_simd/*.whl; do
  [ -f "$w" ] || continue
  python3 -m zipfile -e "$w" /tmp/simd && export PO_PILLOW_SIMD_DIR=/tmp/simd || echo "pillow-simd unpack failed"
done
export YOLO_OFFLINE=1 YOLO_AUTOINSTALL=0
export PIPELINE_OPT_CACHE="${PIPELINE_OPT_CACHE:-/tmp/pipeline_opt_cache}"  # run_gpu.sh's default: one dataset copy
BENCH_DIR=/tmp/po_bench
mkdir -p "$BENCH_DIR"
benches=()
named=()  # what the results folder holds: the benchmarks, and worker-stages' JSON
for step in "$@"; do
  case "$step" in
    cuda-tests) timeout -k 10 "${PO_TEST_LIMIT_S:-150}" python3 -m pytest tests -m cuda -q -rs -p no:cacheprovider \
                  > "$OUT/cuda_tests.log" 2>&1; echo "cuda tests rc=$?"; tail -n 25 "$OUT/cuda_tests.log" ;;
    # the random-augmentation replay against torchvision on the device: error per op, ms per batch
    replay-parity) timeout -k 10 "${PO_PARITY_LIMIT_S:-90}" python3 -m pipeline_opt.transforms.replay_parity --device cuda \
                  --n 16 > "$OUT/replay_parity.log" 2>&1; echo "replay parity rc=$?"; tail -n 30 "$OUT/replay_parity.log" ;;
    # the workers' CPU per stage and a DataLoader's images/s (no GPU used); PO_STAGES_ARGS replaces the defaults
    worker-stages) # shellcheck disable=SC2086
                  timeout -k 10 "${PO_STAGES_LIMIT_S:-300}" python3 -m benchmarks.yolo_worker_stages \
                    --out "$BENCH_DIR/worker_stages" ${PO_STAGES_ARGS:---loader-batches 30 --workers 8} \
                    > "$OUT/worker_stages.log" 2>&1; echo "worker stages rc=$?"; tail -n 20 "$OUT/worker_stages.log"
                  named+=(yolo_worker_stages) ;;
    *) benches+=("$step"); named+=("$step") ;;
  esac
done
if [ "${#benches[@]}" -gt 0 ]; then
  OUT="$BENCH_DIR" benchmarks/run_gpu.sh "${benches[@]}"
fi
tar czf "$OUT/bench.tgz" -C "$BENCH_DIR" . 2>/dev/null
cat "$BENCH_DIR/results.md" 2>/dev/null | head -60
if [ "${#named[@]}" -gt 0 ]; then
  name=$(python3 -m benchmarks.harness --folder-name "${named[@]}") \
    && echo "[device_call] results folder: benchmarks/results/$name" \
    || echo "[device_call] no results folder name (benchmarks.harness --folder-name failed)"
fi
