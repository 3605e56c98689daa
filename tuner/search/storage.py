"""The Optuna side of a search: the RDB storage, the study's name, its sampler, and opening (or
resuming) the study with its recorded seed."""

from __future__ import annotations

import random
import warnings

import optuna

from tuner.problem import Problem
from tuner.search.settings import SearchSettings

optuna.logging.set_verbosity(optuna.logging.WARNING)


def family_set_name(families: list[str]) -> str:
    return "+".join(families)


def study_name(device_id: str, families: list[str], problem: Problem, budget=None) -> str:
    """One study per device, family set, problem and accuracy budget (budget.Budget.label: its
    data and max_error), so that trials judged against one budget never stand for another's."""
    name = f"{device_id}:{family_set_name(families)}:{problem.key()}"
    return name if budget is None else f"{name}:{budget.label}"


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


def open_study(storage: optuna.storages.BaseStorage, name: str, settings: SearchSettings,
               attrs: dict) -> tuple[optuna.Study, int]:
    """The study `name` with its sampler, and the seed that sampler uses: --seed, else the one
    recorded when the study was created (a plain re-run resumes it as it was), else a fresh
    one. `attrs` (problem, families, mode) are recorded with the seed on creation."""
    from tuner.errors import TunerError

    exists = name in {s.study_name for s in optuna.get_all_study_summaries(storage)}
    if settings.resume and not exists:
        raise TunerError(
            f"--resume: no stored study {name!r}; check that --gpu, --families, --heads, "
            "--batch, --head-dim, --seq-lens and --storage match the interrupted search"
        )
    seed = settings.seed
    if seed is None:
        seed = random.SystemRandom().randrange(2**31)
    # Optuna's create_study(load_if_exists) is the race-free way for two processes to open one
    # study.
    probe = optuna.create_study(storage=storage, study_name=name, direction="minimize",
                                load_if_exists=True)
    recorded = probe.user_attrs.get("seed")
    if recorded is None:
        for key, value in {"seed": seed, **attrs}.items():
            probe.set_user_attr(key, value)
    elif settings.seed is None:
        seed = recorded
    study = optuna.load_study(study_name=name, storage=storage,
                              sampler=make_sampler(seed, settings.trials))
    return study, seed
