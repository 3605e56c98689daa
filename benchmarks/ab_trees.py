"""The wgmma family default, kernel alone, from the package tree at --root: for timing two
versions of the kernel side by side on one machine, each in its own process (the project is
imported from --root, ahead of the checkout on PYTHONPATH), e.g. the tree of a past commit:

    git archive 3099e4a variants tuner | tar -x -C /tmp/per-head
    python3 benchmarks/ab_trees.py --root /tmp/per-head --label per-head
    python3 benchmarks/ab_trees.py --root . --label main --peer cudnn-fp8

One JSON line per (length, system): median and IQR of time_kernel (L2-cold rotation, fresh
random inputs), B=1, H=56, D=128 (or --heads, --head-dim), the default's knobs with Q quantized
by prepare (every tree has that placement)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from default_candidates import knobs_arg


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--root", required=True, help="the package tree to import")
    ap.add_argument("--label", required=True)
    ap.add_argument("--seq-lens", default="8192,30272")
    ap.add_argument("--heads", type=int, default=56)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--peer", default="", help="a tuner.peers name timed beside, e.g. cudnn-fp8")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--knobs", default="", help="knob=value,... set on the default, each value "
                    "read as YAML (e.g. kv_stages=3,tile_order=longest_first), for a tree whose "
                    "Config has those knobs")
    args = ap.parse_args()
    sys.path.insert(0, args.root)

    import torch

    from tuner.gpus import PROFILES
    from tuner.measure import time_kernel
    from tuner.problem import Problem
    from variants import wgmma

    l2 = PROFILES["h200"].l2_bytes
    for seq_len in map(int, args.seq_lens.split(",")):
        problem = Problem(1, args.heads, seq_len, head_dim=args.head_dim)
        cfg = wgmma.default("sm_90a", problem)
        if "q_quant" in cfg.to_dict():
            cfg = dataclasses.replace(cfg, q_quant="prepare")
        cfg = dataclasses.replace(cfg, **knobs_arg(args.knobs))
        systems = [(args.label, wgmma.compile(cfg, problem, "sm_90a"))]
        if args.peer:
            from tuner.peers import make_peer
            systems.append((args.peer, make_peer(args.peer, problem)))
        for label, system in systems:
            t = time_kernel(system, problem, torch.device("cuda"), 1, l2, repeats=args.repeats)
            print(json.dumps({"label": label, "seq_len": seq_len, "heads": args.heads,
                              "head_dim": args.head_dim,
                              "ms": round(t.median_ms, 4), "iqr_ms": round(t.iqr_ms, 4),
                              "config": cfg.short() if label == args.label else ""}),
                  flush=True)


if __name__ == "__main__":
    main()
