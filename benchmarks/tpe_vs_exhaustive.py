"""How many measured trials TPE needs to come within 2% of the exhaustive best, replayed on a
measured table.

  python benchmarks/tpe_vs_exhaustive.py --db sqlite:///h200.sqlite --seq-len 4096 \
      --families mma_sync --gpu h200 [--seeds 20] [--within 0.02]

First measure every feasible config on the GPU (an exhaustive search: `tuner search --families
mma_sync --trials N` with N >= the feasible count, which the search runs exhaustively). This
script then replays the search's own sampler (tuner.search.make_sampler, the same define-by-run
space, the default enqueued first, infeasible proposals told as failures without counting, a
repeated config told its stored value) with the measured medians as the objective, for many
seeds, on the CPU. It reports the number of measured candidates until the best so far is within
`--within` of the exhaustive best. The replay freezes each config's timing at its one
measurement: what it measures is the sampler's path through the space, not timing noise.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import optuna  # noqa: E402

from tuner.gpus import PROFILES  # noqa: E402
from tuner.problem import Problem  # noqa: E402
from tuner.search import (  # noqa: E402
    FAILED_VALUE_MS,
    feasible_configs,
    make_sampler,
    params_of,
    suggest,
)
from tuner.store import Store, config_hash  # noqa: E402
from variants import load_family  # noqa: E402


def measured_table(store, problem, families) -> dict[str, float]:
    """config hash -> best measured median (ok trials of these families, any role)."""
    table: dict[str, float] = {}
    for t in store.trials(problem):
        if t.family in families and t.outcome == "ok" and t.median_ms:
            table[t.config_hash] = min(t.median_ms, table.get(t.config_hash, float("inf")))
    return table


def replay(seed: int, families, modules, problem, gpu, table, target_ms, budget) -> int | None:
    spaces = {f: modules[f].space(gpu.arch) for f in families}
    study = optuna.create_study(sampler=make_sampler(seed, budget), direction="minimize")
    default = families[0], modules[families[0]].default(gpu.arch, problem).to_dict()
    study.enqueue_trial(params_of(*default))
    seen: dict[str, float] = {}
    measured = 0
    best = float("inf")
    for _ in range(budget * 50):  # infeasible proposals do not count; bound the asks anyway
        trial = study.ask()
        family, config = suggest(trial, families, spaces)
        module = modules[family]
        ok, _ = module.can_implement(module.Config.from_dict(config), problem, gpu)
        digest = config_hash(family, config)
        value = table.get(digest) if ok else None
        trial.set_constraint("valid", 0.0 if value is not None else 1.0)
        study.tell(trial, value if value is not None else FAILED_VALUE_MS)
        if value is None or digest in seen:
            continue
        seen[digest] = value
        measured += 1
        best = min(best, value)
        if best <= target_ms:
            return measured
        if measured >= budget:
            return None
    return None


def random_order_expectation(modules, families, problem, gpu, feasible, table, target) -> float:
    """The baseline TPE must beat: the default first, then the other configs in a uniformly
    random order, counted as the replay counts (only configs with a measured time). With k of
    the n others within target, the first hit among them comes at (n + 1) / (k + 1) in
    expectation (order statistics without replacement)."""
    default = config_hash(families[0], modules[families[0]].default(gpu.arch, problem).to_dict())
    default_measured = default in table
    if default_measured and table[default] <= target:
        return 1.0
    others = [h for h in (config_hash(*c) for c in feasible) if h != default and h in table]
    hits = sum(1 for h in others if table[h] <= target)
    return int(default_measured) + (len(others) + 1) / (hits + 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True)
    parser.add_argument("--seq-len", type=int, required=True)
    parser.add_argument("--heads", type=int, default=56)
    parser.add_argument("--families", default="mma_sync")
    parser.add_argument("--gpu", default="h200")
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--within", type=float, default=0.02)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    families = args.families.split(",")
    modules = {f: load_family(f) for f in families}
    gpu = PROFILES[args.gpu]
    problem = Problem(1, args.heads, args.seq_len)
    table = measured_table(Store(args.db), problem, families)
    feasible = feasible_configs(modules, problem, gpu)
    missing = [c for c in feasible if config_hash(*c) not in table]
    if missing:
        print(f"{len(missing)} of {len(feasible)} feasible configs have no measured time "
              f"(failed or not searched); the replay treats them as failures")
    if not table:
        print("no measured configs: run the exhaustive search first")
        return 1
    best_ms = min(table.values())
    target = best_ms * (1 + args.within)
    counts = [replay(s, families, modules, problem, gpu, table, target, len(feasible))
              for s in range(args.seeds)]
    hits = sorted(c for c in counts if c is not None)
    print(f"{problem.key()} on {gpu.name}: exhaustive = {len(feasible)} feasible configs, "
          f"{len(table)} measured ok, best {best_ms:.4f} ms")
    print(f"TPE to within {args.within:.1%} of the exhaustive best over {args.seeds} seeds: "
          f"median {statistics.median(hits) if hits else 'n/a'}, min {hits[0] if hits else 'n/a'},"
          f" max {hits[-1] if hits else 'n/a'} measured trials; never within budget: "
          f"{counts.count(None)}")
    expected = random_order_expectation(modules, families, problem, gpu, feasible, table, target)
    print(f"random order (default first), expected: {expected:.1f} measured trials")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
