"""One problem's search: ask -> feasibility -> compile sandboxes -> GPU sandbox -> Store -> tell,
until a budget or the space runs out; then the decision (decision.py), here or elsewhere.

Optuna owns proposal and bookkeeping of the study (RDB storage, so that a re-run with the same
arguments resumes it); our Store owns the measurements. The two are written in that order for
each candidate, under one deferred Ctrl-C, so that a kill between them loses nothing measured:
on resume a config already in the Store is not measured again, its stored value is told instead.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import optuna
from optuna.trial import TrialState

from tuner.outcomes import Outcome
from tuner.problem import Problem
from tuner.sandbox import CandidateResult, Task
from tuner.search.accuracy_classes import accuracy_class, ruled_out_classes, ruled_out_lines
from tuner.search.claims import Claims
from tuner.search.cost import caller_ms, record_cost
from tuner.search.decision import ProblemResult, decide
from tuner.search.interrupts import sigint_deferred
from tuner.search.known import confirmed_row, known_configs
from tuner.search.pool import SETTLE_S, Pipeline, task_for
from tuner.search.proposal import Proposer, Space, tell
from tuner.search.records import Candidate, Records, code_version
from tuner.search.settings import SearchSettings
from tuner.search.storage import family_set_name, open_study, study_name
from tuner.search.target import Target
from tuner.store import Store, TrialRecord, config_hash
from variants import load_family


@dataclass(frozen=True)
class Progress:
    """What a view of a running search shows (tuner/commands/search.py)."""

    study_name: str
    problem: Problem
    mode: str
    feasible: int
    seed: int
    trials: int  # the study's budget
    measured: int  # by every process of the study, infeasible proposals not counted
    best_ms: float | None  # the best valid time this process has seen
    outcomes: Counter  # measured in this run, by outcome
    # Proposals skipped, their accuracy class ruled out (accuracy_classes.py).
    ruled_out_proposals: int = 0


class ProblemSearch:
    """One study on one problem: run() searches it and decides (or leaves the decision to
    whoever searches it last); decide() alone is the parent's part for `--workers N`."""

    def __init__(self, problem: Problem, families: list[str], target: Target, store: Store,
                 storage: optuna.storages.BaseStorage, settings: SearchSettings,
                 on_progress: Callable[[Progress], None] | None = None) -> None:
        self.problem, self.target, self.settings = problem, target, settings
        modules = {name: load_family(name) for name in families}
        self.space = Space.build(modules, problem, target.gpu,
                                 settings.exhaustive_threshold or settings.trials)
        versions = {name: code_version(m) for name, m in modules.items()}
        # Stop after this many candidates without improvement (None: never).
        self.patience, self.confirms = settings.patience, None
        if settings.warm_start:
            self.space.known = known_configs(self.space, problem, target.gpu, store,
                                             target.device_id)
            if self.patience and settings.confirm_patience > 0:
                self.confirms = confirmed_row(self.space, problem, target.gpu, versions,
                                              family_set_name(families), settings.budget,
                                              self.patience)
            if self.confirms:
                self.patience = min(self.patience, settings.confirm_patience)
        self.name = study_name(target.device_id, families, problem, settings.budget)
        self.study, self.seed = open_study(
            storage, self.name, settings,
            {"problem": problem.key(), "families": families, "mode": self.space.mode})
        self.claims = Claims(self.study, families)
        self.claims.fail_dead()
        self.records = Records(store, target.device_id, problem, family_set_name(families),
                               self.name, self.seed, versions)
        self.proposer = Proposer(self.study, self.space, self.claims, self.records, problem,
                                 target.gpu, settings.budget.max_error if settings.budget else None,
                                 self.seed)
        self._on_progress = on_progress or (lambda _p: None)
        self._outcomes: Counter = Counter()
        self._measured_here = 0
        self._best_ms: float | None = None
        self._since_improvement = 0
        self._starting_points = [(config_hash(f, c), accuracy_class(f, c)) for f, c in
                                 (*self.space.baselines,
                                  *((k.family, k.config) for k in self.space.known))]

    def progress(self) -> Progress:
        return Progress(self.name, self.problem, self.space.mode, len(self.space.feasible),
                        self.seed, self.settings.trials, _measured(self.records.stored()),
                        self._best_ms, Counter(self._outcomes), self.proposer.ruled_out_proposals)

    def run(self, decide: bool = True, pipeline: Pipeline | None = None) -> ProblemResult:
        """Search; then, unless `decide` is False (one of the processes of `--workers N`, whose
        parent decides once: decide()), re-time and store the winner, or leave that to another
        process still searching this study (hosts sharing one database): the process that
        finishes last decides, with every host's trials stored. pipeline: the sandboxes of a run
        of problems (the caller closes it), else this search's own."""
        own = pipeline is None
        if own:
            pipeline = Pipeline(self.settings.compile_jobs, start_now=True)
        try:
            stopped = self._search(pipeline) or "trial budget"
            # What is still in flight (a stop on time or patience) is abandoned; past a time
            # budget nothing waits, else the GPU sandbox's evaluation may finish.
            self._abandon(pipeline, settle_s=0.0 if stopped == "time budget" else SETTLE_S)
            if not decide:
                return self._result(stopped)
            # This process has nothing in flight any more: the last one always sees no other.
            others = self.claims.others_searching(self.settings.longest_candidate())
            if others:
                result = self._result(f"{stopped}; the winner is left to {others[0]}, still "
                                      "searching this study")
                result.deferred_to = others[0]
                return result
            return self.decide(stopped, pipeline)
        finally:
            self._abandon(pipeline)
            if own:
                pipeline.close()

    def decide(self, stopped: str, pipeline: Pipeline, outcomes: Counter | None = None,
               measured_here: int | None = None) -> ProblemResult:
        """The decision alone, on the GPU sandbox of `pipeline` (pool.decision_pipeline(): one
        for every problem of a run, for `--workers N`, whose children report `outcomes` and
        `measured_here` instead of this process)."""
        if outcomes is not None:
            self._outcomes = Counter(outcomes)
        if measured_here is not None:
            self._measured_here = measured_here
        return decide(self._result(stopped), self.records, self.space.baselines, pipeline,
                      lambda cand: self._task(cand, "evaluate"))

    def _search(self, pipeline: Pipeline) -> str:
        """The loop; returns why it stopped ("" when the trial budget ran out in flight)."""
        s = self.settings
        start = time.monotonic()
        stored = self.records.stored()
        self._best_ms = min((record_cost(r) for r in stored.values()
                             if r.outcome == Outcome.OK), default=None)
        self._on_progress(self.progress())
        stopped, asking = "", True
        while True:
            if asking:  # what the other processes of this study measured meanwhile
                stored = self.records.stored()
            in_flight = pipeline.in_flight()
            flight = {c.hash for c in in_flight}
            measured = _measured(stored)
            if asking:
                stopped, finish_in_flight = self._stop_reason(measured, start, stored, flight)
                asking = not stopped
                if stopped and not finish_in_flight:
                    return stopped  # run() abandons what is in flight
            # The budget is the study's: trials of every process that searches it count,
            # measured or in flight (RUNNING), ours included.
            room = s.trials - measured - max(self.claims.running(), len(in_flight))
            while asking and pipeline.has_room() and room > 0:
                cand = self.proposer.next(stored, flight)
                if cand is None:
                    stopped, asking = "the sampler proposes nothing new", False
                    break
                pipeline.compile(cand, self._task(cand))
                flight.add(cand.hash)
                room -= 1
            if not pipeline.in_flight():
                return stopped
            if s.time_budget_s and time.monotonic() - start > s.time_budget_s:
                return "time budget"  # what is in flight is abandoned (run(): told FAIL)
            for cand, result in pipeline.step():
                with sigint_deferred():  # stored and told, or neither
                    record = self._finish(cand, result)
                stored.setdefault(record.config_hash, record)
            self._discard_ruled_out(pipeline, stored, repair=asking)
            pipeline.feed()

    def _stop_reason(self, measured: int, start: float, stored,
                     in_flight: set[str]) -> tuple[str, bool]:
        """Why the search stops ("" while it goes on), and whether what is in flight is still
        measured: yes within the trial budget or the space; no past a time budget, and not
        after `patience` candidates without improvement (the pipeline holds up to
        pool.READY_DEPTH compiled candidates and a compile per sandbox; measuring those would
        only extend a search that has stopped improving). Patience counts from the first valid
        time (_finish), and never ends a search before its baselines and known configs are
        measured: the GPU takes candidates as they finish compiling, so sampler proposals can
        come back before the configs a warm start exists for."""
        s = self.settings
        if measured >= s.trials:
            return "trial budget", True
        if s.time_budget_s and time.monotonic() - start > s.time_budget_s:
            return "time budget", False
        if (self.patience and self._since_improvement >= self.patience
                and not self._starting_points_pending(stored)):
            if self.confirms:
                return (f"no improvement in {self.patience} trials (confirming "
                        f"{self.confirms})", False)
            return f"no improvement in {self.patience} trials", False
        if self.proposer.all_done(stored, in_flight):
            return "space exhausted", True
        return "", True

    def _starting_points_pending(self, stored) -> bool:
        """Whether a baseline or known config (Space.baselines, Space.known) is still to be
        stored, its accuracy class not ruled out (such a config is never measured)."""
        ruled_out = ruled_out_classes(stored.values(), self.proposer.max_error)
        return any(digest not in stored and cls not in ruled_out
                   for digest, cls in self._starting_points)

    def _discard_ruled_out(self, pipeline: Pipeline, stored: dict, repair: bool = True) -> None:
        """Compiled candidates of a class ruled out since they were proposed leave the GPU's
        queue unmeasured: the pipeline compiles ahead, so members of a class can be waiting,
        or still compiling, when its first member's result rules it out. repair: enqueue the
        nearest usable config for each (not once the search has stopped asking)."""
        if not pipeline.ready or self.proposer.max_error is None:
            return
        ruled_out = ruled_out_classes(stored.values(), self.proposer.max_error)
        if not ruled_out:
            return
        flight = {c.hash for c in pipeline.in_flight()}
        for cand in pipeline.discard(
                lambda c: accuracy_class(c.family, c.config) in ruled_out):
            with sigint_deferred():
                self.proposer.settle_ruled_out(cand, stored, flight, ruled_out, repair)

    def _finish(self, cand: Candidate, result: CandidateResult) -> TrialRecord:
        record = self.records.record(cand, result)  # the Store first: a kill then loses nothing
        timing = result.timing or {}
        median = caller_ms(timing.get("median_ms"), timing.get("prepare_ms"))
        tell(self.study, cand.trial, result.outcome, median)
        self._outcomes[result.outcome] += 1
        self._measured_here += 1
        if result.outcome == Outcome.OK and (self._best_ms is None or median < self._best_ms):
            self._best_ms, self._since_improvement = median, 0
        elif self._best_ms is not None:  # nothing valid yet: nothing to improve on
            self._since_improvement += 1
        self._on_progress(self.progress())
        return record

    def _abandon(self, pipeline: Pipeline, settle_s: float = 0.0) -> None:
        """Ctrl-C or a budget: what is still in flight is not measured; FAIL frees its trial in
        the study (a re-run proposes it again), and the Store never saw it. settle_s: a stop
        of the search's own lets the GPU sandbox finish its evaluation (Pipeline.drop)."""
        with sigint_deferred():
            for cand in pipeline.in_flight():
                self.study.tell(cand.trial, state=TrialState.FAIL)
        pipeline.drop(settle_s)

    def _task(self, cand: Candidate, kind: str = "compile") -> Task:
        return task_for(cand, self.problem, self.target, self.settings, self.seed, kind)

    def _result(self, stopped: str) -> ProblemResult:
        ruled_out = ruled_out_lines(self.records.stored(), self.proposer.max_error)
        return ProblemResult(self.problem, self.name, self.seed, self.space.mode,
                             len(self.space.feasible), stopped, self._outcomes,
                             self._measured_here, budget=self.settings.budget,
                             ruled_out=ruled_out,
                             ruled_out_proposals=self.proposer.ruled_out_proposals)


def _measured(stored: dict) -> int:
    """Stored configs that reached a compiler (the trial budget counts these)."""
    return sum(1 for r in stored.values() if r.outcome != Outcome.INFEASIBLE)
