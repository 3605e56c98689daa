"""What a search is asked to do (SearchSettings) and the constants every part of it shares.

No Optuna here: `tuner search --help` and the CLI defaults test import this without it.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from tuner.budget import Budget

# Told to Optuna for candidates that did not produce a valid time; the constraint value, not this
# number, is what keeps TPE away from them (infeasible trials rank behind every feasible one).
FAILED_VALUE_MS = 1e9
# Consecutive proposals that reach no compiler (infeasible or already measured) before the
# sampler is deemed to have nothing new to offer.
MAX_BARREN_ASKS = 200


@dataclass(frozen=True)
class SearchSettings:
    trials: int = 64  # candidates that reach a compiler, over all runs of the study
    time_budget_s: float | None = None  # wall time of this run
    patience: int | None = 32  # stop after this many measured candidates without improvement
    # The patience (or `patience`, where fewer) of a search that confirms a shipped row
    # (known.confirmed_row): the row came out of a search like this one, so its neighbours' rows
    # and a few proposals show whether this device disagrees; an improvement restarts the count.
    confirm_patience: int = 6
    seed: int | None = None  # None: the study's recorded seed, else a fresh random one
    compile_jobs: int = 2
    timeout_s: float = 600.0  # per candidate and stage (compile, evaluate)
    repeats: int = 20
    warmup: int = 3
    exhaustive_threshold: int | None = None  # None: the trial budget
    resume: bool = False  # require an existing study
    # Measure the configs known near the problem (search/known.py) right after the baselines;
    # off (`--no-warm-start`): the sampler alone, for a cold comparison.
    warm_start: bool = True
    # The accuracy budget every candidate that passes the gate is held to (None: none; the CLI
    # always sets one). Part of the study's name: another budget or data is another study.
    budget: Budget | None = None

    def longest_candidate(self) -> dt.timedelta:
        """How long a trial can stay RUNNING in a live process: compile, wait behind the compile
        pool's other candidates on the GPU, evaluate, each within the per-stage timeout. A
        RUNNING trial older than this belongs to a dead process."""
        return dt.timedelta(seconds=self.timeout_s * (2 + self.compile_jobs))
