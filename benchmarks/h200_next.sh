#!/usr/bin/env bash
# The GPU runs behind benchmarks/RESULTS.md (2026-11-29, second session), in device calls that each
# fit the 10-minute limit: re-run them to reproduce. One step per call
# (carry [".device"]; the kit staged with --with-cudnn for step C). Compiled kernels go to
# .tuner-cache/ in the checkout (git-ignored, so a warm device machine keeps it between calls):
# step A compiles both sm_90a spaces there in parallel once, and every later process loads the
# builds from disk (variants/build.py) instead of compiling one by one.
#   bash benchmarks/h200_next.sh A   # compile both spaces; disk-reload test; every feasible config
#                                    # of both families against the reference (issues 3, 5, 6)
#   bash benchmarks/h200_next.sh B   # issue 3: seed ladder at 4096 + 30272, all configs at 30272
#   bash benchmarks/h200_next.sh D   # issue 6: the whole wgmma space timed; rest of B's table
#   bash benchmarks/h200_next.sh E   # issue 7: --workers 1 on one GPU; the search GPU test again
#   bash benchmarks/h200_next.sh F   # issue 6 (next session): v_layout=kernel validated + timed
#   bash benchmarks/h200_next.sh G   # issue 6 (fourth session): the whole wgmma space with
#                                    # v_layout=kernel compiled and checked against the reference
#   bash benchmarks/h200_next.sh H   # issue 6: prepare + kernel for both V layouts, side by side
#   bash benchmarks/h200_next.sh I   # issue 8, on nvidia-h200-x2: --workers 2 vs 1, warm cache
#   bash benchmarks/h200_next.sh J   # fma_exp2: the space compiled, its fma_exp2 > 0 configs
#                                    # against the reference
#   bash benchmarks/h200_next.sh K   # head_dim 64 searched, exported beside the shipped table,
#                                    # benched against the peers
#   bash benchmarks/h200_next.sh C   # issue 4: exhaustive mma_sync search at 4096 (TPE replay and
#                                    # the all-config 4096 table come from its DB on the CPU), the
#                                    # 30-trial cost split (cold cache); issue 7: bench test
# Afterwards, on the CPU:
#   python benchmarks/tpe_vs_exhaustive.py --db sqlite:///<OUT>/exhaustive.sqlite --seq-len 4096
set -u
source .device/env.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export TUNER_HOME=/tmp/tuner TUNER_CACHE_DIR=$PWD/.tuner-cache
DEADLINE=$(( $(date +%s) + ${BUDGET_S:-585} ))
# Each command gets at most its own cap and never runs past the call's deadline.
capped() { local cap=$1; shift; local left=$(( DEADLINE - $(date +%s) ))
  (( left < cap )) && cap=$left; (( cap < 5 )) && { echo "skipped (no time left): $*"; return 124; }
  timeout "$cap" "$@"; }
step=${1:?step A, B or C}
case "$step" in
A)
  for fam in mma_sync wgmma; do
    capped 200 python3 -m tuner space --gpu h200 --family "$fam" --compile --jobs 16 \
      > "$OUT/space_$fam.txt" 2>&1; echo "space $fam rc=$?"; tail -n 4 "$OUT/space_$fam.txt"
  done
  capped 120 python3 -m pytest -m gpu -q -s -p no:cacheprovider tests/gpu/test_build_cache_gpu.py \
    > "$OUT/build_cache.log" 2>&1; echo "build cache rc=$?"; grep -E "load from|passed|failed" "$OUT/build_cache.log"
  for fam in mma_sync wgmma; do
    capped 300 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE "tests/gpu/test_${fam}_gpu.py" \
      > "$OUT/gpu_$fam.log" 2>&1; echo "gpu $fam rc=$?"; tail -n 6 "$OUT/gpu_$fam.log"
  done
  ;;
B)
  capped 120 python3 -m tuner space --gpu h200 --family mma_sync --compile --jobs 16 \
    > "$OUT/space_mma_sync.txt" 2>&1; echo "space rc=$?"
  capped 150 python3 benchmarks/mma_sync_h200.py --configs ladder --seq-lens 4096 30272 \
    > "$OUT/mma_ladder.md" 2>&1; echo "ladder rc=$?"; cat "$OUT/mma_ladder.md"
  capped 450 python3 benchmarks/mma_sync_h200.py --configs all --seq-lens 30272 --reps 5 \
    > "$OUT/mma_all_30272.md" 2>&1; echo "all rc=$?"; sort -k2 -n "$OUT/mma_all_30272.md" | head -n 8
  ;;
