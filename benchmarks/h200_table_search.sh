#!/usr/bin/env bash
# The H200 runs behind RESULTS.md "Thirteenth session: the shipped table re-searched" (issue 19
# item 4), two device calls made back to back (../shared/device/README.md):
#   bash benchmarks/h200_table_search.sh a      # carry [".device"] (staged --with-cudnn --fa3):
#       import the shipped table into the default database, search group A, export
#   bash benchmarks/h200_table_search.sh b      # carry [".device-fa3"] at once: search group B,
#       export, then tuner bench at issue 19's eight shapes beside FA3 FP8 and cuDNN FP8
#   bash benchmarks/h200_table_search.sh c      # carry [".device"]: four rows not searched with
#       this kernel before (H=56 D=128 at 1024 and 2048, D=64 at 4096 and 8192), export
#   bash benchmarks/h200_table_search.sh d      # carry [".device"]: the head_dim-64 default
#       candidates side by side (benchmarks/default_hd64_h200.py), two head_dim-64 rows searched
#   bash benchmarks/h200_table_search.sh e      # carry [".device"]: D=64 H=40 S=75600 and
#       H=56 D=128 at 16384 and 30272 searched with the block-scale kernel
#   bash benchmarks/h200_table_search.sh f      # carry [".device"]: D=64 H=56 S=16384 searched
#       again (its one row was the old default's config), then the GPU tests that time kernels
#   bash benchmarks/h200_table_search.sh g      # carry [".device"]: D=64 B=2 S=4608 H=24 and
#       S=4096 H=40 searched against the new short-key head_dim-64 default
#   bash benchmarks/h200_table_search.sh h      # carry [".device"]: the causal rows (searched in
#       the ninth session with the per-head kernel) searched again with the block-scale kernel
#   bash benchmarks/h200_table_search.sh i      # carry [".device"], after
#       `python3 benchmarks/causal_default_h200.py --out $OUT` (the causal default's candidates)
#       moved the short causal default: the GPU gate tests of the shapes, the
#       softmax-coefficient probe trees beside main (benchmarks/ab_trees.py; the probes are
#       benchmarks/probes/*.patch, RESULTS.md sixteenth session; run then from .probes/ copies of
#       the same edits), then causal H=56 S=30272 searched
#   bash benchmarks/h200_table_search.sh retime # carry [".device"]: after prepare's timing fix
#       (tuner/measure.py _time_prepare), prepare and kernel of the default timed at two shapes,
#       then the small shapes whose winners prepare's host-bound timing had decided searched again
# Each search is the default budget (64 trials, patience 32) capped by a wall time per length;
# the exported table comes back as $OUT/h200.yaml (copy it to db/tables/h200.yaml).
source "$(dirname "$0")/device_steps.sh"

# search SECONDS_PER_LENGTH ARGS...: one tuner search of the wgmma family (the only family that
# is fast on sm_90), its log appended to $OUT/search.log.
search() { local per=$1; shift
  echo "== tuner search $*" >> "$OUT/search.log"
  capped 600 python3 -m tuner search --gpu h200 --families wgmma --time-budget "$per" "$@" \
    >> "$OUT/search.log" 2>&1; echo "rc=$? $*"; }
# import_table: the shipped table into the default database (forced, and said so, if the machine's
# fingerprint differs from the table's).
import_table() {
  python3 -m tuner import db/tables/h200.yaml || { echo "import refused: forcing"
    python3 -m tuner import --force db/tables/h200.yaml; }; }
# export_table [LINES]: the database's table to $OUT/h200.yaml, then the last LINES lines (none
# by default) of the searches' verdicts and tables.
export_table() {
  python3 -m tuner export --gpu h200 --out "$OUT/h200.yaml" && echo "exported $(grep -c 'seq_len:' "$OUT/h200.yaml") seq_len lines"
  grep -E "winner|speedup|default kept|^\|" "$OUT/search.log" | tail -n "${1:-0}"; }

case "${1:?a or b}" in
a)
  source .device/env.sh
  nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm,temperature.gpu \
    --format=csv > "$OUT/gpu.txt"
  import_table
  search 150 --head-dim 64 --heads 56 --seq-lens 30272
  search 90 --batch 2 --heads 24 --seq-lens 4608
  search 90 --heads 56 --seq-lens 4096
  search 60 --batch 4 --heads 32 --seq-lens 1024
  search 60 --head-dim 64 --batch 2 --heads 24 --seq-lens 1024
  export_table 40
  ;;
b)
  source .device-fa3/env.sh
  search 80 --heads 56 --seq-lens 8192
  search 60 --head-dim 64 --batch 4 --heads 32 --seq-lens 1024
  export_table 20
  bench_issue19_shapes
  ;;
c)  # fourteenth session: rows not re-searched before, carry [".device"]
  source .device/env.sh
  import_table
  search 60 --heads 56 --seq-lens 1024,2048
  search 90 --head-dim 64 --heads 56 --seq-lens 4096,8192
  export_table 30
  ;;
