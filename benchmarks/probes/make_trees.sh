#!/usr/bin/env bash
# Builds the package trees that benchmarks/h200_probe_ab.sh times, on this machine (the device
# has no git history), under .ab/ (git-ignored; the device call carries it):
#   per-head       3099e4a, the per-head-scale kernel the block-scale kernel trails by 4-5%
#   scales-head    main + scales_head.patch (one descale per head; run with --knobs scales=head)
#   before-turn    main + scales_before_turn.patch
#   before-turn-pf main + scales_before_turn.patch + scale_prefetch.patch
#   after-qk-wait  main + scales_after_qk_wait.patch
# Then prints each tree's strip loop summary (benchmarks/sass_loop.py, this machine's ptxas:
# install nvidia-cutlass-dsl[cu13] to read the device's schedule).
#   bash benchmarks/probes/make_trees.sh
set -eu
cd "$(git rev-parse --show-toplevel)"
probes=benchmarks/probes
tree() {  # tree NAME COMMIT [PATCH...]
  local name=$1 commit=$2; shift 2
  rm -rf ".ab/$name"; mkdir -p ".ab/$name"
  git archive "$commit" variants tuner | tar -x -C ".ab/$name"
  for p in "$@"; do git apply --directory=".ab/$name" --include=".ab/$name/variants/*" \
    --include=".ab/$name/tuner/*" "$probes/$p"; done
}
tree per-head 3099e4a
tree scales-head HEAD scales_head.patch
tree before-turn HEAD scales_before_turn.patch
tree before-turn-pf HEAD scales_before_turn.patch scale_prefetch.patch
tree after-qk-wait HEAD scales_after_qk_wait.patch
for name in per-head scales-head before-turn before-turn-pf after-qk-wait; do
  knobs=""; [ "$name" = scales-head ] && knobs="scales=head"
  python3 benchmarks/sass_loop.py --root ".ab/$name" ${knobs:+--knobs $knobs} | sed -n 1,2p
done
