#!/usr/bin/env bash
# The H200 runs behind RESULTS.md "Seventeenth session: split_tail" (issue 19 item 1):
#   bash benchmarks/h200_split_tail.sh a   # carry [".device"] (staged --with-cudnn): the
#       split_tail GPU tests, two planted merge bugs the gate must reject, then
#       benchmarks/split_tail_h200.py (the default beside split_tail at 11 full-mask shapes)
#   bash benchmarks/h200_split_tail.sh c   # carry [".device"]: with the pieces in a launch of
#       their own (the whole tiles' program the kernel of split_tail=False): the split_tail GPU
#       tests, then the off/on table at six shapes
#   bash benchmarks/h200_split_tail.sh d   # (eighteenth session) carry [".device"], staged
#       --with-cudnn: where the rule keeps the tail whole the split_tail=False twin runs: the
#       split_tail GPU tests, the off/on table at six shapes, the runtime and end-to-end tests
#   bash benchmarks/h200_split_tail.sh f   # carry [".device"]: with split_tail in the full-mask
#       default, the GPU tests of the shapes, split_tail, runtime and end to end
#   bash benchmarks/h200_split_tail.sh e   # carry [".device-fa3"] right after d or f: tuner bench at
#       issue 19's eight shapes beside FA3 FP8 and cuDNN FP8 (item 5)
#   bash benchmarks/h200_split_tail.sh b   # carry [".device"]: the GPU tests of the shapes,
#       runtime, end to end and gate (the long causal default of the sixteenth session and the
#       new launch ABI's workspace pointer)
source "$(dirname "$0")/device_steps.sh"

# split_tests CAP: the split_tail GPU tests, their summary and first errors printed.
split_tests() {
  capped "$1" $PYTEST tests/gpu/test_split_tail_gpu.py > "$OUT/split_tests.log" 2>&1
  echo "split tests rc=$?"; tail -n 3 "$OUT/split_tests.log"
  grep -E "Error|assert" "$OUT/split_tests.log" | head -n 8
}
# off_on_table CAP: benchmarks/split_tail_h200.py at six shapes (the tables printed).
off_on_table() {
  capped "$1" python3 benchmarks/split_tail_h200.py --out "$OUT" --shapes \
    "2,4608,24,128;1,4096,56,128;1,8192,56,128;1,16384,56,128;4,1024,32,128;1,8192,56,64" \
    > "$OUT/split_bench.log" 2>&1
  echo "bench rc=$?"; grep -E '^\||gate:' "$OUT/split_bench.log"
}

step=${1:?usage: h200_split_tail.sh a|b|c|d|e|f}
case "$step" in
a)
  capped 200 $PYTEST tests/gpu/test_split_tail_gpu.py > "$OUT/split_tests.log" 2>&1
  echo "split tests rc=$?"; tail -n 8 "$OUT/split_tests.log"
  {
    export GATE_TEST=tests/gpu/test_split_tail_gpu.py::test_the_gate_passes_split_tail
    echo "== mutant: each piece weighted 1 in the merge (its maximum's difference ignored)"
    gate_mutant weight 's/take = rescale_factor(m_other, m_new)/take = rescale_factor(m_other, m_other)/' \
      "b1-h4-s1000-kv4000-kvh2-d128-split_tail=True" "b1-h9-s4097-kv4097-kvh3-d128-split_tail=True"
    echo "== mutant: the merge reads every slot but the first CTA's"
    gate_mutant first 's/for cta in cutlass.range(first, last + 1, unroll=1):/for cta in cutlass.range(first + 1, last + 1, unroll=1):/' \
      "b1-h4-s1000-kv4000-kvh2-d128-split_tail=True" "b2-h5-s2000-kv3000-kvh5-d128-split_tail=True"
  } > "$OUT/mutants.log" 2>&1; cat "$OUT/mutants.log"
  capped 200 python3 benchmarks/split_tail_h200.py --out "$OUT" > "$OUT/split_bench.log" 2>&1
  echo "bench rc=$?"; grep -E '^\||gate:' "$OUT/split_bench.log"
  # The shapes it splits once more, for the run-to-run spread.
  capped 150 python3 benchmarks/split_tail_h200.py --out "$OUT/again" --shapes \
    "2,4608,24,128;1,8192,56,128;1,4096,56,128;1,16384,56,128;1,30272,56,128;1,8192,56,64" \
    > "$OUT/split_bench_again.log" 2>&1
  echo "bench again rc=$?"; grep -E '^\||gate:' "$OUT/split_bench_again.log"
  ;;
c)
  split_tests 110
  off_on_table 120
  ;;
d)
  split_tests 150
  off_on_table 130
  capped 300 $PYTEST tests/gpu/test_runtime_gpu.py tests/gpu/test_e2e_gpu.py > "$OUT/tests.log" 2>&1
  echo "runtime/e2e tests rc=$?"; grep -E "passed|failed|FAILED|ERROR" "$OUT/tests.log" | tail -n 12
  ;;
f)
  capped 420 $PYTEST tests/gpu/test_split_tail_gpu.py tests/gpu/test_runtime_gpu.py \
    tests/gpu/test_e2e_gpu.py tests/gpu/test_shapes_gpu.py > "$OUT/tests.log" 2>&1
  echo "tests rc=$?"; grep -E "passed|failed|FAILED|ERROR" "$OUT/tests.log" | tail -n 20
  ;;
e)
  source .device-fa3/env.sh
  bench_issue19_shapes
  ;;
b)
  capped 540 $PYTEST tests/gpu/test_shapes_gpu.py tests/gpu/test_runtime_gpu.py \
    tests/gpu/test_e2e_gpu.py tests/gpu/test_gate_gpu.py > "$OUT/tests.log" 2>&1
  echo "tests rc=$?"; grep -E "passed|failed|FAILED|ERROR" "$OUT/tests.log" | tail -n 20
  ;;
esac
