#!/usr/bin/env bash
# The H200 runs behind RESULTS.md "Twelfth session: the block scales through shared memory"
# (issue 19), in device calls made back to back (../shared/device/README.md):
#   bash benchmarks/h200_scales_smem.sh tests   # carry [".device"]: three kernel trees timed side
#       by side (ab/per-head = git archive 3099e4a, ab/global = git archive 41e056e, each
#       `variants tuner benchmarks/profile_wgmma.py`; this tree), two planted mutations of the
#       scale slots, the shapes and planted-bug GPU tests, a sample of the wgmma space
#   bash benchmarks/h200_scales_smem.sh bench   # carry [".device-fa3"] right after: tuner bench
#       at issue 19's eight shapes beside FA3 FP8 and cuDNN FP8
#   bash benchmarks/h200_scales_smem.sh final   # carry [".device"]: the caller path's GPU tests
source "$(dirname "$0")/device_steps.sh"

case "${1:?tests, bench or final}" in
tests)
  source .device/env.sh
  nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm,temperature.gpu \
    --format=csv > "$OUT/gpu.txt"
  for round in 1 2; do
    for tree in ${TREES:-ab/per-head ab/global .}; do
      label=${tree#ab/}; [[ $tree == . ]] && label=smem
      TUNER_CACHE_DIR=/tmp/cache-$label capped 90 python3 benchmarks/ab_trees.py --root "$tree" \
        --label "$label" --seq-lens 4096,8192,30272 $([[ $label == smem && $round == 1 ]] && echo --peer cudnn-fp8)
    done
  done > "$OUT/ab.jsonl" 2> "$OUT/ab.err"; cat "$OUT/ab.jsonl"; tail -n 3 "$OUT/ab.err"
  {
    echo "== mutant: each strip reads the other stage's slot"
    gate_mutant stage 's/dst\[i\]\[b\] = sKVScales\[i \* nb + b, state.index\]/dst[i][b] = sKVScales[i * nb + b, (state.index + 1) % self.stages]/' \
      "b1-h8-s1000-kv1000-kvh2-causal-wgmma-q_quant=prepare" "b1-h8-s4097-kv4097-kvh1-full-wgmma-q_quant=prepare"
    echo "== mutant: each Q row's scale stored one lane over"
    gate_mutant qrow 's/sQScales\[32 \* j + lane\] = q_values\[j\]/sQScales[32 * j + (lane + 1) % 32] = q_values[j]/' \
      "b1-h8-s1000-kv1000-kvh2-causal-wgmma-q_quant=prepare" "b1-h8-s4097-kv4097-kvh1-full-wgmma-q_quant=prepare"
  } > "$OUT/mutants.log" 2>&1; cat "$OUT/mutants.log"
  capped 200 $PYTEST tests/gpu/test_shapes_gpu.py tests/gpu/test_gate_gpu.py > "$OUT/tests.log" 2>&1
  echo "shapes + planted rc=$?"; tail -n 4 "$OUT/tests.log"
  $PYTEST --collect-only tests/gpu/test_wgmma_gpu.py 2>/dev/null | grep "feasible_space" \
    | awk "NR % 120 == 1" > /tmp/sample.txt
  capped 120 $PYTEST $(cat /tmp/sample.txt) >> "$OUT/tests.log" 2>&1
  echo "space sample ($(wc -l < /tmp/sample.txt) configs) rc=$?"; tail -n 2 "$OUT/tests.log"
  ;;
bench)
  source .device-fa3/env.sh
  bench_issue19_shapes
  ;;
final)
  source .device/env.sh
  capped 400 $PYTEST tests/gpu/test_e2e_gpu.py tests/gpu/test_runtime_gpu.py \
    tests/gpu/test_foundation_gpu.py tests/test_prepare.py > "$OUT/final.log" 2>&1
  echo "caller path rc=$?"; tail -n 4 "$OUT/final.log"
  capped 120 $PYTEST tests/gpu/test_wgmma_gpu.py -k "not feasible_space" >> "$OUT/final.log" 2>&1
  echo "wgmma family's other tests rc=$?"; tail -n 2 "$OUT/final.log"
  ;;
esac
