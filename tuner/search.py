"""The search for one problem: an Optuna study that proposes feasible configs, a compile pool that
builds them ahead of the GPU, one GPU worker that validates and times them, and a final re-time
that decides the winner against the family default.

Optuna owns proposal and bookkeeping of the study (RDB storage, so a re-run with the same
arguments resumes it); our Store owns the measurements. The two are written in that order for
each candidate, so a kill between them loses nothing measured: on resume a config already in the
Store is not measured again, its stored value is told to the study instead.

Parameters are named "<family>.<knob>" after a categorical "family", so that several families
share one study with knobs conditional on the family (multivariate TPE with group=True).

Modes: "exhaustive" when the feasible space is no larger than the trial budget: the next feasible
config that nobody has measured or claimed is enqueued before each ask (default first), so no
infeasible point is ever asked; "tpe" otherwise: multivariate TPE where each trial sets a
constraint, so configs that are infeasible or fail teach the sampler where not to go. Either way
only configs that pass can_implement reach a compiler.

Several processes may search one study at once (one per GPU, DESIGN.md; `--workers N` starts
them, tuner/multi_gpu.py): Optuna hands out the trials; each trial records its owner (host:pid),
so a re-run on the same host fails the RUNNING trials of a dead owner at once and proposes their
configs again. Of two trials that hold one config, the earlier keeps it. With `--workers` the
searching processes skip the decision and their parent makes it once (ProblemSearch.decide);
hosts sharing a study through one database decide in the process that finishes last (run()).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import os
import random
import signal
import socket
import threading
import time
import warnings
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import optuna
from optuna.trial import TrialState

from tuner.problem import Problem
from tuner.store import Store, TrialRecord, config_hash
from tuner.worker import CandidateResult, Task, Worker, poll
from variants import load_family
from variants.base import enumerate_space

# Told to Optuna for candidates that did not produce a valid time; the constraint value, not this
# number, is what keeps TPE away from them (infeasible trials rank behind every feasible one).
FAILED_VALUE_MS = 1e9
# Outcomes that say nothing about speed but about the config: all violate the constraint.
ROLE_DEFAULT, ROLE_SEARCH, ROLE_RETIME = "default", "search", "retime"
# Consecutive proposals that reach no compiler (infeasible or already measured) before the
# sampler is deemed to have nothing new to offer.
MAX_BARREN_ASKS = 200
TOP_K_RETIME = 3
# A RUNNING trial that still has no owner this long after its ask was killed in between.
ORPHAN_AFTER_S = 120.0

optuna.logging.set_verbosity(optuna.logging.WARNING)


@dataclass(frozen=True)
class SearchSettings:
    trials: int = 64  # candidates that reach a compiler, over all runs of the study
    time_budget_s: float | None = None  # wall time of this run
    patience: int | None = 32  # stop after this many measured candidates without improvement
    seed: int | None = None  # None: the study's recorded seed, else a fresh random one
    compile_jobs: int = 2
    timeout_s: float = 600.0  # per candidate and stage (compile, evaluate)
    repeats: int = 20
    warmup: int = 3
    exhaustive_threshold: int | None = None  # None: the trial budget
    resume: bool = False  # require an existing study


@dataclass
class Target:
    """Where candidates run: the GPU profile, the device fingerprint, the torch device."""

    gpu: object  # gpus.GpuProfile
    device_id: str
    fingerprint: dict
    device: str  # "cuda" or "cpu"


@dataclass
class _Candidate:
    trial: optuna.Trial
    family: str
    config: dict
    hash: str
    role: str
    started_at: dt.datetime
    compile_result: CandidateResult | None = None


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
    # Another process still searching this study when this one stopped: it decides (see run()).
    deferred_to: str = ""


# ---- space -------------------------------------------------------------------------------------

def family_set_name(families: list[str]) -> str:
    return "+".join(families)


def study_name(device_id: str, families: list[str], problem: Problem) -> str:
    return f"{device_id}:{family_set_name(families)}:{problem.key()}"


def code_version(family_module) -> str:
    """Hash of the family's source files and the tuner's search/measure code."""
    path = Path(family_module.__file__)
    files = sorted(path.parent.glob("*.py")) if path.name == "__init__.py" else [path]
    here = Path(__file__).parent
    files += [here / "measure.py", here / "worker.py"]
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.read_bytes())
    return digest.hexdigest()[:12]


def suggest(trial: optuna.Trial, families: list[str], spaces: dict[str, dict]) -> tuple[str, dict]:
    """Define-by-run: the family first, then that family's knobs."""
    family = trial.suggest_categorical("family", families)
    config = {knob: trial.suggest_categorical(f"{family}.{knob}", values)
              for knob, values in spaces[family].items()}
    return family, config


