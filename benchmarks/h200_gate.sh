#!/usr/bin/env bash
# The GPU runs behind the correctness-gate section of benchmarks/RESULTS.md (issue 14), one step
# per device call (carry [".device"]); compiled kernels go to .tuner-cache/ in the checkout
# (git-ignored, so a warm machine keeps them between calls).
#   bash benchmarks/h200_gate.sh P   # QK^T accumulator probe; planted bugs (GPU tests and a real
#                                    # search); the gate's cost; both sm_90a spaces compiled
#   bash benchmarks/h200_gate.sh S   # no-false-reject sweep: every feasible config of both
#                                    # spaces at S = 1, 77, 4097; the best three at S = 30272
#   bash benchmarks/h200_gate.sh V   # after the merges of the sixth session: planted bugs again,
#                                    # mma_sync space (pv_accum=fp16 added) compiled and swept,
#                                    # the GPU tests of issues 18 and 20, the crashing double in a
#                                    # real search, the build cache, the gate's cost
#   bash benchmarks/h200_gate.sh F   # final: the search package on the GPU (search, bench and
#                                    # runtime tests), the planted search again, the best configs
#                                    # at S = 30272 and the gate's cost with sampled rows
#   bash benchmarks/h200_gate.sh R   # after the review commit (prepare, gate inputs): prepare's
#                                    # and the planted GPU tests, both families' targeted tests
set -u
source .device/env.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export TUNER_HOME=/tmp/tuner TUNER_CACHE_DIR=$PWD/.tuner-cache PYTHONUNBUFFERED=1
DEADLINE=$(( $(date +%s) + ${BUDGET_S:-580} ))
capped() { local cap=$1; shift; local left=$(( DEADLINE - $(date +%s) ))
  (( left < cap )) && cap=$left; (( cap < 5 )) && { echo "skipped (no time left): $*"; return 124; }
  timeout "$cap" "$@"; }