C)
  capped 300 python3 -m tuner search --gpu h200 --families mma_sync --seq-lens 4096 --heads 56 \
    --trials 400 --patience 0 --seed 0 --db "sqlite:///$OUT/exhaustive.sqlite" --json \
    > "$OUT/exhaustive.json" 2> "$OUT/exhaustive.log"; echo "exhaustive rc=$? (a re-run resumes)"
  tail -n 3 "$OUT/exhaustive.log"
  # The cost of a first search: a cold compile cache (a fresh one on every run).
  TUNER_CACHE_DIR=$(mktemp -d) capped 200 python3 -m tuner search --gpu h200 --seq-lens 4096 \
    --heads 56 --trials 30 --patience 0 --seed 1 --db "sqlite:///$OUT/cost.sqlite" --json \
    > "$OUT/cost.json" 2> "$OUT/cost.log"; echo "cost search rc=$?"
  python3 benchmarks/search_cost.py --db "sqlite:///$OUT/cost.sqlite" --seq-len 4096
  capped 200 python3 -m pytest -m gpu -q -s -p no:cacheprovider tests/gpu/test_bench_gpu.py \
    > "$OUT/bench_test.log" 2>&1; echo "bench test rc=$?"; grep -E "^S=|passed|failed" "$OUT/bench_test.log"
  capped 60 python3 -m tuner search --gpu h200 --workers 1 --seq-lens 2048 --heads 56 \
    --trials 6 --db "sqlite:///$OUT/workers1.sqlite" --json > "$OUT/workers1.json" \
    2> "$OUT/workers1.log"; echo "workers=1 rc=$?"
  ;;
D)
  # issue 6: the whole wgmma space validated and timed at S=8192, the best three beside the peers;
  # issue 3: the rest of the mma_sync S=30272 table (step B stopped after its first 68 rows).
  capped 150 python3 -m tuner space --gpu h200 --compile --jobs 16 > "$OUT/space.txt" 2>&1
  echo "space rc=$?"; tail -n 2 "$OUT/space.txt" | cut -c1-300
  command -v ncu || echo "no ncu on this machine"
  capped 300 python3 benchmarks/wgmma_h200.py --search --out "$OUT" > "$OUT/wgmma_search.log" 2>&1
  echo "wgmma search rc=$?"; tail -n 12 "$OUT/wgmma_search.log"
  capped 250 python3 benchmarks/mma_sync_h200.py --configs all --seq-lens 30272 --skip 68 \
    > "$OUT/mma_all_30272_rest.md" 2>&1; echo "all rest rc=$?"; grep -c "^| block" "$OUT/mma_all_30272_rest.md"
  ;;
