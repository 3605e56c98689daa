"""The no-false-reject sweep: every feasible config of a family's sm_90a space through the
correctness gate at several lengths, in parallel processes on one GPU (the gate's work is small
launches and Python; correctness does not care that they share the GPU). Compile the space into
the disk cache first (`tuner space --gpu h200 --family F --compile --jobs 16`).

Prints the counts, every failure, and the largest value of each metric over all passing runs
beside its threshold (the margin the thresholds leave on real kernels); writes JSON to --out.

    python benchmarks/gate_sweep.py --family wgmma --seq-lens 1,77,4097 --heads 2 --procs 8
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

METRICS = ("rel_rms", "worst_row", "head_slope_error", "lse_excess")


def feasible(family: str, heads: int):
    from tuner.gpus import PROFILES
    from tuner.problem import Problem
    from variants import load_family
    from variants.base import judge_space

    fam = load_family(family)
    return [c.to_dict() for c, ok, _ in judge_space(fam, Problem(1, heads, 4096), PROFILES["h200"])
            if ok]


def work(args) -> list[dict]:
    family, configs, seq_lens, heads, batch, seed = args
    import torch

    from tuner.gate import validate_kernel
    from tuner.measure import CandidateFailure
    from tuner.problem import Problem
    from variants import load_family

    fam = load_family(family)
    rows = []
    for i, raw in enumerate(configs):
        cfg = fam.Config.from_dict(raw)
        for s in seq_lens:
            problem = Problem(batch, heads, s)
            t0 = time.perf_counter()
            try:
                kernel = fam.compile(cfg, problem, "sm_90a")
                report = validate_kernel(kernel, problem, torch.device("cuda"), seed + 31 * i + s)
                row = {"passed": report.passed, "reason": report.reason, "cases": report.cases}
            except CandidateFailure as exc:
                row = {"passed": False, "reason": f"{exc.outcome}: {exc.message}", "cases": []}
            rows.append({"config": raw, "seq_len": s, "gate_s": time.perf_counter() - t0, **row})
    return rows


def main() -> None:
    from variants.reference import HEAD_SLOPE_MAX, REL_RMS_MAX, ROW_REL_MAX

    ap = argparse.ArgumentParser()
    ap.add_argument("--family", required=True)
    ap.add_argument("--seq-lens", default="1,77,4097")
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--procs", type=int, default=8)
    ap.add_argument("--limit", type=int, default=0, help="first N configs only")
    ap.add_argument("--seed", type=int, default=int(time.time()) % 100000)
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    seq_lens = [int(s) for s in args.seq_lens.split(",")]
    configs = feasible(args.family, args.heads)
    if args.limit:
        configs = configs[: args.limit]
    shards = [(args.family, configs[i :: args.procs], seq_lens, args.heads, args.batch,
               args.seed + 1000003 * i) for i in range(args.procs)]
    t0 = time.perf_counter()
    with mp.get_context("spawn").Pool(args.procs) as pool:
        rows = [r for part in pool.map(work, shards) for r in part]
    wall = time.perf_counter() - t0
    failed = [r for r in rows if not r["passed"]]
    worst = {m: max((c[m] for r in rows if r["passed"] for c in r["cases"]), default=0.0)
             for m in METRICS}
    limits = {"rel_rms": REL_RMS_MAX, "worst_row": ROW_REL_MAX,
              "head_slope_error": HEAD_SLOPE_MAX, "lse_excess": 1.0}
    print(f"{args.family}: {len(configs)} configs x S={seq_lens} (B={args.batch} "
          f"H={args.heads}, seed {args.seed}): {len(rows) - len(failed)} of {len(rows)} runs "
          f"passed in {wall:.0f} s wall, {args.procs} processes; gate per run: median "
          f"{sorted(r['gate_s'] for r in rows)[len(rows) // 2]:.3f} s")
    for m in METRICS:
        print(f"  largest {m} over passing runs: {worst[m]:.4g} (threshold {limits[m]:.4g})")
    for r in failed[:40]:
        print(f"  FAIL S={r['seq_len']} {r['config']}: {r['reason']}")
    out = Path(args.out) / f"gate_sweep_{args.family}.json"
    out.write_text(json.dumps({"family": args.family, "seq_lens": seq_lens, "heads": args.heads,
                               "configs": len(configs), "runs": len(rows), "failed": failed,
                               "worst": worst, "wall_s": wall, "seed": args.seed}, indent=1))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
