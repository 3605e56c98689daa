#!/usr/bin/env bash
# One device call on the lent H200 that produced the GPU results of benchmarks/RESULTS.md:
#   1. GPU tests: real `tuner search` + planted crash, attention() runtime, S=30272 validations
#   2. a real search over both families for the shipped table db/tables/h200.yaml
#   3. `tuner bench` of the winners against the default, torch SDPA and cuDNN FP8
# Run (device tool, kit staged with --with-cudnn):  bash benchmarks/h200_session.sh
# Each step has its own time limit so one overrun cannot cost the rest; logs land in $OUT.
set -u
source .device/env.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export TUNER_HOME=/tmp/tuner TUNER_CACHE_DIR=/tmp/tuner-cache
DB="sqlite:///$OUT/h200.sqlite"

timeout "${TEST_S:-240}" python3 -m pytest -m gpu -q -s -p no:cacheprovider \
  tests/gpu/test_search_gpu.py tests/gpu/test_runtime_gpu.py \
  tests/gpu/test_mma_sync_gpu.py::test_target_shape \
  tests/gpu/test_wgmma_gpu.py::test_best_configs_at_video_dit_shape \
  > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$?"; tail -n 25 "$OUT/gpu_tests.log"

timeout "${SEARCH_S:-220}" python3 -m tuner search --gpu h200 --families wgmma,mma_sync \
  --seq-lens 1024,2048,4096,8192,16384,30272 --heads 56 --trials "${TRIALS:-8}" \
  --time-budget "${BUDGET:-25}" --seed 0 --db "$DB" --json > "$OUT/search.json" 2> "$OUT/search.log"
echo "search rc=$?"; tail -n 5 "$OUT/search.log"
python3 -m tuner export --gpu h200 --db "$DB" --out "$OUT/h200.yaml" && head -c 600 "$OUT/h200.yaml"

timeout "${BENCH_S:-110}" python3 -m tuner bench --gpu h200 --seq-lens 4096,30272 \
  --against default,sdpa,cudnn-fp8 --db "$DB" --markdown "$OUT/bench.md" > "$OUT/bench.log" 2>&1
echo "bench rc=$?"; cat "$OUT/bench.md" 2>/dev/null || tail -n 20 "$OUT/bench.log"
