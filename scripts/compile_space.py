"""Compile every feasible config of the mma_sync space for an arch; print registers/spills/smem.

    python scripts/compile_space.py [--arch sm_120a] [--workers 2] [--head-dim 128]

No GPU needed (CuTe DSL cross-compiles for the target arch). The logic lives in
variants.mma_sync.build.compile_report, which `tuner space --compile` can call as well.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuner.problem import Problem  # noqa: E402
from variants.mma_sync.build import compile_report, format_report  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="sm_120a")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=128)
    args = parser.parse_args()
    problem = Problem(batch=1, heads=56, seq_len=30272, head_dim=args.head_dim)
    rows = compile_report(args.arch, problem=problem, workers=args.workers)
    print(format_report(rows))
    built = [r for r in rows if "resources" in r]
    failed = [r for r in rows if r["ok"] and "error" in r]
    spilled = [r for r in built if r["resources"].spill_bytes]
    print(f"\n{len(rows)} configs: {len(rows) - sum(r['ok'] for r in rows)} rejected, "
          f"{len(built)} built ({len(spilled)} with local memory), {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