E)
  # issue 7/8: one-GPU run of the multi-worker mode; the store must hold every trial once.
  capped 100 python3 -m tuner search --gpu h200 --workers 1 --seq-lens 2048 --heads 56 \
    --trials 6 --db "sqlite:///$OUT/workers1.sqlite" --json > "$OUT/workers1.json" \
    2> "$OUT/workers1.log"; echo "workers=1 rc=$?"; tail -n 3 "$OUT/workers1.log"
  python3 -m tuner show --gpu h200 --db "sqlite:///$OUT/workers1.sqlite" --trials 2048 --json \
    > "$OUT/workers1_trials.json" 2>&1; echo "show rc=$?"
  capped 120 python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_search_gpu.py \
    > "$OUT/search_gpu.log" 2>&1; echo "search gpu test rc=$?"; tail -n 2 "$OUT/search_gpu.log"
  rm -f "$OUT"/*.lock
  ;;
F)
  # issue 6, next session: v_layout=kernel on the GPU (built and CPU-checked, never run yet),
  # then timed beside the default (v_layout=prepared) at 8192 and 30272 in one run.
  capped 200 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE tests/gpu/test_wgmma_gpu.py \
    -k v_layout_kernel > "$OUT/v_kernel.log" 2>&1; echo "v_layout=kernel rc=$?"
  tail -n 5 "$OUT/v_kernel.log"
  capped 300 python3 benchmarks/wgmma_h200.py --seq-lens 8192,30272 --no-peers --out "$OUT" \
    --configs '[{"consumer_wgs": 2, "block_n": 128, "kv_stages": 2, "p_source": "registers",
      "intra_wg_overlap": true, "pingpong": true, "persistent": true, "v_layout": "kernel"}]' \
    > "$OUT/v_kernel_time.log" 2>&1; echo "timing rc=$?"; grep -E "S=8192|^\|" "$OUT/v_kernel_time.log"
  ;;
G)
  capped 200 python3 -m tuner space --gpu h200 --family wgmma --compile --jobs 16 \
    > "$OUT/space_wgmma.txt" 2>&1; echo "space wgmma rc=$?"; tail -n 4 "$OUT/space_wgmma.txt"
  capped 380 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE tests/gpu/test_wgmma_gpu.py \
    -k "kernel and not prepared" > "$OUT/gpu_wgmma_vkernel.log" 2>&1
  echo "gpu wgmma v_layout=kernel rc=$?"; tail -n 4 "$OUT/gpu_wgmma_vkernel.log"
  ;;
H)
  capped 500 python3 benchmarks/v_layout_h200.py --out "$OUT" > "$OUT/v_layout.log" 2>&1
  echo "v_layout rc=$?"; tail -n 14 "$OUT/v_layout.log"
  ;;
I)
  # issue 8 on the two-GPU machine: the same search with --workers 2 and --workers 1, both
  # after the compile cache is warm (so neither pays the compiles the other skips). Fourth
  # session (reduced, 281 s of device time left): BUDGET_S=215 TRIALS=6 (both in one call).
  # The run needs two calls on one warm machine, e.g.
  #   SEQ_LENS=4096,8192,16384,30272 TRIALS=24 WORKERS=2 bash benchmarks/h200_next.sh I
  #   SKIP_WARM=1 SEQ_LENS=4096,8192,16384,30272 TRIALS=24 WORKERS=1 bash benchmarks/h200_next.sh I
  # Fifth session: the wgmma space is 3x larger (fma_exp2): warming both spaces took ~160 s
  # with 16 jobs on the one-GPU machine; WORKERS=none warms only, e.g. three calls: warm,
  # --workers 2, --workers 1.
  nvidia-smi -L
  if [ -z "${SKIP_WARM:-}" ]; then
    capped 300 python3 -m tuner space --gpu h200 --compile --jobs 32 > "$OUT/space.txt" 2>&1
    echo "space rc=$?"; tail -n 1 "$OUT/space.txt" | cut -c1-200
  fi
  for w in ${WORKERS:-2 1}; do
    [ "$w" = none ] && continue
    t0=$(date +%s)
    capped 560 python3 -m tuner search --gpu h200 --workers "$w" --seq-lens "${SEQ_LENS:-4096,8192}" \
      --heads 56 --trials "${TRIALS:-8}" --patience 0 --seed 1 --db "sqlite:///$OUT/w$w.sqlite" \
      --json > "$OUT/w$w.json" 2> "$OUT/w$w.log"
    echo "workers=$w rc=$? wall=$(( $(date +%s) - t0 )) s"; tail -n 2 "$OUT/w$w.log"
  done
  rm -f "$OUT"/*.lock
  ;;
J)
  # fifth session: fma_exp2 (exponentials on the FMA pipe). The whole space compiled (spills
  # counted), then every feasible config with fma_exp2 1 or 2 against the reference (fma_exp2=0
  # builds the kernels of step G byte for byte) and the targeted shapes.
  capped 260 python3 -m tuner space --gpu h200 --family wgmma --compile --jobs 16 \
    > "$OUT/space_wgmma.txt" 2>&1; echo "space wgmma rc=$?"; tail -n 2 "$OUT/space_wgmma.txt" | cut -c1-400
  python3 -m pytest -m gpu -q --collect-only -p no:cacheprovider tests/gpu/test_wgmma_gpu.py \
    2> "$OUT/collect.err" | grep -E "^tests/.*fma_exp2=[12]" > "$OUT/fma_ids.txt"
  mapfile -t ids < "$OUT/fma_ids.txt"; echo "${#ids[@]} space ids"
  (( ${#ids[@]} > 0 )) || { echo "no fma_exp2 test ids collected:"; tail -n 5 "$OUT/collect.err"; exit 1; }
  capped 300 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE "${ids[@]}" \
    "tests/gpu/test_wgmma_gpu.py::test_fma_exp2_against_reference" \
    "tests/gpu/test_wgmma_gpu.py::test_head_dim_64" > "$OUT/gpu_wgmma_fma.log" 2>&1
  echo "gpu wgmma fma_exp2 rc=$?"; tail -n 4 "$OUT/gpu_wgmma_fma.log"
  ;;
K)
  # fifth session: a tuned head_dim-64 table (where fma_exp2 pays), merged into the shipped one:
  # import db/tables/h200.yaml, search head_dim 64, export both, bench tuned vs default vs peers.
  DB="sqlite:///$OUT/table.sqlite"
  python3 -m tuner import db/tables/h200.yaml --db "$DB"; echo "import rc=$?"
  capped 420 python3 -m tuner search --gpu h200 --head-dim 64 --heads 56 \
    --seq-lens "${SEQ_LENS:-4096,8192,16384,30272}" --trials "${TRIALS:-24}" \
    --time-budget "${LEN_BUDGET:-90}" --seed 1 --db "$DB" --json > "$OUT/hd64.json" 2> "$OUT/hd64.log"
  echo "search rc=$?"; tail -n 3 "$OUT/hd64.log"
  python3 -m tuner export --gpu h200 --db "$DB" --out "$OUT/h200.yaml"; echo "export rc=$?"
  capped 120 python3 -m tuner bench --gpu h200 --head-dim 64 --heads 56 --against default,sdpa,cudnn-fp8 \
    --seq-lens "${SEQ_LENS:-4096,8192,16384,30272}" --db "$DB" > "$OUT/bench_hd64.md" 2>&1
  echo "bench rc=$?"; cat "$OUT/bench_hd64.md" | tail -n 12
  ;;
*) echo "unknown step $step"; exit 2 ;;
esac
