"""What to measure next: the feasible space of a problem, the mode it implies, and the next
candidate from the study.

Parameters are named "<family>.<knob>" after a categorical "family", so that several families
share one study with knobs conditional on the family (multivariate TPE with group=True).

Before the sampler's first proposal the study measures the default, its accurate twin, the
configs known near the problem (known.py: the GPU's table, the database's nearest winners) and
the families' seeds, in that order. Modes: "exhaustive" when the feasible space is no larger
than the trial budget: the next feasible config that nobody has measured or claimed is enqueued
before each ask, so no infeasible point is ever asked; "tpe" otherwise: multivariate TPE where
each trial sets a constraint, so configs that are infeasible or fail teach the sampler where not
to go, and the nearest usable config is measured in an infeasible proposal's place (repair.py).
Either way only configs that pass can_implement reach a compiler, and none of an accuracy class a
measured member ruled out as over the budget (accuracy_classes.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import optuna
from optuna.trial import TrialState

from tuner.outcomes import Outcome, Role
from tuner.problem import Problem
from tuner.sandbox import CandidateResult
from tuner.search.accuracy_classes import accuracy_class, ruled_out_classes
from tuner.search.claims import HELD, RUNNING, Claims, owner
from tuner.search.cost import record_cost
from tuner.search.feasible_cache import feasible_dicts
from tuner.search.interrupts import sigint_deferred
from tuner.search.known import Known
from tuner.search.records import Candidate, Records
from tuner.search.repair import Repairer
from tuner.search.settings import FAILED_VALUE_MS, MAX_BARREN_ASKS
from tuner.store import TrialRecord, config_hash


def suggest(trial: optuna.Trial, families: list[str], spaces: dict[str, dict]) -> tuple[str, dict]:
    """Define-by-run: the family first, then that family's knobs."""
    family = trial.suggest_categorical("family", families)
    config = {knob: trial.suggest_categorical(f"{family}.{knob}", values)
              for knob, values in spaces[family].items()}
    return family, config


def params_of(family: str, config: dict) -> dict:
    return {"family": family, **{f"{family}.{k}": v for k, v in config.items()}}


def feasible_configs(modules: dict, problem: Problem, gpu) -> list[tuple[str, dict]]:
    """Every (family, config) that can_implement accepts, in enumeration order (judged once
    per family, problem and GPU: tuner/search/feasible_cache.py)."""
    return _feasible(modules, problem, gpu)[0]


def _feasible(modules: dict, problem: Problem, gpu) -> tuple[list[tuple[str, dict]], list[str]]:
    """feasible_configs and the config_hash of each."""
    feasible, hashes = [], []
    for name, module in modules.items():
        configs, digests = feasible_dicts(name, module, problem, gpu)
        feasible += [(name, config) for config in configs]
        hashes += digests
    return feasible, hashes


def tell(study: optuna.Study, trial: optuna.Trial, outcome: Outcome,
         median_ms: float | None) -> None:
    ok = outcome == Outcome.OK and median_ms is not None
    trial.set_user_attr("outcome", str(outcome))
    trial.set_constraint("valid", 0.0 if ok else 1.0)
    study.tell(trial, median_ms if ok else FAILED_VALUE_MS)