def params_of(family: str, config: dict) -> dict:
    return {"family": family, **{f"{family}.{k}": v for k, v in config.items()}}


def feasible_configs(modules: dict, problem: Problem, gpu) -> list[tuple[str, dict]]:
    """Every (family, config) that can_implement accepts, in enumeration order."""
    found = []
    for name, module in modules.items():
        for cfg in enumerate_space(module.Config, module.space(gpu.arch)):
            if module.can_implement(cfg, problem, gpu)[0]:
                found.append((name, cfg.to_dict()))
    return found


def make_sampler(seed: int, trials: int) -> optuna.samplers.BaseSampler:
    """Multivariate TPE, for both modes; the constraint each trial sets (Trial.set_constraint,
    > 0 for anything but a valid time) ranks failed configs behind every valid one. In
    exhaustive mode enqueued configs come first and the sampler is never reached.
    BruteForceSampler is not used: it would walk the infeasible product too, and it calls
    study.stop() when done, which is only legal inside study.optimize; the search uses ask/tell
    so that compiles run ahead of the GPU."""
    with warnings.catch_warnings():
        # group=True is "experimental" in Optuna 5 but is what conditional knobs need.
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(
            seed=seed, multivariate=True, group=True, constant_liar=True,
            n_startup_trials=max(4, min(10, trials // 4)),
        )


# ---- pipeline ----------------------------------------------------------------------------------

class _Pipeline:
    """Compile workers ahead of one GPU worker. The GPU times one candidate at a time."""

    def __init__(self, compile_jobs: int) -> None:
        self.compilers = [Worker(f"compile-{i}", preload=("variants",))
                          for i in range(max(1, compile_jobs))]
        self.gpu = Worker("gpu", preload=("torch", "tuner.measure", "variants.reference"))
        self.ready: deque[tuple[_Candidate, Task]] = deque()  # compiled, waiting for the GPU

    def in_flight(self) -> list[_Candidate]:
        busy = [w.payload[0] for w in (*self.compilers, self.gpu) if w.busy and w.payload]
        return busy + [c for c, _ in self.ready]

    def has_room(self) -> bool:
        idle = any(not w.busy for w in self.compilers)
        return idle and len(self.ready) < len(self.compilers)

    def compile(self, cand: _Candidate, task: Task) -> None:
        worker = next(w for w in self.compilers if not w.busy)
        worker.submit(Task(**{**task.__dict__, "kind": "compile"}), (cand, task))

    def step(self, poll_s: float = 1.0) -> list[tuple[_Candidate, CandidateResult]]:
        """Move candidates along; returns those that finished (failed compile or evaluated)."""
        finished = []
        self._feed_gpu()
        busy = [w for w in (*self.compilers, self.gpu) if w.busy]
        if not busy:
            return finished
        now = time.monotonic()
        timeout = max(0.0, min(poll_s, min(w.deadline for w in busy) - now))
        for worker, ((cand, task), result) in poll(busy, timeout):
            if worker is self.gpu:
                result.compile_s = cand.compile_result.compile_s
                finished.append((cand, result))
            elif result.outcome == "ok":
                cand.compile_result = result
                self.ready.append((cand, task))
            else:
                # Anything that goes wrong in the compiler (a crash or hang included) is the
                # candidate's compile failure.
                if result.outcome in ("crash", "timeout"):
                    result.message = f"compiler {result.outcome}: {result.message}"
                    result.outcome = "compile_error" if result.outcome == "crash" else "timeout"
                finished.append((cand, result))
        self._feed_gpu()
        return finished

    def _feed_gpu(self) -> None:
        if not self.gpu.busy and self.ready:
            cand, task = self.ready.popleft()
            self.gpu.submit(Task(**{**task.__dict__, "kind": "evaluate"}), (cand, task))

    def evaluate_now(self, task: Task) -> CandidateResult:
        """Blocking evaluation on the GPU worker (the final re-time), with its deadline."""
        self.gpu.submit(task, None)
        while True:
            for _, (_, result) in poll([self.gpu], 1.0):
                return result

    def close(self) -> None:
        for w in (*self.compilers, self.gpu):
            w.close()


# ---- the search --------------------------------------------------------------------------------

class ProblemSearch:
    """One study: ask -> feasibility -> compile pool -> GPU worker -> Store -> tell; then decide."""

    def __init__(self, problem: Problem, families: list[str], target: Target, store: Store,
                 storage: optuna.storages.BaseStorage, settings: SearchSettings,
                 on_progress: Callable[[ProblemSearch], None] | None = None) -> None:
        self.problem = problem
        self.families = families
        self.modules = {name: load_family(name) for name in families}
        self.spaces = {name: m.space(target.gpu.arch) for name, m in self.modules.items()}
        self.target = target
        self.store = store
        self.settings = settings
        self.on_progress = on_progress or (lambda _s: None)
        self.family_set = family_set_name(families)
        self.name = study_name(target.device_id, families, problem)
        self.versions = {name: code_version(m) for name, m in self.modules.items()}
        self.feasible = feasible_configs(self.modules, problem, target.gpu)
        self.feasible_hashes = {config_hash(f, c) for f, c in self.feasible}
        primary = self.modules[families[0]]
        self.default = (families[0], primary.default(target.gpu.arch, problem).to_dict())
        self.default_hash = config_hash(*self.default)
        threshold = settings.exhaustive_threshold or settings.trials
        self.mode = "exhaustive" if len(self.feasible) <= threshold else "tpe"
        self.study, self.seed = self._open_study(storage)
        self.outcomes: Counter = Counter()
        self.measured_here = 0
        self.best_ms: float | None = None
        self._since_improvement = 0

    # -- study --

    def _open_study(self, storage) -> tuple[optuna.Study, int]:
        from tuner.errors import TunerError

        exists = self.name in {s.study_name for s in optuna.get_all_study_summaries(storage)}
        if self.settings.resume and not exists:
            raise TunerError(
                f"--resume: no stored study {self.name!r}; check that --gpu, --families, --heads, "
                "--batch, --head-dim, --seq-lens and --storage match the interrupted search"
            )
        seed = self.settings.seed
        if seed is None:
            seed = random.SystemRandom().randrange(2**31)
        # Optuna's create_study(load_if_exists) is the race-free way for two processes to open one
        # study; the sampler's seed is the recorded one when resuming without --seed.
        probe = optuna.create_study(storage=storage, study_name=self.name, direction="minimize",
                                    load_if_exists=True)
        recorded = probe.user_attrs.get("seed")
        if recorded is None:
            probe.set_user_attr("seed", seed)
            probe.set_user_attr("problem", self.problem.key())
            probe.set_user_attr("families", self.families)
            probe.set_user_attr("mode", self.mode)
        elif self.settings.seed is None:
            seed = recorded
        study = optuna.load_study(study_name=self.name, storage=storage,
                                  sampler=make_sampler(seed, self.settings.trials))
        self._fail_dead_owners(study)
        return study, seed

    def _fail_dead_owners(self, study: optuna.Study) -> None:
        """RUNNING trials of a process on this host that no longer exists (killed mid-search)
        will never be told: fail them, so their configs can be proposed again. A trial without
        an owner long after its start was killed between ask and set_user_attr."""
        host = socket.gethostname()
        now = dt.datetime.now()
        for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            owner_host, _, pid = str(trial.user_attrs.get("owner", "")).rpartition(":")
            dead = owner_host == host and pid.isdigit() and not _pid_alive(int(pid))
            orphan = not pid and trial.datetime_start is not None and \
                (now - trial.datetime_start).total_seconds() > ORPHAN_AFTER_S
            if dead or orphan:
                study.tell(trial.number, state=TrialState.FAIL, skip_if_finished=True)

    def _trial_hash(self, trial) -> str | None:
        """Config hash of a trial's params (enqueued or suggested); None before it has any."""
        params = trial.system_attrs.get("fixed_params", trial.params)
        family = params.get("family")
        if family not in self.modules:
            return None
        prefix = f"{family}."
        return config_hash(family, {k[len(prefix):]: v for k, v in params.items()
                                    if k.startswith(prefix)})

    def _claimed(self, states=(TrialState.RUNNING, TrialState.WAITING)) -> set[str]:
        """Config hashes of trials that some process holds (RUNNING) or will (WAITING)."""
        claimed = set()
        for trial in self.study.get_trials(deepcopy=False, states=states):
            if trial.state == TrialState.RUNNING and "owner" not in trial.user_attrs:
                continue  # its asker died before naming itself (or is a split second from it)
            claimed.add(self._trial_hash(trial))
        return claimed - {None}

    def _held_by_earlier(self, trial: optuna.Trial, digest: str) -> bool:
        """Two processes that enqueue (or sample) the same config a moment apart both see it
        free; each then holds a trial of it. The earlier trial number keeps it, the later backs
        off, so that the config is measured once. A COMPLETE earlier trial counts too: it was
        measured after this process last read the Store."""
        states = (TrialState.RUNNING, TrialState.WAITING, TrialState.COMPLETE)
        for other in self.study.get_trials(deepcopy=False, states=states):
            if other.number < trial.number and self._trial_hash(other) == digest:
                return True
        return False

    def _enqueue_next(self, stored: dict[str, TrialRecord], in_flight: set[str]) -> None:
        """Put the next config nobody has measured or claimed in the study's queue: the
        default first (so the tuned result is never worse than it), then, in exhaustive mode,
        every feasible config in turn. Two processes may race and enqueue one config twice;
        the later trial backs off (_held_by_earlier)."""
        taken = set(stored) | in_flight | self._claimed()
        order = [self.default] + (self.feasible if self.mode == "exhaustive" else [])
        for family, config in order:
            digest = config_hash(family, config)
            if digest not in taken:
                role = ROLE_DEFAULT if digest == self.default_hash else ROLE_SEARCH
                # The owner goes in with the params: a kill right after the ask pops this trial
                # must still leave it attributable to a (dead) process.
                self.study.enqueue_trial(params_of(family, config),
                                         user_attrs={"role": role, "owner": _owner()})
                return

    # -- bookkeeping --

    def _stored(self) -> dict[str, TrialRecord]:
        """config hash -> the first stored search/default trial of this study."""
        found: dict[str, TrialRecord] = {}
        for rec in self.store.trials(self.problem, self.target.device_id, self.family_set,
                                     study_name=self.name):
            if rec.role != ROLE_RETIME:
                found.setdefault(rec.config_hash, rec)
        return found

    def measured_count(self) -> int:
        return sum(1 for r in self._stored().values() if r.outcome != "infeasible")

    def _tell(self, trial: optuna.Trial, outcome: str, median_ms: float | None) -> None:
        ok = outcome == "ok" and median_ms is not None
        trial.set_user_attr("outcome", outcome)
        trial.set_constraint("valid", 0.0 if ok else 1.0)
        self.study.tell(trial, median_ms if ok else FAILED_VALUE_MS)

    def _record(self, cand: _Candidate, result: CandidateResult,
                role: str | None = None) -> TrialRecord:
        timing, acc, res = result.timing or {}, result.accuracy or {}, result.resources or {}
        median = timing.get("median_ms")
        rec = TrialRecord(
            id=None, device_id=self.target.device_id, problem_key=self.problem.key(),
            family_set=self.family_set, family=cand.family, config=cand.config,
            config_hash=cand.hash, outcome=result.outcome, message=result.message,
            role=role or cand.role, study_name=self.name,
            optuna_number=cand.trial.number if cand.trial is not None else None,
            median_ms=median, iqr_ms=timing.get("iqr_ms"),
            tflops=self.problem.tflops(median) if median else None,
            prepare_ms=timing.get("prepare_ms"), rel_rms=acc.get("rel_rms"),
            max_abs=acc.get("max_abs"), lse_max_err=acc.get("lse_max_err"),
            nonfinite=acc.get("nonfinite"), compile_s=result.compile_s,
            registers=res.get("registers"), spill_bytes=res.get("spill_bytes"),
            smem_bytes=res.get("smem_bytes"), sm_clock_mhz=timing.get("sm_clock_mhz"),
            temperature_c=timing.get("temperature_c"), timing=timing or None, seed=self.seed,
            code_version=self.versions[cand.family], started_at=cand.started_at,
        )
        rec_id = self.store.record_trial(rec)
        return TrialRecord(**{**rec.__dict__, "id": rec_id})

    def _finish(self, cand: _Candidate, result: CandidateResult) -> None:
        self._record(cand, result)  # the Store first: a kill after this loses nothing measured
        median = (result.timing or {}).get("median_ms")
        self._tell(cand.trial, result.outcome, median)
        self.outcomes[result.outcome] += 1
        self.measured_here += 1
        if result.outcome == "ok" and (self.best_ms is None or median < self.best_ms):
            self.best_ms = median
            self._since_improvement = 0
        else:
            self._since_improvement += 1
        self.on_progress(self)

    def _task(self, cand: _Candidate) -> Task:
        return Task(
            kind="compile", family=cand.family, config=cand.config, problem=self.problem.to_dict(),
            arch=self.target.gpu.arch, l2_bytes=self.target.gpu.l2_bytes,
            seed=self.seed + (cand.trial.number if cand.trial is not None else 0) * 16,
            device=self.target.device, repeats=self.settings.repeats, warmup=self.settings.warmup,
            timeout_s=self.settings.timeout_s,
        )

    # -- proposal --

    def _ask(self, stored: dict[str, TrialRecord], in_flight: set[str]) -> _Candidate | None:
        """The next candidate for the compiler, or None if the sampler has nothing new. Proposals
        that are infeasible or already measured are settled here without a compiler."""
        for _ in range(MAX_BARREN_ASKS):
            with self._atomic():  # a trial must never exist without its owner
                self._enqueue_next(stored, in_flight)
                trial = self.study.ask()
                trial.set_user_attr("owner", _owner())
                family, config = suggest(trial, self.families, self.spaces)
            digest = config_hash(family, config)
            role = trial.user_attrs.get("role", ROLE_SEARCH)
            if digest == self.default_hash:
                role = ROLE_DEFAULT
            cand = _Candidate(trial, family, config, digest, role, _utcnow())
            module = self.modules[family]
            ok, reason = module.can_implement(module.Config.from_dict(config), self.problem,
                                              self.target.gpu)
            if not ok:
                if digest not in stored:
                    stored[digest] = self._record(cand, CandidateResult("infeasible", reason))
                self._tell(trial, "infeasible", None)
                continue
            if digest in stored:
                # Measured before (an earlier run, or the other process): tell the stored value.
                self._tell(trial, stored[digest].outcome, stored[digest].median_ms)
                continue
            if digest in in_flight or self._held_by_earlier(trial, digest):
                self.study.tell(trial, state=TrialState.FAIL)
                continue
            return cand
        return None

    def _all_done(self, stored: dict[str, TrialRecord], in_flight: set[str]) -> bool:
        # A WAITING trial is not done: the next ask pops it.
        running = (TrialState.RUNNING,)
        if not self.feasible_hashes <= set(stored) | in_flight | self._claimed(running):
            return False
        # Held by a process that died after this search began? Free those and look again.
        self._fail_dead_owners(self.study)
        return self.feasible_hashes <= set(stored) | in_flight | self._claimed(running)

    # -- main loop --

    def run(self, decide: bool = True) -> ProblemResult:
        """Search until a budget or the space runs out; then, unless `decide` is False (one of
        several processes searching this study: the parent decides once, see decide()), re-time
        and store the winner."""
        settings = self.settings
        start = time.monotonic()
        pipeline = _Pipeline(settings.compile_jobs)
        stopped = ""
        asking = True
        try:
            stored = self._stored()
            self.best_ms = min((r.median_ms for r in stored.values() if r.outcome == "ok"),
                               default=None)
            self.on_progress(self)
            while True:
                if asking:  # what the other processes of this study measured meanwhile
                    stored = self._stored()
                in_flight = pipeline.in_flight()
                flight_hashes = {c.hash for c in in_flight}
                measured = sum(1 for r in stored.values() if r.outcome != "infeasible")
                if asking:
                    stopped = self._stop_reason(measured, start, stored, flight_hashes)
                    asking = not stopped
                # The budget is the study's: trials of every process that searches it count,
                # measured or in flight (RUNNING), ours included.
                running = len(self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)))
                room = settings.trials - measured - max(running, len(in_flight))
                while asking and pipeline.has_room() and room > 0:
                    cand = self._ask(stored, flight_hashes)
                    if cand is None:
                        stopped, asking = "the sampler proposes nothing new", False
                        break
                    pipeline.compile(cand, self._task(cand))
                    flight_hashes.add(cand.hash)
                    room -= 1
                if not pipeline.in_flight():
                    break
                if settings.time_budget_s and time.monotonic() - start > settings.time_budget_s:
                    stopped = "time budget"
                    break  # in-flight candidates are abandoned (told FAIL below)
                for cand, result in pipeline.step():
                    with self._atomic():  # stored and told, or neither
                        self._finish(cand, result)
            # Ctrl-C or a budget: whatever is still in flight is not measured; FAIL frees the
            # trial in the study (a re-run proposes it again), and the Store never saw it.
            self._abandon(pipeline)
            if not decide:
                return self._result(stopped or "trial budget")
            others = self._others_searching()
            if others:
                # Several hosts on one study (--storage postgresql://...): the process that
                # finishes last decides, once, with every host's trials stored; this one has
                # nothing in flight any more, so the last one always sees no other.
                result = self._result(f"{stopped or 'trial budget'}; the winner is left to "
                                      f"{others[0]}, still searching this study")
                result.deferred_to = others[0]
                return result
            return self._decide(pipeline, stopped or "trial budget")
        finally:
            self._abandon(pipeline)
            pipeline.close()

    @contextlib.contextmanager
    def _atomic(self):
        """Hold Ctrl-C back while the Store and the study are being written together; it is
        raised as KeyboardInterrupt right after, so both stay consistent and resumable."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        pending = []
        previous = signal.signal(signal.SIGINT, lambda *_: pending.append(True))
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)
        if pending:
            raise KeyboardInterrupt

    def _abandon(self, pipeline: _Pipeline) -> None:
        with self._atomic():
            for cand in pipeline.in_flight():
                self.study.tell(cand.trial, state=TrialState.FAIL)
        for worker in (*pipeline.compilers, pipeline.gpu):
            if worker.busy:
                worker.kill()
                worker.task = worker.payload = None
        pipeline.ready.clear()

    def _stop_reason(self, measured: int, start: float, stored, in_flight) -> str:
        s = self.settings
        if measured >= s.trials:
            return "trial budget"
        if s.time_budget_s and time.monotonic() - start > s.time_budget_s:
            return "time budget"
        if s.patience and self._since_improvement >= s.patience:
            return f"no improvement in {s.patience} trials"
        if self._all_done(stored, in_flight):
            return "space exhausted"
        return ""

    # -- decision --

    def _longest_candidate(self) -> dt.timedelta:
        """How long a trial can stay RUNNING in a live process: compile, wait behind the compile
        pool's other candidates on the GPU, evaluate, each within the per-stage timeout."""
        s = self.settings
        return dt.timedelta(seconds=s.timeout_s * (2 + s.compile_jobs))

    def _others_searching(self) -> list[str]:
        """Owners of the study's RUNNING trials, other than this process, that may still finish:
        dead owners on this host are failed first; a trial older than any candidate can take
        (a compile, a wait behind the compile pool, an evaluation, each within the timeout) is
        taken for a dead remote owner and ignored, so a crashed host never blocks the decision."""
        self._fail_dead_owners(self.study)
        stale_after = self._longest_candidate()
        now, me = dt.datetime.now(), _owner()
        owners = []
        for trial in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            owner = trial.user_attrs.get("owner")
            fresh = trial.datetime_start is None or now - trial.datetime_start < stale_after
            if owner and owner != me and fresh and owner not in owners:
                owners.append(owner)
        return owners

    def _result(self, stopped: str) -> ProblemResult:
        return ProblemResult(self.problem, self.name, self.seed, self.mode, len(self.feasible),
                             stopped, self.outcomes, self.measured_here)

    def decide(self, stopped: str, pipeline: _Pipeline) -> ProblemResult:
        """The decision alone, on the GPU worker of `pipeline` (decision_pipeline(): one for every
        problem of a run): for `--workers N`, whose searching processes skip it, so that the
        winner of a study is decided once, after all of them."""
        return self._decide(pipeline, stopped)

    def _decide(self, pipeline: _Pipeline, stopped: str) -> ProblemResult:
        """Re-time the top 3 and the default side by side on the GPU worker; the default stays
        unless the fastest beats it by more than the measured spread (IQR)."""
        result = self._result(stopped)
        stored = self._stored()
        ok = sorted((r for r in stored.values() if r.outcome == "ok"), key=lambda r: r.median_ms)
        picks = [(r.family, r.config, r.config_hash) for r in ok[:TOP_K_RETIME]]
        if self.default_hash not in {p[2] for p in picks}:
            picks.append((*self.default, self.default_hash))
        if not ok:
            return result  # nothing valid to choose from; no winner is stored
        retimed: dict[str, TrialRecord] = {}
        for family, config, digest in picks:
            cand = _Candidate(None, family, config, digest, ROLE_RETIME, _utcnow())
            task = Task(**{**self._task(cand).__dict__, "kind": "evaluate"})
            retimed[digest] = self._record(cand, pipeline.evaluate_now(task))
        valid = sorted((r for r in retimed.values() if r.outcome == "ok"),
                       key=lambda r: r.median_ms)
        if not valid:
            return result
        default = retimed.get(self.default_hash)
        default = default if default is not None and default.outcome == "ok" else None
        winner, result.default_kept = pick_winner(valid, default)
        speedup = default.median_ms / winner.median_ms if default is not None else None
        self.store.set_best(self.target.device_id, self.problem, self.family_set, winner.id,
                            default.id if default else None, speedup)
        result.winner, result.default, result.speedup = winner, default, speedup
        return result


