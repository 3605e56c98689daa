# Sourced by the benchmarks/h200_*.sh device scripts: the shared settings and helpers of a device
# call (../shared/device/README.md). Few files under $OUT (the device returns a limited number).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export TUNER_HOME=/tmp/tuner TUNER_CACHE_DIR=/tmp/tuner-cache
DEADLINE=$(( $(date +%s) + ${BUDGET_S:-560} ))
# capped SECONDS CMD...: run CMD for at most SECONDS, and never past the call's DEADLINE.
capped() { local cap=$1; shift; local left=$(( DEADLINE - $(date +%s) ))
  (( left < cap )) && cap=$left; (( cap < 5 )) && { echo "skipped (no time left): $*"; return 124; }
  timeout "$cap" "$@"; }
PYTEST="python3 -m pytest -m gpu -q -p no:cacheprovider -rfE"

# gate_mutant NAME SED_EXPR TEST_ID...: a copy of the tree with one sed edit to the wgmma kernel,
# then the given tests of tests/gpu/test_shapes_gpu.py's gate test (or of $GATE_TEST) in that
# copy; the gate must reject the edit (the tests fail). Prints the pytest summary and the gate's
# reasons.
gate_mutant() {
  local name=$1 expr=$2; shift 2
  rm -rf "/tmp/mut-$name"; mkdir -p "/tmp/mut-$name"
  tar --exclude=./.device --exclude=./.device-fa3 --exclude=./ab -cf - . | tar -xf - -C "/tmp/mut-$name"
  sed -i "$expr" "/tmp/mut-$name/variants/wgmma/kernel.py"
  if cmp -s variants/wgmma/kernel.py "/tmp/mut-$name/variants/wgmma/kernel.py"; then
    echo "mutant $name: the edit matched nothing"; return 1; fi
  local t=${GATE_TEST:-tests/gpu/test_shapes_gpu.py::test_the_gate_passes_the_kernels_on_every_shape}
  local ids=()
  for id in "$@"; do ids+=("$t[$id]"); done
  (cd "/tmp/mut-$name" && PYTHONPATH="/tmp/mut-$name:${PYTHONPATH:-}" \
    TUNER_CACHE_DIR="/tmp/cache-mut-$name" capped 90 $PYTEST "${ids[@]}" \
    2>&1 | grep -E "passed|failed|slope|worst|error|seed=" | cut -c1-300 | head -n 8)
}

# bench_issue19_shapes: `tuner bench` beside FA3 FP8 and cuDNN FP8 at issue 19's eight shapes, in
# a call that carries .device-fa3 (its log in $OUT/bench.log, the tables printed).
bench_issue19_shapes() {
  local shape
  # The longest last: a call that runs out of time loses the fewest shapes.
  for shape in "1 56 128 4096,8192,16384,30272" "2 24 128 4608" "1 56 64 30272" \
               "4 32 128 1024" "1 40 128 75600"; do
    set -- $shape
    capped 150 python3 -m tuner bench --gpu h200 --batch "$1" --heads "$2" --head-dim "$3" \
      --seq-lens "$4" --against default,fa3-fp8,cudnn-fp8
  done > "$OUT/bench.log" 2>&1; echo "bench rc=$?"; grep -E '^\|' "$OUT/bench.log" | tail -n 30
}
