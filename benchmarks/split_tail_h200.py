"""Does split_tail (variants/wgmma/split_tail.py) take back the last wave's idle SMs (issue 19
item 1)? The wgmma default of each shape with split_tail off and on, at full-mask
shapes whose tiles (B x H x ceil(S / block_m)) leave a partial last wave on the H200's 132 SMs,
with cuDNN FP8 as the outside peer.

    python3 benchmarks/split_tail_h200.py [--out DIR] [--shapes B,S,H,D;...]

Both candidates first pass the correctness gate at small problems whose tiles are all tail or
part tail (tuner.gate.validate_kernel, fresh seed), at each head_dim of the shapes; then at
every shape tuner.measure.time_kernel times them as a search does
(benchmarks/default_candidates.py). The kernel time includes split_tail's workspace allocation
and counter zeroing, which every launch pays."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from default_candidates import gate, measure, shapes_arg, table
from results_out import measure_each, publish

from tuner.problem import Problem

# (batch, seq_len, heads, head_dim); in the comment: tiles, the last wave's tiles (132 SMs).
SHAPES = [(2, 4608, 24, 128),   # 1728 tiles, 12
          (1, 8192, 56, 128),   # 3584, 20
          (1, 4096, 56, 128),   # 1792, 76
          (4, 1024, 32, 128),   # 1024, 100
          (1, 1024, 56, 128),   # 448, 52
          (1, 2048, 56, 128),   # 896, 104
          (1, 4096, 40, 128),   # 1280, 92
          (1, 16384, 56, 128),  # 7168, 40
          (1, 30272, 56, 128),  # 13272, 72
          (2, 4608, 24, 64),    # 1152 (192 rows), 96
          (1, 8192, 56, 64)]    # 2408, 32

CANDIDATES = [("split_tail off", {"split_tail": False}), ("split_tail on", {"split_tail": True})]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--shapes", default="", help="B,S,H,D;... in place of the built-in list")
    args = parser.parse_args()
    shapes = shapes_arg(args.shapes, SHAPES)
    problems = [Problem(b, h, s, d) for b, s, h, d in shapes]
    # All tail (36 tiles at 128 rows), and two whole waves with a ragged tail (297), both split.
    smalls = [small for d in sorted({p.head_dim for p in problems})
              for small in (Problem(1, 4, 1000 + 77, d, seq_len_kv=4000, kv_heads=2),
                            Problem(1, 9, 4097, d, kv_heads=3))]
    verdicts = gate(CANDIDATES, *smalls)
    print("gate:", verdicts, flush=True)
    rows = measure_each(problems, lambda problem: measure(problem, CANDIDATES, verdicts),
                        warmup=Problem(1, 56, 1024))
    md = table(rows, [lab for lab, _ in CANDIDATES], torch.cuda.get_device_name(),
               "no mask, head_dim 128 unless the shape says D")
    publish(args.out, "split_tail_h200", md, rows)


if __name__ == "__main__":
    main()
