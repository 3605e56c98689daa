#!/usr/bin/env bash
# The GPU work still open after 2026-11-29, in device calls that each fit the 10-minute limit.
# Run one step per device call (carry [".device"]; stage the kit with --with-cudnn for step 4):
#   bash benchmarks/h200_next.sh 1   # issue 3: chunk_elems + smem-P re-check, seed ladder, all configs
#   bash benchmarks/h200_next.sh 2   # issue 4: exhaustive mma_sync search at S=4096 (then TPE replay)
#   bash benchmarks/h200_next.sh 3   # issue 4: 30-trial search cost split (both families)
#   bash benchmarks/h200_next.sh 4   # issue 7: tuner bench vs direct timing; --workers 1
#   bash benchmarks/h200_next.sh 5   # issue 6: every feasible wgmma config at S=1, 77, 4096
# Logs and databases land in $OUT; the TPE replay (step 2) runs on the CPU afterwards:
#   python benchmarks/tpe_vs_exhaustive.py --db sqlite:///<OUT>/exhaustive.sqlite --seq-len 4096
set -u
source .device/env.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export TUNER_HOME=/tmp/tuner TUNER_CACHE_DIR=/tmp/tuner-cache
step=${1:?step number}
case "$step" in
1)
  timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_mma_sync_gpu.py \
    -k chunk_elems > "$OUT/mma_chunk_elems.log" 2>&1; echo "chunk_elems rc=$?"
  tail -n 3 "$OUT/mma_chunk_elems.log"
  timeout 200 python3 benchmarks/mma_sync_h200.py --configs ladder --seq-lens 4096 30272 \
    > "$OUT/mma_ladder.md" 2>&1; echo "ladder rc=$?"; cat "$OUT/mma_ladder.md"
  timeout 180 python3 benchmarks/mma_sync_h200.py --configs all --seq-lens 4096 \
    > "$OUT/mma_all_4096.md" 2>&1; echo "all rc=$?"; tail -n 5 "$OUT/mma_all_4096.md"
  ;;
2)
  timeout 580 python3 -m tuner search --gpu h200 --families mma_sync --seq-lens 4096 --heads 56 \
    --trials 400 --patience 0 --seed 0 --db "sqlite:///$OUT/exhaustive.sqlite" --json \
    > "$OUT/exhaustive.json" 2> "$OUT/exhaustive.log"; echo "exhaustive rc=$? (re-run resumes)"
  tail -n 3 "$OUT/exhaustive.log"
  ;;
3)
  timeout 580 python3 -m tuner search --gpu h200 --seq-lens 4096 --heads 56 --trials 30 \
    --patience 0 --seed 1 --db "sqlite:///$OUT/cost.sqlite" --json > "$OUT/cost.json" \
    2> "$OUT/cost.log"; echo "search rc=$?"
  python3 benchmarks/search_cost.py --db "sqlite:///$OUT/cost.sqlite" --seq-len 4096
  ;;
4)
  timeout 400 python3 -m pytest -m gpu -q -s -p no:cacheprovider tests/gpu/test_bench_gpu.py \
    > "$OUT/bench_test.log" 2>&1; echo "bench test rc=$?"; grep -E "^S=|passed|failed" "$OUT/bench_test.log"
  timeout 150 python3 -m tuner search --gpu h200 --workers 1 --seq-lens 2048 --heads 56 \
    --trials 6 --db "sqlite:///$OUT/workers1.sqlite" --json > "$OUT/workers1.json" \
    2> "$OUT/workers1.log"; echo "workers=1 rc=$?"
  ;;
5)
  timeout 580 python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_wgmma_gpu.py \
    -k small_shapes > "$OUT/wgmma_space.log" 2>&1; echo "wgmma space rc=$?"
  tail -n 5 "$OUT/wgmma_space.log"
  ;;
*) echo "unknown step $step"; exit 2 ;;
esac
