"""The correctness gate on a probe tree before it is timed: the wgmma default (--knobs on top)
of the package tree at --root through default_candidates.gate (tuner.gate.validate_kernel on
fresh random inputs) at six problems that reach the kernel's edge cases (a ragged tail, a query
length under one tile, a causal mask, head_dim 64, grouped KV heads with cross lengths). Prints
one JSON line, the verdict (true, or the first problem failed and why); the exit status is 1 if
it failed. E.g. (benchmarks/probes/make_trees.sh builds the trees):

    python3 benchmarks/probe_gate.py --root .ab/before-turn
"""

from __future__ import annotations

import argparse
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

    from default_candidates import gate, knobs_arg

    from tuner.problem import Problem

    verdict = gate([(args.root, knobs_arg(args.knobs))],
                   *(Problem(*dims, **extra) for dims, extra in PROBLEMS))[args.root]
    print(json.dumps({"root": args.root, "knobs": args.knobs, "passed": verdict is True,
                      "reason": "" if verdict is True else verdict}), flush=True)
    return 0 if verdict is True else 1


if __name__ == "__main__":
    sys.exit(main())
