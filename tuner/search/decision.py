"""The decision for one problem: the top candidates and the family default re-timed side by side,
and the default kept unless the fastest beats it by more than the measured spread.

Only candidates within the accuracy budget take part: a too_inaccurate candidate has no time,
and a re-time holds each pick to the budget again (the winner's stored error is its re-time's).
A default that was too_inaccurate in the search is not re-timed: its accurate twin (the default
with prepare's exact transforms on, Space.accurate) is the baseline instead, and where that is
over the budget too the winner has no baseline to compare with. Where every candidate that passed
the gate was over the budget, no winner is stored and `no_winner` says so."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from tuner.budget import Budget
from tuner.outcomes import Outcome, Role
from tuner.problem import Problem
from tuner.sandbox import Task
from tuner.search.cost import record_cost
from tuner.search.pool import Pipeline
from tuner.search.records import Candidate, Records
from tuner.store import TrialRecord, config_hash

TOP_K_RETIME = 3


@dataclass
class ProblemResult:
    problem: Problem
    study_name: str
    seed: int
    mode: str
    feasible: int
    stopped: str
    outcomes: Counter = field(default_factory=Counter)  # measured in this run, by outcome
    measured_here: int = 0
    winner: TrialRecord | None = None
    default: TrialRecord | None = None
    speedup: float | None = None
    default_kept: bool = False
    # Another process still searching this study when this one stopped: it decides.
    deferred_to: str = ""
    budget: Budget | None = None
    no_winner: str = ""  # why no winner was stored, when candidates ran but none qualified
    # Accuracy classes a measured member ruled out (accuracy_classes.ruled_out_lines), and the
    # proposals of them this process skipped (exhaustive mode proposes none).
    ruled_out: list[str] = field(default_factory=list)
    ruled_out_proposals: int = 0


def pick_winner(valid: list[TrialRecord], default: TrialRecord | None
                ) -> tuple[TrialRecord, bool]:
    """From the re-timed valid candidates (fastest first) and the re-timed default (None if it
    failed): the fastest by what the caller pays (kernel + prepare, tuner.search.cost), unless
    its lead over the default is within the measured spread (the larger kernel IQR of the two);
    then the default, kept. Returns (winner, default kept)."""
    winner = valid[0]
    if default is not None and winner is not default:
        spread = max(winner.iqr_ms or 0.0, default.iqr_ms or 0.0)
        if record_cost(default) - record_cost(winner) <= spread:
            return default, True
    return winner, False


def _fastest_first(records) -> list[TrialRecord]:
    return sorted((r for r in records if r.outcome == Outcome.OK), key=record_cost)


def decide(result: ProblemResult, records: Records, baselines: list[tuple[str, dict]],
           pipeline: Pipeline, task_of: Callable[[Candidate], Task]) -> ProblemResult:
    """Re-time the top TOP_K_RETIME of the study and the baseline (the first of `baselines`,
    the default then its accurate twin, not over the accuracy budget in the search) on the GPU
    sandbox of `pipeline`, store the winner, and fill it into `result`. Without a valid
    candidate (or without a valid re-time) no winner is stored."""
    stored = records.stored()
    ok = _fastest_first(stored.values())
    if not ok:
        result.no_winner = _over_budget(stored.values(), result.budget)
        return result
    default = next((b for b in baselines if not _over(stored.get(config_hash(*b)))), None)
    default_hash = config_hash(*default) if default else None
    picks = [(r.family, r.config, r.config_hash) for r in ok[:TOP_K_RETIME]]
    if default and default_hash not in {p[2] for p in picks}:
        picks.append((*default, default_hash))
    retimed: dict[str, TrialRecord] = {}
    for family, config, digest in picks:
        cand = Candidate(None, family, config, digest, Role.RETIME)
        retimed[digest] = records.record(cand, pipeline.evaluate_now(task_of(cand)))
    valid = _fastest_first(retimed.values())
    if not valid:
        result.no_winner = _over_budget(retimed.values(), result.budget)
        return result
    base = retimed.get(default_hash)
    base = base if base is not None and base.outcome == Outcome.OK else None
    winner, result.default_kept = pick_winner(valid, base)
    speedup = record_cost(base) / record_cost(winner) if base is not None else None
    records.store.set_best(records.device_id, records.problem, records.family_set, winner.id,
                           base.id if base else None, speedup)
    result.winner, result.default, result.speedup = winner, base, speedup
    return result


def _over(record: TrialRecord | None) -> bool:
    return record is not None and record.outcome == Outcome.TOO_INACCURATE


def _over_budget(records, budget: Budget | None) -> str:
    """The line that says every candidate that passed the gate was over the budget ("" when
    none was: then nothing passed the gate, or nothing ran)."""
    over = [r for r in records if r.outcome == Outcome.TOO_INACCURATE]
    if not over:
        return ""
    least = min(over, key=lambda r: r.e2e_error if r.e2e_error is not None else float("inf"))
    where = f"end-to-end error <= {budget.max_error:g} on {budget.data}" if budget else "budget"
    knobs = " ".join(f"{k}={v}" for k, v in least.config.items())
    return (f"all {len(over)} candidates that passed the gate are over the accuracy budget "
            f"({where}); the least error was {least.e2e_error:.4g} ({least.family} {knobs}): no "
            "winner stored; raise --max-error, or search families or knobs that reach it")
