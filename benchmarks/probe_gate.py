"""The correctness gate on a probe tree before it is timed: the wgmma default (knobs on top) of
the package tree at --root, compiled and checked by tuner.gate.validate_kernel at six problems
that reach the kernel's edge cases (a ragged tail, a query length under one tile, a causal
mask, head_dim 64, grouped KV heads with cross lengths). One JSON line a problem; the exit
status is 1 if any failed. E.g. (benchmarks/probes/make_trees.sh builds the trees):

    python3 benchmarks/probe_gate.py --root .ab/before-turn
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

PROBLEMS = (  # (batch, heads, seq_len) and the Problem keywords
    ((1, 4, 1000), {}),
    ((2, 3, 4097), {}),
    ((1, 2, 77), {}),
    ((1, 4, 1000), {"causal": True}),
    ((1, 4, 2000), {"head_dim": 64}),
    ((1, 8, 3000), {"seq_len_kv": 1500, "kv_heads": 2, "causal": True}),
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--root", required=True, help="the package tree to import")
    ap.add_argument("--knobs", default="", help="knob=value,... (YAML values) on the default")
    args = ap.parse_args()
    sys.path.insert(0, args.root)

    import yaml

    from tuner.gate import validate_kernel
    from tuner.gpus import PROFILES
    from tuner.problem import Problem
    from variants import wgmma

    knobs = {k: yaml.safe_load(v) for k, v in (kv.split("=") for kv in args.knobs.split(",") if kv)}
    failed = False
    for dims, extra in PROBLEMS:
        problem = Problem(*dims, **extra)
        cfg = wgmma.default("sm_90a", problem)
        cfg = dataclasses.replace(cfg, **{k: v for k, v in knobs.items() if k in cfg.to_dict()})
        ok, why = wgmma.can_implement(cfg, problem, PROFILES["h200"])
        if not ok:
            print(json.dumps({"problem": problem.key(), "skipped": why}), flush=True)
            continue
        result = validate_kernel(wgmma.compile(cfg, problem, "sm_90a"), problem, "cuda", seed=11)
        failed |= not result.passed
        print(json.dumps({"root": args.root, "problem": problem.key(), "config": cfg.short(),
                          "passed": result.passed, "reason": result.reason,
                          "rel_rms": result.rel_rms}), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
