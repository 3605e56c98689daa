#!/usr/bin/env bash
# The H200 runs behind RESULTS.md "Q quantized in the kernel" (issue 15, eleventh session), in two
# device calls made back to back (../shared/device/README.md):
#   bash benchmarks/h200_q_in_kernel.sh tests   # carry [".device"]: the q_quant=kernel GPU tests,
#                                              # two planted kernel mutations, a sample of the
#                                              # wgmma space through the gate, the planted suite
#   bash benchmarks/h200_q_in_kernel.sh bench   # carry [".device-fa3"] right after: clocks and
#                                              # power per system, then e2e_h200.py (FA3 beside)
#   bash benchmarks/h200_q_in_kernel.sh final   # carry [".device"]: the GPU tests after the last
#                                              # edit
source "$(dirname "$0")/device_steps.sh"

case "${1:?tests, bench or final}" in
final)
  # After the last product edit (the default's q_quant rule): the GPU tests of the caller's path,
  # every shape, the planted suite, the foundation; the wgmma tests but the space sweep, and a
  # sample of both spaces (every 100th wgmma config with Q from prepare, every 24th mma_sync).
  source .device/env.sh
  capped 300 $PYTEST tests/gpu/test_shapes_gpu.py tests/gpu/test_e2e_gpu.py \
    tests/gpu/test_runtime_gpu.py tests/gpu/test_gate_gpu.py tests/gpu/test_foundation_gpu.py \
    tests/test_prepare.py > "$OUT/final.log" 2>&1; echo "caller path rc=$?"; tail -n 4 "$OUT/final.log"
  $PYTEST --collect-only tests/gpu/test_wgmma_gpu.py 2>/dev/null | grep "feasible_space" \
    | grep "q_quant=prepare" | awk "NR % 100 == 1" > /tmp/sample.txt
  $PYTEST --collect-only tests/gpu/test_mma_sync_gpu.py 2>/dev/null | grep "sm90_space" \
    | awk "NR % 24 == 1" >> /tmp/sample.txt
  capped 120 $PYTEST $(cat /tmp/sample.txt) > "$OUT/final_spaces.log" 2>&1
  echo "spaces ($(wc -l < /tmp/sample.txt) sampled configs) rc=$?"; tail -n 2 "$OUT/final_spaces.log"
  capped 120 $PYTEST tests/gpu/test_wgmma_gpu.py tests/gpu/test_mma_sync_gpu.py \
    -k "not feasible_space and not sm90_space" >> "$OUT/final_spaces.log" 2>&1
  echo "both families' other tests rc=$?"; tail -n 2 "$OUT/final_spaces.log"
  ;;
tests)
  source .device/env.sh
  nvidia-smi --query-gpu=name,power.limit,enforced.power.limit,clocks.max.sm,clocks.sm,temperature.gpu \
    --format=csv > "$OUT/gpu.txt"
  capped 260 $PYTEST tests/gpu/test_e2e_gpu.py tests/gpu/test_runtime_gpu.py \
    tests/gpu/test_shapes_gpu.py tests/test_prepare.py -k "q_quant or q-kernel or q-quant-kernel or q_in_kernel" \
    > "$OUT/tests.log" 2>&1; echo "q tests rc=$?"; tail -n 5 "$OUT/tests.log"
  {
    echo "== mutant: every row's scale 5% high"
    gate_mutant scale 's/q_coef\[r\] = amax \* DESCALE_PER_AMAX \* scale_log2/q_coef[r] = amax * DESCALE_PER_AMAX * scale_log2 * 1.05/' \
      "b1-h8-s1000-kv77-kvh2-full-wgmma-q_quant=kernel" "b2-h4-s300-kv300-kvh2-causal-wgmma-q_quant=kernel"
    echo "== mutant: each thread's two rows' codes swapped"
    gate_mutant rows 's/dst = cute.local_tile(sQ\[s_rows\[r, 0\]\[0\], None\]/dst = cute.local_tile(sQ[s_rows[1 - r, 0][0], None]/' \
      "b1-h8-s1000-kv77-kvh2-full-wgmma-q_quant=kernel" "b2-h4-s300-kv300-kvh2-causal-wgmma-q_quant=kernel"
  } > "$OUT/mutants.log" 2>&1; cat "$OUT/mutants.log"
  # Every 80th q_quant=kernel config of the space at S = 1, 77, 4097 through the gate.
  $PYTEST --collect-only tests/gpu/test_wgmma_gpu.py 2>/dev/null | grep "feasible_space" \
    | grep "q_quant=kernel" | awk "NR % 80 == 1" > /tmp/sample.txt
  capped 120 $PYTEST $(cat /tmp/sample.txt) > "$OUT/space_sample.log" 2>&1
  echo "space sample ($(wc -l < /tmp/sample.txt) configs) rc=$?"; tail -n 3 "$OUT/space_sample.log"
  capped 100 $PYTEST tests/gpu/test_gate_gpu.py >> "$OUT/space_sample.log" 2>&1
  echo "planted rc=$?"; tail -n 2 "$OUT/space_sample.log"
  ;;
bench)
  source .device-fa3/env.sh
  capped 60 python3 benchmarks/clock_probe.py --seconds 4 --out "$OUT" > "$OUT/bench.log" 2>&1
  echo "clock probe rc=$?"; tail -n 8 "$OUT/bench.log"
  capped 420 python3 benchmarks/e2e_h200.py --out "$OUT" >> "$OUT/bench.log" 2>&1
  echo "e2e rc=$?"; tail -n 14 "$OUT/bench.log"
  ;;
esac
