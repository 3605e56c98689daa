"""Issue 19 item 1 (and issue 17's tile order): what a knob value buys, side by side on the same
inputs. At each shape of issue 19 the config tuner.attention runs there (database, table or
default) is timed beside copies of it with one knob moved: strip widths FA3 uses (160 at head_dim
64, 224 at 128) and the ones around them, and the other tile order. Every copy passes the
correctness gate (tuner.gate.validate_kernel at a small ragged problem of the same head_dim)
before it is timed; a copy can_implement refuses is listed with the reason.

    python3 benchmarks/knob_probe_h200.py [--out DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from pathlib import Path

import torch
from e2e_h200 import median_ms
from results_out import measure_each, publish
from shapes_h200 import bf16_inputs

SHAPES = [(1, 4096, 56, 128), (1, 8192, 56, 128), (1, 16384, 56, 128), (1, 30272, 56, 128),
          (2, 4608, 24, 128), (1, 75600, 40, 128), (1, 30272, 56, 64), (4, 1024, 32, 128)]
BLOCK_N = (128, 160, 192, 224)


def probe_configs(cfg):
    """(label, config) of the probe: the config itself, each other strip width, the other tile
    order."""
    from variants.wgmma.config import TILE_ORDERS

    out = [("as run", cfg)]
    out += [(f"block_n={n}", dataclasses.replace(cfg, block_n=n)) for n in BLOCK_N
            if n != cfg.block_n]
    out += [(f"tile_order={o}", dataclasses.replace(cfg, tile_order=o)) for o in TILE_ORDERS
            if o != cfg.tile_order]
    return out


def measure(shape, gated: dict) -> dict:
    from tuner import runtime
    from tuner.gate import validate_kernel
    from tuner.gpus import PROFILES
    from tuner.problem import Problem
    from variants import load_family

    batch, seq, heads, dim = shape
    problem = Problem(batch, heads, seq, dim)
    q, k, v = bf16_inputs(problem)
    best = runtime.config_for_problem(problem)
    family = load_family(best.family)
    row = {"shape": shape, "source": best.source, "config": best.config.short(), "ms": {},
           "refused": {}}
    small = Problem(1, 3, 1000 + 77, dim)  # ragged in both tile sizes
    for label, cfg in probe_configs(best.config):
        ok, reason = family.can_implement(cfg, problem, PROFILES["h200"])
        if not ok:
            row["refused"][label] = reason
            continue
        key = (cfg, dim)
        if key not in gated:
            seed = int.from_bytes(os.urandom(4), "little")
            report = validate_kernel(family.compile(cfg, small, "sm_90a"), small,
                                     torch.device("cuda"), seed)
            gated[key] = report.passed or f"seed={seed}: {report.reason}"
        if gated[key] is not True:
            row["refused"][label] = f"failed the gate: {gated[key]}"
            continue
        kernel = runtime._kernel_for(best.family, cfg, problem, "auto")
        prepared = kernel.prepare(q, k, v)
        row["ms"][label] = median_ms(lambda kernel=kernel, prepared=prepared:
                                     kernel.run(prepared))
    return row


def table(rows, device: str) -> str:
    from variants.wgmma.config import TILE_ORDERS

    labels = (["as run"] + [f"block_n={n}" for n in BLOCK_N]
              + [f"tile_order={o}" for o in TILE_ORDERS])
    lines = [f"Measured on {device}, {time.strftime('%Y-%m-%d')}: kernel alone, ms, median of "
             "20; in brackets the ratio as-run time / this time (above 1: this copy is faster).",
             "", "| B, S, H, D | as run (source) | " + " | ".join(labels[1:]) + " |",
             "|" + "---|" * (len(labels) + 1)]
    for r in rows:
        base = r["ms"]["as run"]
        cells = []
        for label in labels[1:]:
            if label in r["ms"]:
                cells.append(f"{r['ms'][label]:.3f} ({base / r['ms'][label]:.2f}x)")
            elif label in r["config"].split():
                cells.append("= as run")
            else:
                cells.append("refused" if label in r["refused"] else "-")
        b, s, h, d = r["shape"]
        lines.append(f"| {b}, {s}, {h}, {d} | {base:.3f} ({r['source']}) | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    gated: dict = {}
    rows = measure_each(SHAPES, lambda shape: measure(shape, gated))
    md = table(rows, torch.cuda.get_device_name())
    publish(args.out, "knob_probe_h200", md, rows)


if __name__ == "__main__":
    main()
