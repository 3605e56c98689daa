"""Issue 19 item 3: the config the lookup picks by work when no winner has the head count
(db-nearest-work / table-nearest-work) against the family default, side by side on the same
inputs, at the shapes of issue 19 whose head counts the shipped table lacks.

    python3 benchmarks/lookup_by_work_h200.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from e2e_h200 import median_ms

SHAPES = [(2, 4608, 24, 128), (1, 75600, 40, 128), (4, 1024, 32, 128), (1, 30272, 56, 64),
          (1, 8192, 32, 128)]


def measure(shape) -> dict:
    from tuner import runtime
    from tuner.problem import Problem
    from variants import families_for_arch, load_family

    batch, seq, heads, dim = shape
    problem = Problem(batch, heads, seq, dim)
    gen = torch.Generator(device="cuda").manual_seed(seq + heads)
    q, k, v = (torch.randn(shape, generator=gen, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))
    picked = runtime.config_for_problem(problem)
    family = families_for_arch("sm_90a")[0]
    default = load_family(family).default("sm_90a", problem)
    row = {"shape": shape, "source": picked.source, "picked": picked.config.short(),
           "default": default.short(), "ms": {}}
    for name, fam, cfg in (("picked", picked.family, picked.config),
                           ("default", family, default)):
        kernel = runtime._kernel_for(fam, cfg, problem, "auto")
        prepared = kernel.prepare(q, k, v)
        row["ms"][name] = median_ms(lambda kernel=kernel, prepared=prepared: kernel.run(prepared))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    measure(SHAPES[0])  # untimed warm-up
    rows = [measure(s) for s in SHAPES]
    lines = [f"Measured on {torch.cuda.get_device_name()}: kernel ms, median of 20.", "",
             "| B, S, H, D | source | picked ms | default ms | default / picked | picked |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        t = r["ms"]
        lines.append(f"| {', '.join(map(str, r['shape']))} | {r['source']} | {t['picked']:.3f} "
                     f"| {t['default']:.3f} | {t['default'] / t['picked']:.3f}x | "
                     f"{r['picked']} |")
    print("\n".join(lines))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "lookup_by_work.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