@dataclass
class Space:
    """The families of a search on one problem and GPU: their knob domains, the feasible
    configs, the default (of the first family) and the mode."""

    families: list[str]
    modules: dict
    spaces: dict[str, dict]
    feasible: list[tuple[str, dict]]
    default: tuple[str, dict]
    mode: str
    # Measured right after the default, whatever the sampler: each family's `seeds` (the
    # default's neighbours along knobs whose best value moves with the shape), feasible ones.
    seeds: list[tuple[str, dict]] = field(default_factory=list)
    # The default with prepare's exact transforms on (ConfigMixin.with_transforms), measured
    # right after it: the baseline where the plain default is over the accuracy budget. None
    # where it is the default itself or infeasible.
    accurate: tuple[str, dict] | None = None
    # Measured right after the baselines, before the seeds: configs known to do well near the
    # problem, feasible, no baseline (known.known_configs); none with --no-warm-start.
    known: list[Known] = field(default_factory=list)
    # config_hash of each feasible config, in its order (kept with the verdicts: feasible_cache).
    hashes: list[str] = field(default_factory=list)

    @classmethod
    def build(cls, modules: dict, problem: Problem, gpu, exhaustive_up_to: int) -> Space:
        families = list(modules)
        feasible, hashes = _feasible(modules, problem, gpu)
        plain = modules[families[0]].default(gpu.arch, problem)
        default = (families[0], plain.to_dict())
        mode = "exhaustive" if len(feasible) <= exhaustive_up_to else "tpe"
        # Seeds that can run and are not the default (nor its accurate twin) itself.
        wanted = set(hashes) - {config_hash(*default)}
        accurate = (families[0], plain.with_transforms().to_dict())
        accurate = accurate if config_hash(*accurate) in wanted else None
        wanted -= {config_hash(*accurate)} if accurate else set()
        seeds = [(name, cfg.to_dict()) for name, module in modules.items()
                 for cfg in getattr(module, "seeds", lambda arch, problem: [])(gpu.arch, problem)]
        seeds = [seed for seed in seeds if config_hash(*seed) in wanted]
        return cls(families, modules, {n: m.space(gpu.arch) for n, m in modules.items()},
                   feasible, default, mode, seeds, accurate, hashes=hashes)

    @property
    def baselines(self) -> list[tuple[str, dict]]:
        """The configs a winner is compared with, in order of preference: the default, then
        its accurate twin (decision.decide takes the first within the budget)."""
        return [self.default, *([self.accurate] if self.accurate else [])]

    @property
    def default_hash(self) -> str:
        return config_hash(*self.default)

    @cached_property
    def feasible_hashes(self) -> set[str]:
        return set(self.hashes)

    @cached_property
    def classes(self) -> list[tuple]:
        """accuracy_classes.accuracy_class of each feasible config, in its order."""
        return [accuracy_class(f, c) for f, c in self.feasible]


