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
import os
import time
from pathlib import Path

import torch
from results_out import measure_each, publish

SHAPES = [(1, 1024, 56), (1, 4096, 56), (1, 8192, 56), (1, 16384, 56), (1, 30272, 56),
          (2, 4608, 24), (4, 1024, 32), (1, 16384, 40), (1, 75600, 40)]


def candidates() -> list:
    """(label, config): the current default, then the searched head_dim-64 winners of the
    block-scale kernel (db/tables/h200.yaml, 2026-12-02), as knob changes of the default."""
    from tuner.problem import Problem
    from variants import wgmma

    base = wgmma.default("sm_90a", Problem(1, 56, 8192, 64))
    regs = dict(p_source="registers", consumer_wgs=3)
    return [
        ("default", base),
        ("S=30272 winner", dataclasses.replace(base, **regs, intra_wg_overlap=True,
                                               pingpong=False, kv_stages=3, q_quant="prepare")),
        ("S=30272 winner, Q in kernel", dataclasses.replace(
            base, **regs, intra_wg_overlap=True, pingpong=False, kv_stages=3, q_quant="kernel")),
        ("S=8192 winner", dataclasses.replace(base, **regs, intra_wg_overlap=False,
                                              pingpong=False, kv_stages=3, q_quant="kernel")),
        ("S=4096 winner", dataclasses.replace(base, **regs, intra_wg_overlap=False,
                                              pingpong=True, kv_stages=2, q_quant="kernel")),
    ]


def gate(cands) -> dict:
    """label -> True, or why the candidate failed the gate (it is then not timed)."""
    from tuner.gate import validate_kernel
    from tuner.problem import Problem
    from variants import wgmma

    small = Problem(1, 3, 1000 + 77, 64)  # ragged in every tile size
    verdicts = {}
    for label, cfg in cands:
        seed = int.from_bytes(os.urandom(4), "little")
        report = validate_kernel(wgmma.compile(cfg, small, "sm_90a"), small,
                                 torch.device("cuda"), seed)
        verdicts[label] = True if report.passed else f"seed={seed}: {report.reason}"
    return verdicts


def measure(shape, cands, verdicts) -> dict:
    from tuner.gpus import PROFILES
    from tuner.measure import time_kernel
    from tuner.peers import PeerUnavailable, make_peer
    from tuner.problem import Problem
    from variants import wgmma

    batch, seq, heads = shape
    problem = Problem(batch, heads, seq, 64)
    l2 = PROFILES["h200"].l2_bytes
    row = {"shape": shape, "kernel_ms": {}, "prepare_ms": {}, "refused": {}}
    for label, cfg in cands:
        if verdicts[label] is not True:
            row["refused"][label] = f"failed the gate: {verdicts[label]}"
            continue
        ok, reason = wgmma.can_implement(cfg, problem, PROFILES["h200"])
        if not ok:
            row["refused"][label] = reason
            continue
        seed = int.from_bytes(os.urandom(4), "little")
        t = time_kernel(wgmma.compile(cfg, problem, "sm_90a"), problem, torch.device("cuda"),
                        seed, l2)
        row["kernel_ms"][label], row["prepare_ms"][label] = t.median_ms, t.prepare_ms
    try:
        t = time_kernel(make_peer("cudnn-fp8", problem), problem, torch.device("cuda"), 1, l2)
        row["cudnn_ms"] = t.median_ms
    except PeerUnavailable as exc:
        row["cudnn_ms"], row["refused"]["cudnn-fp8"] = None, str(exc)
    return row


def table(rows, labels, device: str) -> str:
    lines = [f"Measured on {device}, {time.strftime('%Y-%m-%d')}, head_dim 64: kernel ms / "
             "prepare + kernel ms (time_kernel: L2-cold, median of 20); in brackets the current "
             "default's prepare + kernel time / this one's (above 1: faster). cuDNN FP8: its "
             "kernel on e4m3 inputs.", "",
             "| B, S, H | " + " | ".join(labels) + " | cuDNN FP8 | best kernel vs cuDNN |",
             "|" + "---|" * (len(labels) + 3)]
    for r in rows:
        total = {lab: r["kernel_ms"][lab] + r["prepare_ms"][lab] for lab in r["kernel_ms"]}
        base = total.get("default")
        cells = []
        for lab in labels:
            if lab not in total:
                cells.append("refused")
                continue
            ratio = f" ({base / total[lab]:.2f}x)" if base else ""
            cells.append(f"{r['kernel_ms'][lab]:.3f} / {total[lab]:.3f}{ratio}")
        cudnn = r.get("cudnn_ms")
        best = min(r["kernel_ms"].values()) if r["kernel_ms"] else None
        peer = f"{cudnn:.3f} | {cudnn / best:.2f}" if cudnn and best else "- | -"
        b, s, h = r["shape"]
        lines.append(f"| {b}, {s}, {h} | " + " | ".join(cells) + f" | {peer} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--shapes", default="",
                        help="B,S,H;B,S,H;... in place of the built-in list")
    args = parser.parse_args()
    shapes = ([tuple(int(x) for x in s.split(",")) for s in args.shapes.split(";")]
              if args.shapes else SHAPES)
    cands = candidates()
    verdicts = gate(cands)
    print("gate:", verdicts, flush=True)
    rows = measure_each(shapes, lambda shape: measure(shape, cands, verdicts),
                        warmup=(1, 1024, 56))
    md = table(rows, [lab for lab, _ in cands], torch.cuda.get_device_name())
    publish(args.out, "default_hd64_h200", md, rows)


if __name__ == "__main__":
    main()
