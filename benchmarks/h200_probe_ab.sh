#!/usr/bin/env bash
# The strip-loop probes of the twenty-second session (benchmarks/RESULTS.md), on the H200: the
# trees benchmarks/probes/make_trees.sh builds under .ab/ (run it here first; carry
# [".device", ".ab"]), gated, then timed kernel alone beside main and the per-head kernel, one
# process per tree, two rounds in opposite orders. One step per device call (each < 10 min;
# the second and third reuse the first's compiled kernels while the machine stays warm):
#   source .device/env.sh && bash benchmarks/h200_probe_ab.sh a   # gate the three probes
#   source .device/env.sh && bash benchmarks/h200_probe_ab.sh b   # round 1
#   source .device/env.sh && bash benchmarks/h200_probe_ab.sh c   # round 2, reversed
#   source .device/env.sh && bash benchmarks/h200_probe_ab.sh d   # head_dim 64, two rounds
# What it decides: whether the per-head kernel's 4-5% follows its strip loop's schedule (then
# scales-head and before-turn run at its speed, main and after-qk-wait not necessarily) or
# lies outside the loop (then scales-head, whose loop is the per-head one, stays at main's).
source benchmarks/device_steps.sh
# label tree knobs ("-" for none)
TREES=("main . split_tail=false" "per-head .ab/per-head -"
       "scales-head .ab/scales-head scales=head,split_tail=false"
       "before-turn .ab/before-turn split_tail=false"
       "before-turn-pf .ab/before-turn-pf split_tail=false"
       "after-qk-wait .ab/after-qk-wait split_tail=false")
time_tree() {  # time_tree LABEL ROOT KNOBS [HEAD_DIM SEQ_LENS]
  local k=$3; [ "$k" = "-" ] && k=""
  capped 85 python3 benchmarks/ab_trees.py --root "$2" --label "$1" --head-dim "${4:-128}" \
    --seq-lens "${5:-4096,8192,30272}" ${k:+--knobs $k} 2>&1 | grep -E '^\{|Error' | cut -c1-160
}
case "${1:-}" in
  a) for t in before-turn before-turn-pf after-qk-wait; do
       capped 150 python3 benchmarks/probe_gate.py --root ".ab/$t" 2>&1 \
         | grep -E '^\{|Error' | cut -c1-240
     done | tee "$OUT/probe_gate.jsonl" ;;
  b) for t in "${TREES[@]}"; do time_tree $t; done | tee "$OUT/probe_ab_round1.jsonl" ;;
  c) for ((i=${#TREES[@]}-1; i>=0; i--)); do time_tree ${TREES[i]}; done \
       | tee "$OUT/probe_ab_round2.jsonl" ;;
  d) for round in 1 2; do
       for t in "main . split_tail=false" "before-turn .ab/before-turn split_tail=false" \
                "after-qk-wait .ab/after-qk-wait split_tail=false"; do
         time_tree $t 64 8192,30272
       done
     done | tee "$OUT/probe_ab_hd64.jsonl" ;;
  *) echo "usage: $0 a|b|c|d"; exit 2 ;;
esac
