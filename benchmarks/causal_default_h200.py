"""Which knobs should the causal default change (issue 19 items 1 and 4)? The sixteenth
session's causal searches (db/tables/h200.yaml) turned pingpong off at four of five problems
(three of them with Q quantized in the kernel), and at S=16384 H=56
the winner left the persistent grid (1.18x over the default): a grid the hardware schedules
hands a free SM the next tile as tiles of unequal length finish, where the persistent grid's
static stride fixes each CTA's tiles in advance. Here the causal default and knob changes of it
that test those two findings are timed side by side at causal shapes the table does and does
not hold, with cuDNN FP8 as the outside peer.

    python3 benchmarks/causal_default_h200.py [--out DIR] [--shapes B,S,H,KVH,D;...]

Each candidate first passes the correctness gate at a small ragged causal problem (with --full
unmasked) with grouped KV heads (tuner.gate.validate_kernel, fresh seed), at each head_dim of
the shapes; then at every shape tuner.measure.time_kernel times it as a search does
(benchmarks/default_candidates.py). --tile-orders puts the default under each tile order side
by side instead."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from default_candidates import gate, measure, shapes_arg, table
from results_out import measure_each, publish

from tuner.problem import Problem

# (batch, seq_len, heads, kv_heads, head_dim)
SHAPES = [(1, 2048, 56, 56, 128), (1, 4096, 56, 56, 128), (1, 8192, 56, 56, 128),
          (1, 16384, 56, 56, 128), (1, 30272, 56, 56, 128), (2, 4608, 24, 24, 128),
          (1, 8192, 32, 8, 128), (1, 16384, 32, 8, 128), (4, 4096, 32, 32, 128),
          (1, 8192, 56, 56, 64), (1, 30272, 56, 56, 64)]

CANDIDATES = [
    ("default", {}),
    ("no pingpong", {"pingpong": False}),
    ("no pingpong, Q in kernel", {"pingpong": False, "q_quant": "kernel"}),
    ("not persistent", {"persistent": False}),
    ("not persistent, no pingpong", {"persistent": False, "pingpong": False}),
    ("not persistent, per_head", {"persistent": False, "tile_order": "per_head"}),
]


def tile_order_candidates() -> list:
    from variants.wgmma.config import TILE_ORDERS

    return [(f"{order}{'' if persistent else ', not persistent'}",
             {"tile_order": order, "persistent": persistent})
            for persistent in (True, False) for order in TILE_ORDERS]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--shapes", default="",
                        help="B,S,H,KVH,D;... in place of the built-in list")
    parser.add_argument("--tile-orders", action="store_true",
                        help="in place of the candidates above: the default under each tile "
                        "order, persistent and not (config.TILE_ORDERS)")
    parser.add_argument("--full", action="store_true", help="no mask (to compare the orders)")
    args = parser.parse_args()
    cands = tile_order_candidates() if args.tile_orders else CANDIDATES
    shapes = shapes_arg(args.shapes, SHAPES)
    problems = [Problem(b, h, s, d, causal=not args.full, kv_heads=kvh)
                for b, s, h, kvh, d in shapes]
    # Ragged in every tile size, two query heads on each KV head, at each head_dim.
    verdicts = gate(cands, *(Problem(1, 4, 1000 + 77, d, causal=not args.full, kv_heads=2)
                             for d in sorted({p.head_dim for p in problems})))
    print("gate:", verdicts, flush=True)
    rows = measure_each(problems, lambda problem: measure(problem, cands, verdicts),
                        warmup=Problem(1, 56, 1024, causal=not args.full))
    md = table(rows, [lab for lab, _ in cands], torch.cuda.get_device_name(),
               ("no mask" if args.full else "causal (bottom-right)")
               + ", head_dim 128 unless the shape says D")
    stem = "causal_default_h200" + ("_tile_orders" if args.tile_orders else "")
    publish(args.out, stem + ("_full" if args.full else ""), md, rows)


if __name__ == "__main__":
    main()
