"""Where a search's time went: compile, validate and time, from the trials a search stored.

  python benchmarks/search_cost.py --db sqlite:///h200.sqlite --seq-len 4096 [--heads 56]

Reads the trials of one problem (all devices and family sets, or --family-set), and prints the
wall time of the search (first trial started -> last finished) beside the per-stage sums:
compile_s (in the compile pool, overlapped with the GPU), validate_s and time_s (on the GPU
worker, one candidate at a time; recorded per trial since the worker records stage times).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuner.problem import Problem  # noqa: E402
from tuner.store import Store  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True)
    parser.add_argument("--seq-len", type=int, required=True)
    parser.add_argument("--heads", type=int, default=56)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--family-set", default=None)
    args = parser.parse_args()
    problem = Problem(1, args.heads, args.seq_len, args.head_dim)
    store = Store(args.db)
    trials = [t for t in store.trials(problem, family_set=args.family_set) if t.role != "bench"]
    if not trials:
        print(f"no trials for {problem.key()} in {args.db}")
        return 1
    outcomes = Counter(t.outcome for t in trials)
    compiled = [t for t in trials if t.compile_s is not None]
    timed = [t for t in trials if t.timing and "validate_s" in t.timing]
    starts = [t.started_at for t in trials if t.started_at]
    ends = [t.finished_at for t in trials if t.finished_at]
    wall = (max(ends) - min(starts)).total_seconds() if starts and ends else float("nan")
    compile_s = sum(t.compile_s for t in compiled)
    validate_s = sum(t.timing["validate_s"] for t in timed)
    time_s = sum(t.timing["time_s"] for t in timed)
    print(f"{problem.key()}: {len(trials)} trials stored, outcomes {dict(outcomes)}")
    print("| stage | seconds | trials | note |")
    print("|---|---|---|---|")
    print(f"| search wall time | {wall:.1f} | {len(trials)} | first start -> last finish |")
    print(f"| compile (sum) | {compile_s:.1f} | {len(compiled)} | in the pool, overlaps the GPU |")
    print(f"| validate (sum) | {validate_s:.1f} | {len(timed)} | inputs, kernel, fp32 reference |")
    print(f"| time (sum) | {time_s:.1f} | {len(timed)} | inputs, warm-up, timed launches |")
    rest = wall - validate_s - time_s
    print(f"| other (wall - GPU stages) | {rest:.1f} | | worker start-up, pipeline waits, "
          "final re-timing |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