d)  # fifteenth session, carry [".device"]: the head_dim-64 default question
  # (benchmarks/default_hd64_h200.py), then head_dim-64 rows the table lacks
  source .device/env.sh
  nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm,temperature.gpu \
    --format=csv > "$OUT/gpu.txt"
  capped 330 python3 benchmarks/default_hd64_h200.py --out "$OUT" > "$OUT/default_hd64.log" 2>&1
  echo "default_hd64 rc=$?"; grep -E "^gate|^\|" "$OUT/default_hd64.log"
  import_table
  search 60 --head-dim 64 --heads 56 --seq-lens 1024
  search 90 --head-dim 64 --batch 2 --heads 24 --seq-lens 16384
  export_table 30
  ;;
e)  # fifteenth session, carry [".device"]: long rows not searched with the block-scale kernel
  source .device/env.sh
  import_table
  search 150 --head-dim 64 --heads 40 --seq-lens 75600
  search 120 --heads 56 --seq-lens 16384
  search 150 --heads 56 --seq-lens 30272
  export_table 40
  ;;
f)  # fifteenth session, carry [".device"]: the one head_dim-64 row whose only winner (the old
  # default's config) the new default beats, searched again; then the GPU tests that time
  source .device/env.sh
  import_table
  search 90 --head-dim 64 --heads 56 --seq-lens 16384
  export_table 12
  capped 300 $PYTEST tests/gpu/test_bench_gpu.py tests/gpu/test_search_gpu.py \
    tests/gpu/test_runtime_gpu.py tests/gpu/test_measure_gpu.py 2>&1 | tail -n 4
  ;;
g)  # fifteenth session, carry [".device"]: two short head_dim-64 rows searched against the new
  # short-key default (their rows quantize Q in prepare, which that default saves)
  source .device/env.sh
  import_table
  search 60 --head-dim 64 --batch 2 --heads 24 --seq-lens 4608
  search 60 --head-dim 64 --heads 40 --seq-lens 4096
  export_table 12
  ;;
h)  # sixteenth session, carry [".device"]: the causal rows, last searched (16 trials each) with
  # the ninth session's per-head kernel
  source .device/env.sh
  import_table
  search 60 --causal --heads 56 --seq-lens 4096
  search 90 --causal --heads 56 --seq-lens 8192
  search 110 --causal --heads 56 --seq-lens 16384
  search 80 --causal --heads 32 --kv-heads 8 --seq-lens 8192
  search 110 --causal --heads 32 --kv-heads 8 --seq-lens 16384
  export_table 40
  ;;
i)  # sixteenth session
  source .device/env.sh
  capped 240 $PYTEST tests/gpu/test_shapes_gpu.py > "$OUT/tests.log" 2>&1
  echo "tests rc=$?"; tail -n 4 "$OUT/tests.log"
  for p in p1 p6; do  # the probe trees: main with benchmarks/probes/softmax_coefficient_<p>.patch
    rm -rf "/tmp/$p" && mkdir -p "/tmp/$p" && cp -r variants tuner "/tmp/$p/" \
      && patch -s -d "/tmp/$p" -p1 < "benchmarks/probes/softmax_coefficient_$p.patch"
  done
  for tree in . /tmp/p1 /tmp/p6 .; do
    label=${tree##*/}; [ "$label" = . ] && label=main
    capped 60 python3 benchmarks/ab_trees.py --root "$tree" --label "$label" \
      --seq-lens 8192,30272 --repeats 30 2>/dev/null | grep '^{' | tee -a "$OUT/ab.jsonl"
  done
  import_table
  search 130 --causal --heads 56 --seq-lens 30272
  export_table 12
  ;;
retime)
  source .device/env.sh
  python3 - <<'PY' 2>&1 | grep -v Warn | tee "$OUT/prepare_timing.txt"
import torch
from tuner.gpus import PROFILES
from tuner.measure import time_kernel
from tuner.problem import Problem
from variants import wgmma
for b, h, s in ((4, 32, 1024), (1, 56, 4096), (2, 24, 4608)):
    p = Problem(b, h, s)
    cfg = wgmma.default("sm_90a", p)
    t = time_kernel(wgmma.compile(cfg, p, "sm_90a"), p, torch.device("cuda"), 1,
                    PROFILES["h200"].l2_bytes)
    print(f"B={b} H={h} S={s} q_quant={cfg.q_quant}: kernel {t.median_ms:.4f} ms, "
          f"prepare {t.prepare_ms:.4f} ms")
PY
  import_table
  search 60 --batch 4 --heads 32 --seq-lens 1024
  search 60 --head-dim 64 --batch 2 --heads 24 --seq-lens 1024
  search 60 --head-dim 64 --batch 4 --heads 32 --seq-lens 1024
  search 60 --batch 2 --heads 24 --seq-lens 1024
  export_table; grep -E "^│" "$OUT/search.log" | tail -n 30
  capped 60 python3 -m tuner bench --gpu h200 --batch 4 --heads 32 --seq-lens 1024 \
    --against default,cudnn-fp8 > "$OUT/bench.log" 2>&1; grep -E '^\|' "$OUT/bench.log"
  ;;
esac
