"""Which config should be the head_dim-64 default (issue 19 item 4)? The default, and the winners
the H200 searches picked at head_dim 64 with the block-scale kernel, timed side by side at
head_dim-64 shapes from 1024 to 75600 keys, with cuDNN FP8 as the outside peer.

    python3 benchmarks/default_hd64_h200.py [--out DIR] [--shapes B,S,H;...]

Each candidate first passes the correctness gate (tuner.gate.validate_kernel at a small ragged
problem, fresh seed); then at every shape tuner.measure.time_kernel times it as a search does
(L2-cold input rotation, fresh random inputs, median of 20): the kernel alone and its prepare
(quantization). The table gives both, and each candidate's ratio to the current default on the
prepare + kernel time (what a search ranks, and what a caller pays)."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import torch
from default_candidates import gate, measure, shapes_arg, table
from results_out import measure_each, publish

from tuner.problem import Problem

SHAPES = [(1, 1024, 56), (1, 4096, 56), (1, 8192, 56), (1, 16384, 56), (1, 30272, 56),
          (2, 4608, 24), (4, 1024, 32), (1, 16384, 40), (1, 75600, 40)]


def candidates() -> list:
    """(label, knobs): the current default, then the searched head_dim-64 winners of the
    block-scale kernel (db/tables/h200.yaml, 2026-12-02), as fixed configs."""
    from variants import wgmma

    base = wgmma.default("sm_90a", Problem(1, 56, 8192, 64))
    regs = dict(p_source="registers", consumer_wgs=3)

    def fixed(**knobs):
        return {"config": dataclasses.replace(base, **regs, **knobs)}

    return [
        ("default", {}),
        ("S=30272 winner", fixed(intra_wg_overlap=True, pingpong=False, kv_stages=3,
                                 q_quant="prepare")),
        ("S=30272 winner, Q in kernel", fixed(intra_wg_overlap=True, pingpong=False,
                                              kv_stages=3, q_quant="kernel")),
        ("S=8192 winner", fixed(intra_wg_overlap=False, pingpong=False, kv_stages=3,
                                q_quant="kernel")),
        ("S=4096 winner", fixed(intra_wg_overlap=False, pingpong=True, kv_stages=2,
                                q_quant="kernel")),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--shapes", default="",
                        help="B,S,H;B,S,H;... in place of the built-in list")
    args = parser.parse_args()
    shapes = shapes_arg(args.shapes, SHAPES)
    cands = candidates()
    verdicts = gate(cands, Problem(1, 3, 1000 + 77, 64))  # ragged in every tile size
    print("gate:", verdicts, flush=True)
    rows = measure_each([Problem(b, h, s, 64) for b, s, h in shapes],
                        lambda problem: measure(problem, cands, verdicts),
                        warmup=Problem(1, 56, 1024, 64))
    md = table(rows, [lab for lab, _ in cands], torch.cuda.get_device_name(), "head_dim 64")
    publish(args.out, "default_hd64_h200", md, rows)


if __name__ == "__main__":
    main()