case "${1:?step P or S}" in
P)
  capped 120 python3 benchmarks/qk_accum_h200.py --out "$OUT" > "$OUT/qk_accum.log" 2>&1
  echo "probe rc=$?"; cat "$OUT/qk_accum.log" | tail -n 40
  capped 150 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE tests/gpu/test_gate_gpu.py \
    > "$OUT/planted_gpu.log" 2>&1; echo "planted gpu rc=$?"; tail -n 12 "$OUT/planted_gpu.log"
  capped 120 python3 -m tuner search --gpu h200 --families tests.doubles.planted_wgmma \
    --seq-lens 4097 --heads 8 --db "sqlite:///$OUT/planted.sqlite" --json \
    > "$OUT/planted_search.json" 2> "$OUT/planted_search.log"; echo "planted search rc=$?"
  python3 -m tuner show --gpu h200 --db "sqlite:///$OUT/planted.sqlite" --trials 4097 \
    > "$OUT/planted_trials.txt" 2>&1; cat "$OUT/planted_trials.txt" | cut -c1-250
  capped 150 python3 benchmarks/gate_cost.py > "$OUT/gate_cost.md" 2>&1
  echo "gate cost rc=$?"; cat "$OUT/gate_cost.md"
  for fam in mma_sync wgmma; do
    capped 240 python3 -m tuner space --gpu h200 --family "$fam" --compile --jobs 16 \
      > "$OUT/space_$fam.txt" 2>&1; echo "space $fam rc=$?"; tail -n 3 "$OUT/space_$fam.txt" | cut -c1-200
  done
  rm -f "$OUT"/*.lock
  ;;
S)
  for fam in mma_sync wgmma; do
    capped 400 python3 benchmarks/gate_sweep.py --family "$fam" --procs 14 --out "$OUT" \
      > "$OUT/sweep_$fam.log" 2>&1; echo "sweep $fam rc=$?"; head -n 30 "$OUT/sweep_$fam.log"
  done
  capped 200 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE tests/gpu/test_wgmma_gpu.py \
    tests/gpu/test_mma_sync_gpu.py -k "best or target_shape" > "$OUT/best_30272.log" 2>&1
  echo "best at 30272 rc=$?"; tail -n 6 "$OUT/best_30272.log"
  ;;
V)
  capped 100 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE tests/gpu/test_gate_gpu.py \
    > "$OUT/planted_gpu.log" 2>&1; echo "planted gpu rc=$?"; tail -n 3 "$OUT/planted_gpu.log"
  capped 150 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE tests/gpu/test_compile_gpu.py \
    tests/gpu/test_runtime_gpu.py tests/gpu/test_build_cache_gpu.py > "$OUT/i18_gpu.log" 2>&1
  echo "issue 18 + runtime gpu rc=$?"; tail -n 15 "$OUT/i18_gpu.log"
  capped 150 python3 -m tuner space --gpu h200 --family mma_sync --compile --jobs 16 \
    > "$OUT/space_mma_sync.txt" 2>&1; echo "space mma_sync rc=$?"; tail -n 2 "$OUT/space_mma_sync.txt" | cut -c1-300
  capped 150 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE tests/gpu/test_mma_sync_gpu.py \
    -k "pv_accum or run_writes" > "$OUT/i20_gpu.log" 2>&1; echo "issue 20 gpu rc=$?"; tail -n 6 "$OUT/i20_gpu.log"
  capped 150 python3 benchmarks/gate_sweep.py --family mma_sync --procs 14 --out "$OUT" \
    > "$OUT/sweep_mma_sync.log" 2>&1; echo "sweep mma_sync rc=$?"; head -n 12 "$OUT/sweep_mma_sync.log"
  capped 200 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE tests/gpu/test_search_gpu.py \
    > "$OUT/search_gpu.log" 2>&1; echo "search gpu rc=$?"; tail -n 4 "$OUT/search_gpu.log"
  capped 100 python3 benchmarks/gate_cost.py > "$OUT/gate_cost.md" 2>&1
  echo "gate cost rc=$?"; cat "$OUT/gate_cost.md"
  ;;
F)
  capped 240 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE tests/gpu/test_search_gpu.py \
    tests/gpu/test_bench_gpu.py tests/gpu/test_runtime_gpu.py tests/gpu/test_gate_gpu.py \
    > "$OUT/final_gpu.log" 2>&1; echo "search/bench/runtime/planted gpu rc=$?"; tail -n 3 "$OUT/final_gpu.log"
  capped 90 python3 -m tuner search --gpu h200 --families tests.doubles.planted_wgmma \
    --seq-lens 4097 --heads 8 --db "sqlite:///$OUT/planted.sqlite" --json \
    > "$OUT/planted_search.json" 2> "$OUT/planted_search.log"; echo "planted search rc=$?"
  python3 -m tuner show --gpu h200 --db "sqlite:///$OUT/planted.sqlite" --trials 4097 --json \
    > "$OUT/planted_trials.json" 2>&1; echo "show rc=$?"
  capped 100 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE tests/gpu/test_wgmma_gpu.py \
    -k best > "$OUT/best_30272.log" 2>&1; echo "best at 30272 rc=$?"; tail -n 2 "$OUT/best_30272.log"
  capped 100 python3 benchmarks/gate_cost.py > "$OUT/gate_cost.md" 2>&1
  echo "gate cost rc=$?"; cat "$OUT/gate_cost.md"
  rm -f "$OUT"/*.lock
  ;;
R)
  capped 90 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE tests/test_prepare.py \
    tests/test_quantize_kernel.py tests/gpu/test_gate_gpu.py tests/gpu/test_runtime_gpu.py \
    > "$OUT/r_prepare_gate.log" 2>&1; echo "prepare+planted+runtime rc=$?"; tail -n 2 "$OUT/r_prepare_gate.log"
  capped 110 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE tests/gpu/test_mma_sync_gpu.py \
    -k "not sm90_space" > "$OUT/r_mma.log" 2>&1; echo "mma_sync targeted rc=$?"; tail -n 2 "$OUT/r_mma.log"
  capped 110 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE tests/gpu/test_wgmma_gpu.py \
    -k "not feasible_space" > "$OUT/r_wgmma.log" 2>&1; echo "wgmma targeted rc=$?"; tail -n 2 "$OUT/r_wgmma.log"
  ;;
esac
