"""The evaluation pipeline: compile sandboxes ahead of one GPU sandbox (tuner/sandbox.py), so
that the GPU times one candidate while the next ones compile."""

from __future__ import annotations

import dataclasses
import time
from collections import deque

from tuner.outcomes import Outcome
from tuner.problem import Problem
from tuner.sandbox import CandidateResult, Sandbox, Task, poll
from tuner.search.records import Candidate
from tuner.search.settings import SearchSettings
from tuner.search.target import Target

# How long a search that stops lets the GPU sandbox finish its evaluation before killing it:
# a fresh sandbox (process, imports, CUDA context) costs 10-15 s on an H100 host.
SETTLE_S = 15.0
# Compiled candidates waiting for the GPU, at most: with a warm compile cache a compile is a
# load, and a deeper queue only has the sampler propose further ahead of what it has measured.
READY_DEPTH = 2


def task_for(cand: Candidate, problem: Problem, target: Target, settings: SearchSettings,
             seed: int, kind: str = "compile") -> Task:
    # A seed per trial: each candidate is validated on inputs of its own, the same on a re-run.
    number = cand.trial.number if cand.trial is not None else 0
    return Task(
        kind=kind, family=cand.family, config=cand.config, problem=problem.to_dict(),
        arch=target.gpu.arch, l2_bytes=target.gpu.l2_bytes, seed=seed + number * 16,
        device=target.device, repeats=settings.repeats, warmup=settings.warmup,
        timeout_s=settings.timeout_s,
        accuracy=settings.budget.to_task() if settings.budget is not None else None,
    )


class Pipeline:
    """Compile sandboxes ahead of one GPU sandbox. The GPU times one candidate at a time.

    start_now: start every sandbox here, and again after drop() kills some, rather than on
    first use: a sandbox starts in seconds (the GPU one 10-15 s on an H100 host: imports and a
    CUDA context), which then overlaps the problem's setup and the first compiles instead of
    following them."""

    def __init__(self, compile_jobs: int, start_now: bool = False) -> None:
        self.compilers = [Sandbox(f"compile-{i}", preload=("variants",))
                          for i in range(max(1, compile_jobs))]
        self.gpu = Sandbox("gpu", preload=("torch", "tuner.measure", "variants.reference",
                                           "tuner.activations"))
        self.ready: deque[tuple[Candidate, Task]] = deque()  # compiled, waiting for the GPU
        self.start_now = start_now
        self._start_idle()

    def _start_idle(self) -> None:
        """Start the sandboxes that are not running (start_now only). A child's "ready" waits
        in its pipe until its first task (Sandbox.submit allows for a start-up until then)."""
        if not self.start_now:
            return
        for sandbox in self._all():
            # Sandbox's own start-up (submit starts a child that is not running); tuner/sandbox.py
            # is left as it is: it is part of every stored time's code version (records.py).
            if not sandbox.busy and (sandbox._proc is None or not sandbox._proc.is_alive()):
                sandbox._start()

    def _all(self) -> tuple[Sandbox, ...]:
        return (*self.compilers, self.gpu)

    def in_flight(self) -> list[Candidate]:
        busy = [s.payload[0] for s in self._all() if s.busy and s.payload]
        return busy + [c for c, _ in self.ready]

    def has_room(self) -> bool:
        idle = any(not s.busy for s in self.compilers)
        return idle and len(self.ready) < min(len(self.compilers), READY_DEPTH)

    def compile(self, cand: Candidate, task: Task) -> None:
        sandbox = next(s for s in self.compilers if not s.busy)
        sandbox.submit(dataclasses.replace(task, kind="compile"), (cand, task))

    def step(self, poll_s: float = 1.0) -> list[tuple[Candidate, CandidateResult]]:
        """Wait up to poll_s for the sandboxes; returns the candidates that finished (failed
        compile or evaluated). The caller feeds the GPU (feed) after each step."""
        finished = []
        busy = [s for s in self._all() if s.busy]
        if not busy:
            return finished
        timeout = max(0.0, min(poll_s, min(s.deadline for s in busy) - time.monotonic()))
        for sandbox, ((cand, task), result) in poll(busy, timeout):
            if sandbox is self.gpu:
                result.compile_s = cand.compile_result.compile_s
                finished.append((cand, result))
            elif result.outcome == Outcome.OK:
                cand.compile_result = result
                self.ready.append((cand, task))
            else:
                # Anything that goes wrong in the compiler (a crash or hang included) is the
                # candidate's compile failure.
                if result.outcome in (Outcome.CRASH, Outcome.TIMEOUT):
                    result.message = f"compiler {result.outcome}: {result.message}"
                    if result.outcome == Outcome.CRASH:
                        result.outcome = Outcome.COMPILE_ERROR
                finished.append((cand, result))
        # Not fed here: the caller first stores these results and takes off the queue what
        # they ruled out (discard), since a result can rule out a queued candidate.
        return finished

    def discard(self, drop) -> list[Candidate]:
        """Take the compiled candidates for which drop(cand) holds off the GPU's queue."""
        gone = [cand for cand, _ in self.ready if drop(cand)]
        self.ready = deque((c, t) for c, t in self.ready if not drop(c))
        return gone

    def feed(self) -> None:
        """Give the GPU sandbox, if idle, the earliest compiled candidate."""
        if not self.gpu.busy and self.ready:
            # The earliest trial first: compiles finish in any order, and the baselines and
            # known configs were asked before the sampler's proposals.
            first = min(range(len(self.ready)), key=lambda i: _trial_number(self.ready[i][0]))
            cand, task = self.ready[first]
            del self.ready[first]
            self.gpu.submit(dataclasses.replace(task, kind="evaluate"), (cand, task))

    def evaluate_now(self, task: Task) -> CandidateResult:
        """Blocking evaluation on the GPU sandbox (the final re-time), with its deadline."""
        self.gpu.submit(dataclasses.replace(task, kind="evaluate"), None)
        while True:
            for _, (_, result) in poll([self.gpu], 1.0):
                return result

    def drop(self, settle_s: float = 0.0) -> None:
        """Kill what is in flight (its candidates are abandoned, not measured). settle_s: first
        let the GPU sandbox finish its evaluation for up to that long (the result dropped), so
        that the decision and the next problem reuse it instead of starting another."""
        until = time.monotonic() + settle_s
        while self.gpu.busy and until > time.monotonic():  # done, or still busy: killed below
            poll([self.gpu], until - time.monotonic())
        for sandbox in self._all():
            if sandbox.busy:
                sandbox.kill()
                sandbox.task = sandbox.payload = None
        self.ready.clear()
        self._start_idle()  # the next problem's compiles should not wait for a start either

    def close(self) -> None:
        for sandbox in self._all():
            sandbox.close()

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _trial_number(cand: Candidate) -> int:
    return cand.trial.number if cand.trial is not None else -1


def decision_pipeline() -> Pipeline:
    """A GPU sandbox for a run of decisions (ProblemSearch.decide): `--workers N` decides every
    problem in the parent process, and a sandbox of its own per problem cost a process start,
    imports and a CUDA context each time (7-8 s per problem on the two-H200 machine, serially
    after the children's parallel search: docs/design.md). Sandboxes start on first use: only
    the GPU one does."""
    return Pipeline(compile_jobs=1)