class Proposer:
    """The next candidate for the compiler; proposals that are infeasible, already measured or
    of a ruled-out accuracy class are settled here (told, and an infeasible one stored) without
    one, and the nearest usable config enqueued in its place (repair.py). max_error: the search's
    accuracy budget (None: no class is ever ruled out); seed: the study's (repairs' ties)."""

    def __init__(self, study: optuna.Study, space: Space, claims: Claims, records: Records,
                 problem: Problem, gpu, max_error: float | None = None, seed: int = 0) -> None:
        self.study, self.space, self.claims, self.records = study, space, claims, records
        self.problem, self.gpu, self.max_error = problem, gpu, max_error
        self._class_of = dict(zip(space.hashes, space.classes, strict=True))
        self.ruled_out_proposals = 0  # skipped by this process, their class ruled out
        self._repairer = Repairer(space, seed)

    def next(self, stored: dict[str, TrialRecord], in_flight: set[str]) -> Candidate | None:
        """None when the sampler has nothing new in MAX_BARREN_ASKS proposals."""
        space = self.space
        for _ in range(MAX_BARREN_ASKS):
            with sigint_deferred():  # a trial must never exist without its owner
                self._enqueue_next(stored, in_flight)
                trial = self.study.ask()
                trial.set_user_attr("owner", owner())
                family, config = suggest(trial, space.families, space.spaces)
            digest = config_hash(family, config)
            role = Role(trial.user_attrs.get("role", Role.SEARCH))
            cand = Candidate(trial, family, config, digest,
                             Role.DEFAULT if digest == space.default_hash else role)
            module = space.modules[family]
            ok, reason = module.can_implement(module.Config.from_dict(config), self.problem,
                                              self.gpu)
            ruled_out = ruled_out_classes(stored.values(), self.max_error)
            if not ok:
                if digest not in stored:
                    stored[digest] = self.records.record(
                        cand, CandidateResult(Outcome.INFEASIBLE, reason))
                tell(self.study, trial, Outcome.INFEASIBLE, None)
                self._repair(trial, family, config, stored, in_flight, ruled_out)
                continue
            if digest in stored:
                # Measured before (an earlier run, or another process): tell the stored value.
                tell(self.study, trial, stored[digest].outcome, record_cost(stored[digest]))
                continue
            if accuracy_class(family, config) in ruled_out:
                self.settle_ruled_out(cand, stored, in_flight, ruled_out)
                continue
            if digest in in_flight or self.claims.held_by_earlier(trial, digest):
                self.study.tell(trial, state=TrialState.FAIL)
                continue
            return cand
        return None

    def settle_ruled_out(self, cand: Candidate, stored: dict[str, TrialRecord],
                         in_flight: set[str], ruled_out: dict, repair: bool = True) -> None:
        """A candidate of a ruled-out class, proposed or already compiled: told to the study
        as over the budget with the member that ruled it out, never measured nor stored, and
        (repair) the nearest usable config enqueued in its place."""
        trial = cand.trial
        trial.set_user_attr("ruled_out_by", ruled_out[accuracy_class(cand.family, cand.config)])
        tell(self.study, trial, Outcome.TOO_INACCURATE, None)
        self.ruled_out_proposals += 1
        if repair:
            self._repair(trial, cand.family, cand.config, stored, in_flight, ruled_out)

    def _repair(self, trial: optuna.Trial, family: str, config: dict,
                stored: dict[str, TrialRecord], in_flight: set[str], ruled_out: dict) -> None:
        """Enqueue the nearest usable config to a proposal that was not (repair.py): the next
        ask pops it, with the proposal's trial number as `repair_of`."""
        with sigint_deferred():
            near = self._repairer.nearest(family, config, trial.number,
                                          self._taken(stored, in_flight), ruled_out)
            if near is not None:
                self.study.enqueue_trial(params_of(family, near), user_attrs={
                    "role": str(Role.SEARCH), "owner": owner(), "repair_of": trial.number})

    def _taken(self, stored: dict[str, TrialRecord], in_flight: set[str]) -> set[str]:
        # Completed trials count too: another process may have measured a config (a seed, say)
        # after this one last read the Store, and re-enqueueing it would only be backed off
        # (held_by_earlier) on every ask until the sampler is declared barren.
        return set(stored) | in_flight | self.claims.claimed((*HELD, TrialState.COMPLETE))

    def all_done(self, stored: dict[str, TrialRecord], in_flight: set[str]) -> bool:
        """Every feasible config measured, in flight here, held by a live process or of a
        ruled-out class. A WAITING trial is not done: the next ask pops it."""
        ruled_out = ruled_out_classes(stored.values(), self.max_error)

        def covered() -> bool:
            done = set(stored) | in_flight | self.claims.claimed(RUNNING)
            return all(h in done or c in ruled_out for h, c in self._class_of.items())

        if not covered():
            return False
        # Held by a process that died after this search began? Free those and look again.
        self.claims.fail_dead()
        return covered()

    def _enqueue_next(self, stored: dict[str, TrialRecord], in_flight: set[str]) -> None:
        """Put the next config nobody has measured or claimed in the study's queue: the
        default first (so that the tuned result is never worse than it), then its accurate twin
        (the baseline where the default is over the accuracy budget), then the known configs
        (the incumbent from the start where one is the best), then the families' seeds, then,
        in exhaustive mode, every feasible config in turn; none of a ruled-out accuracy class
        (accuracy_classes.py). Two processes may race and
        enqueue one config twice; the later trial backs off (Claims.held_by_earlier)."""
        space = self.space
        taken = self._taken(stored, in_flight)
        known = {config_hash(k.family, k.config): k.source for k in space.known}
        ruled_out = ruled_out_classes(stored.values(), self.max_error)
        order = [*space.baselines, *((k.family, k.config) for k in space.known), *space.seeds,
                 *(space.feasible if space.mode == "exhaustive" else [])]
        for family, config in order:
            digest = config_hash(family, config)
            if digest not in taken and accuracy_class(family, config) not in ruled_out:
                role = (Role.DEFAULT if digest == space.default_hash
                        else Role.KNOWN if digest in known else Role.SEARCH)
                # The owner goes in with the params: a kill right after the ask pops this trial
                # must still leave it attributable to a (dead) process.
                attrs = {"role": str(role), "owner": owner()}
                if role == Role.KNOWN:
                    attrs["known_from"] = known[digest]
                self.study.enqueue_trial(params_of(family, config), user_attrs=attrs)
                return