@contextlib.contextmanager
def decision_pipeline():
    """A GPU worker for a run of decisions (ProblemSearch.decide): `--workers N` decides every
    problem in the parent process, and a worker of its own per problem cost a process start,
    imports and a CUDA context each time (7-8 s per problem on the two-H200 machine, serially
    after the children's parallel search: benchmarks/RESULTS.md)."""
    pipeline = _Pipeline(compile_jobs=1)  # workers start on first use: only the GPU one does
    try:
        yield pipeline
    finally:
        pipeline.close()


def pick_winner(valid: list[TrialRecord], default: TrialRecord | None
                ) -> tuple[TrialRecord, bool]:
    """From the re-timed valid candidates (fastest first) and the re-timed default (None if it
    failed): the fastest, unless its lead over the default is within the measured spread (the
    larger IQR of the two); then the default, kept. Returns (winner, default kept)."""
    winner = valid[0]
    if default is not None and winner is not default:
        spread = max(winner.iqr_ms or 0.0, default.iqr_ms or 0.0)
        if default.median_ms - winner.median_ms <= spread:
            return default, True
    return winner, False


def open_storage(url: str) -> optuna.storages.RDBStorage:
    """Optuna's RDB storage; on SQLite with the same busy timeout as the Store, and created under
    the same file lock, so that two searches starting together do not race on CREATE TABLE."""
    from tuner.dburl import engine_url
    from tuner.store import configure_sqlite, engine_kwargs, is_sqlite, opening

    url = engine_url(url)
    with opening("Optuna storage", url):
        storage = optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs(url) or None)
        if is_sqlite(url):
            # Optuna pops a WAITING trial with SELECT ... FOR UPDATE, then UPDATE; SQLite has no
            # row locks and the sqlite3 driver runs that SELECT outside any transaction, so two
            # processes could both pop one enqueued trial (seen: 9 of 150 in a two-process
            # test). BEGIN IMMEDIATE makes each of Optuna's transactions exclusive; the pool is
            # emptied so that every later connection gets it.
            configure_sqlite(storage.engine)
            storage.engine.dispose()
    return storage


