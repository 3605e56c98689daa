"""Launch one wgmma config twice at B=1, H=56, D=128 for Nsight Compute: a warm-up, then the launch
to profile (ncu --launch-skip 1 --launch-count 1 -k regex:Wgmma). Where the time goes:

  ncu --set full -k regex:Wgmma --launch-skip 1 --launch-count 1 -o $OUT/wgmma -f \\
      python3 benchmarks/profile_wgmma.py --seq-len 8192
  ncu -i $OUT/wgmma.ncu-rep --page details > $OUT/ncu_details.txt
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from tuner.measure import random_inputs  # noqa: E402
from tuner.problem import Problem  # noqa: E402
from variants import wgmma  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq-len", type=int, default=8192)
    ap.add_argument("--config", default="", help="JSON config dict (default: the family default)")
    args = ap.parse_args()
    problem = Problem(1, 56, args.seq_len)
    cfg = (wgmma.Config.from_dict(json.loads(args.config)) if args.config
           else wgmma.default("sm_90a", problem))
    kernel = wgmma.compile(cfg, problem, "sm_90a")
    prepared = kernel.prepare(*random_inputs(problem, torch.device("cuda"), seed=0))
    for _ in range(2):
        kernel.run(prepared)
    torch.cuda.synchronize()
    print(f"profiled {cfg.short()} at {problem.key()}")


if __name__ == "__main__":
    main()