def runs_on_cpu(modules: dict) -> bool:
    """Whether every family runs on the CPU (test doubles declare DEVICE = "cpu")."""
    return all(getattr(m, "DEVICE", "cuda") == "cpu" for m in modules.values())


def make_target(gpu_name: str, modules: dict) -> Target:
    """--gpu NAME -> where candidates run. Families that run on the CPU (test doubles declare
    DEVICE = "cpu") take the profile by name without a local GPU, under a CPU fingerprint."""
    from tuner import gpus

    if runs_on_cpu(modules):
        profile = gpus.resolve_gpu("h200" if gpu_name == "auto" else gpu_name, require_local=False)
        fingerprint = {"name": f"cpu-double-{profile.name}", "compute_capability": "cpu",
                       "sm_count": os.cpu_count() or 1}
        return Target(profile, gpus.fingerprint_id(fingerprint), fingerprint, "cpu")
    profile = gpus.resolve_gpu(gpu_name)
    fingerprint = gpus.device_fingerprint()
    return Target(profile, gpus.fingerprint_id(fingerprint), fingerprint, "cuda")


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's
        return True
    return True


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


def summary(result: ProblemResult) -> dict:
    """JSON-ready view of a ProblemResult (the --json output, one per problem)."""
    def trial(rec: TrialRecord | None) -> dict | None:
        if rec is None:
            return None
        return {"family": rec.family, "config": rec.config, "median_ms": rec.median_ms,
                "iqr_ms": rec.iqr_ms, "tflops": rec.tflops, "rel_rms": rec.rel_rms,
                "trial_id": rec.id}

    return {
        "problem": result.problem.key(), "seq_len": result.problem.seq_len,
        "study": result.study_name, "seed": result.seed, "mode": result.mode,
        "feasible": result.feasible, "stopped": result.stopped,
        "measured_here": result.measured_here, "outcomes": dict(result.outcomes),
        "winner": trial(result.winner), "default": trial(result.default),
        "speedup_over_default": result.speedup, "default_kept": result.default_kept,
    }
