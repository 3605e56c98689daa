"""The results database: every trial with its typed outcome, and the winner per (device, problem).

One class, `Store`, over SQLAlchemy 2.x ORM, with one session context manager (commit on success,
rollback on any error). The default is a SQLite file in WAL mode (readers never block the writer,
so a `tuner show` during a search works) at `default_db_url()`; any SQLAlchemy URL works, e.g.
PostgreSQL for several hosts sharing one database. The Optuna study of a search lives in the same
file by default; our tables are prefixed `tuner_` because Optuna already owns `trials`. The
tables and their migrations are tuner/store_schema.py; opening a file and SQLite's locking,
tuner/store_engine.py.

Readers never wait for a writer: `Store(url, readonly=True)` (show, export, the runtime lookup)
opens an existing database only (a missing one is a TunerError, never created), takes no lock
file, reads in deferred transactions (WAL serves them at once from the last commit while another
process writes) and reads an older schema as it is. Writers take the write lock up front (BEGIN
IMMEDIATE), say what they wait for when another process holds it longer than LOCK_NOTICE_S, and
migrate an older schema when they open it.

Contract for the runtime and the other commands:
  Store(url) / Store(url, readonly=True)      open (a writer creates and migrates) / read only
  best_for(device_id, problem, family_set)    the stored winner, or None
  winners(device_id=None)                     every stored winner
  trials(problem, device_id=None, ...)        the trials of a problem, oldest first
  record_device / record_trial / set_best     what the search writes
  import_winners(device_id, fingerprint, ...) a validated table's winners, in one transaction
Records come back as frozen dataclasses, never ORM objects, so they outlive the session.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields

from sqlalchemy import create_engine, select
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session, defer, sessionmaker

from tuner.dburl import engine_url
from tuner.errors import TunerError, argument
from tuner.outcomes import Outcome, Role
from tuner.problem import Problem, StoredTime, preferred_per_problem
from tuner.store_engine import (  # noqa: F401 - the names callers import from tuner.store
    BUSY_TIMEOUT_S,
    LOCK_NOTICE_S,
    configure_sqlite,
    creation_lock,
    default_db_path,
    default_db_url,
    engine_kwargs,
    is_sqlite,
    lock_error,
    locked,
    opening,
    sqlite_path,
)
from tuner.store_schema import (  # noqa: F401 - the names callers import from tuner.store
    READABLE_VERSIONS,
    SCHEMA_VERSION,
    NoResults,
    _Best,
    _Device,
    _now,
    _Problem,
    _Trial,
    absent_trial_columns,
    open_schema,
)

OUTCOMES = tuple(Outcome)


def config_hash(family: str, config: dict) -> str:
    """Stable id of a candidate: family plus knobs, key order irrelevant."""
    text = json.dumps({"family": family, "config": config}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class TrialRecord:
    """One measured (or rejected) candidate, as stored."""

    id: int | None
    device_id: str
    problem_key: str
    family_set: str
    family: str
    config: dict
    config_hash: str
    outcome: Outcome | str  # a str as read back from the database, equal to its Outcome
    message: str | None = None
    role: Role | str = Role.SEARCH
    study_name: str | None = None
    optuna_number: int | None = None
    median_ms: float | None = None
    iqr_ms: float | None = None
    tflops: float | None = None
    prepare_ms: float | None = None
    rel_rms: float | None = None
    max_abs: float | None = None
    lse_max_err: float | None = None
    nonfinite: int | None = None
    compile_s: float | None = None
    registers: int | None = None
    spill_bytes: int | None = None
    smem_bytes: int | None = None
    sm_clock_mhz: float | None = None
    temperature_c: float | None = None
    timing: dict | None = None
    seed: int | None = None
    code_version: str | None = None
    started_at: dt.datetime | None = None
    finished_at: dt.datetime | None = None
    # The accuracy budget's check (tuner/budget.py): end-to-end error on its data, which data,
    # and the budget. None where no check ran (or an older schema has no column for it).
    e2e_error: float | None = None
    e2e_data: str | None = None
    max_error: float | None = None


@dataclass(frozen=True)
class Winner:
    """The stored best trial of (device, problem, family set) and how it compares to the default."""

    device_id: str
    problem_key: str
    family_set: str
    trial: TrialRecord
    default_trial: TrialRecord | None
    speedup_over_default: float | None
    decided_at: dt.datetime
    imported_trials: int | None = None  # set for winners imported from a table

    @property
    def family(self) -> str:
        return self.trial.family

    @property
    def stored_time(self) -> StoredTime:
        """What ranks it beside the problem's winners of other family sets."""
        return StoredTime(self.trial.median_ms, self.decided_at, self.trial.code_version)

    @property
    def config(self) -> dict:
        return self.trial.config


# Columns copied 1:1 between TrialRecord and _Trial (the rest are keys or JSON).
_PLAIN = [f.name for f in fields(TrialRecord)
          if f.name not in ("id", "device_id", "problem_key", "config", "timing")]


class Store:
    """Results database behind a handful of methods; see the module docstring for the contract."""

    def __init__(self, url: str | None = None, *, readonly: bool = False) -> None:
        self.url = engine_url(url or default_db_url())
        self.readonly = readonly
        if readonly:
            path = sqlite_path(self.url)
            if path is not None and not path.is_file():
                raise TunerError(
                    f"no results database at {path} (the file does not exist); check "
                    f"{argument('db')} or TUNER_DB_URL (`tuner search` and `tuner import` create "
                    "one)")
        # A reader creates nothing: no schema, so no creation lock (and no lock file) either.
        with opening("results database", self.url, lock=not readonly):
            self.engine = create_engine(self.url, **engine_kwargs(self.url))
            if is_sqlite(self.url):
                configure_sqlite(self.engine, readonly=readonly)
            self._sessions = sessionmaker(self.engine, expire_on_commit=False)
            version = open_schema(self)
        # What a reader of an older file must not select: columns it does not have.
        self._absent = absent_trial_columns(version)
        self._trial_options = [defer(getattr(_Trial, name), raiseload=True)
                               for name in self._absent]

    @contextmanager
    def session(self) -> Iterator[Session]:
        """The one unit of work: commit on success, roll back on any exception, always close."""
        session = self._sessions()
        try:
            yield session
            session.commit()
        except OperationalError as exc:
            session.rollback()
            if locked(exc):
                raise lock_error(self.url) from None
            raise
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()

    def close(self) -> None:
        self.engine.dispose()

    def _write(self, work):
        """`work(session)` in one unit of work. Two processes that insert the same device, problem
        or winner row at once (PostgreSQL, READ COMMITTED) make the later one fail on the unique
        key; retried, it finds the row the other committed. SQLite never gets here: BEGIN
        IMMEDIATE serializes writers."""
        for attempt in range(3):
            try:
                with self.session() as s:
                    return work(s)
            except IntegrityError:
                if attempt == 2:
                    raise

    # ---- writes ----------------------------------------------------------------------------------

    def record_device(self, device_id: str, fingerprint: dict) -> None:
        def work(s: Session) -> None:
            row = s.get(_Device, device_id)
            if row is None:
                s.add(_Device(id=device_id, name=str(fingerprint.get("name", "?")),
                              fingerprint_json=json.dumps(fingerprint, sort_keys=True)))
            else:
                row.fingerprint_json = json.dumps(fingerprint, sort_keys=True)

        self._write(work)

    def _problem_id(self, s: Session, problem: Problem) -> int:
        row = s.scalar(select(_Problem).where(_Problem.key == problem.key()))
        if row is None:
            row = _Problem(key=problem.key(), **problem.to_dict())
            s.add(row)
            s.flush()
        return row.id

    def record_trial(self, rec: TrialRecord) -> int:
        """Store one finished candidate; returns its id. The device must be recorded first."""
        if rec.outcome not in OUTCOMES:
            raise ValueError(f"unknown outcome {rec.outcome!r}; expected one of {OUTCOMES}")
        def work(s: Session) -> int:
            row = _Trial(
                device_id=rec.device_id,
                problem_id=self._problem_id(s, Problem.from_key(rec.problem_key)),
                config_json=json.dumps(rec.config, sort_keys=True),
                timing_json=json.dumps(rec.timing) if rec.timing is not None else None,
                **{name: getattr(rec, name) for name in _PLAIN
                   if name not in ("finished_at", "outcome", "role")},
                # Plain str: a DB driver may adapt an Enum by its name ("OK"), not its value.
                outcome=str(rec.outcome), role=str(rec.role),
                finished_at=rec.finished_at or _now(),
            )
            s.add(row)
            s.flush()
            return row.id

        return self._write(work)

    def set_best(self, device_id: str, problem: Problem, family_set: str, trial_id: int,
                 default_trial_id: int | None, speedup_over_default: float | None) -> None:
        """Make `trial_id` the winner of (device, problem, family set), replacing an earlier one."""
        def work(s: Session) -> None:
            problem_id = self._problem_id(s, problem)
            row = s.scalar(select(_Best).where(
                _Best.device_id == device_id, _Best.problem_id == problem_id,
                _Best.family_set == family_set))
            if row is None:
                row = _Best(device_id=device_id, problem_id=problem_id, family_set=family_set,
                            trial_id=trial_id)
                s.add(row)
            row.trial_id = trial_id
            row.default_trial_id = default_trial_id
            row.speedup_over_default = speedup_over_default
            row.decided_at = _now()
            # Decided here: its trials are counted in this store, not the imported table's count.
            row.imported_trials = None

        self._write(work)

    def import_winners(self, device_id: str, fingerprint: dict, entries) -> int:
        """Store the winners of a validated tuning table (tables.TableEntry) in ONE transaction:
        all or nothing. Each becomes a trial of role "imported" (and one for the default's times
        when the table has them) and the best of its (device, problem, family set). Idempotent:
        an imported trial already stored with the same config, times, error and date is reused,
        so importing a table twice adds no rows. Returns how many entries were already present
        (their winner stored as the best of its problem with the same default already)."""
        present = 0
        with self.session() as s:
            device = s.get(_Device, device_id)
            if device is None:
                s.add(_Device(id=device_id, name=str(fingerprint.get("name", "?")),
                              fingerprint_json=json.dumps(fingerprint, sort_keys=True)))
            for e in entries:
                f = e.fields
                config = (e.as_written() if hasattr(e, "as_written")
                          else e.config.to_dict() if hasattr(e.config, "to_dict")
                          else dict(e.config))
                decided = f.get("decided_at")
                if isinstance(decided, str):
                    decided = dt.datetime.fromisoformat(decided)
                problem_id = self._problem_id(s, e.problem)
                common = dict(device_id=device_id, problem_id=problem_id, family_set=e.family_set,
                              family=e.family, role=str(Role.IMPORTED), outcome=str(Outcome.OK),
                              finished_at=decided or _now())
                win = self._imported_trial(s, _Trial(
                    config_json=json.dumps(config, sort_keys=True),
                    config_hash=config_hash(e.family, config),
                    message="imported from a tuning table", median_ms=f.get("median_ms"),
                    prepare_ms=f.get("prepare_ms"), iqr_ms=f.get("iqr_ms"),
                    tflops=f.get("tflops"), rel_rms=f.get("rel_rms"),
                    code_version=f.get("code_version"), e2e_error=f.get("e2e_error"),
                    e2e_data=f.get("e2e_data"), max_error=f.get("max_error"), **common))
                default = None
                if f.get("default_median_ms") is not None:
                    ms = f["default_median_ms"]
                    default = self._imported_trial(s, _Trial(
                        config_json="{}", config_hash="default",
                        message="imported: the family default's time, config not in the table",
                        median_ms=ms, prepare_ms=f.get("default_prepare_ms"),
                        tflops=e.problem.tflops(ms), **common))
                s.flush()
                best = s.scalar(select(_Best).where(
                    _Best.device_id == device_id, _Best.problem_id == problem_id,
                    _Best.family_set == e.family_set))
                default_id = default.id if default is not None else None
                if best is not None and (best.trial_id, best.default_trial_id) == (win.id,
                                                                                   default_id):
                    present += 1
                if best is None:
                    best = _Best(device_id=device_id, problem_id=problem_id,
                                 family_set=e.family_set, trial_id=win.id)
                    s.add(best)
                best.trial_id = win.id
                best.default_trial_id = default_id
                best.speedup_over_default = f.get("speedup_over_default")
                best.decided_at = decided or _now()
                best.imported_trials = f.get("trials")
        return present

    @staticmethod
    def _imported_trial(s: Session, row: _Trial) -> _Trial:
        """The stored trial that `row` (of role "imported") repeats, else `row`, added."""
        same = select(_Trial).where(
            _Trial.device_id == row.device_id, _Trial.problem_id == row.problem_id,
            _Trial.family_set == row.family_set, _Trial.family == row.family,
            _Trial.role == row.role, _Trial.config_hash == row.config_hash,
            *(getattr(_Trial, name) == getattr(row, name)
              for name in ("median_ms", "prepare_ms", "e2e_error", "e2e_data", "max_error")),
            _Trial.finished_at == row.finished_at)
        found = s.scalars(same.order_by(_Trial.id).limit(1)).first()
        if found is not None:
            return found
        s.add(row)
        return row

    # ---- reads -----------------------------------------------------------------------------------

    def _record(self, row: _Trial, problem_key: str) -> TrialRecord:
        return TrialRecord(
            id=row.id, device_id=row.device_id, problem_key=problem_key,
            config=json.loads(row.config_json),
            timing=json.loads(row.timing_json) if row.timing_json else None,
            **{name: getattr(row, name) for name in _PLAIN if name not in self._absent},
        )

    def trials(self, problem: Problem, device_id: str | None = None,
               family_set: str | None = None, study_name: str | None = None,
               outcome: str | None = None) -> list[TrialRecord]:
        """Trials of a problem, oldest first, optionally narrowed to a device/family set/study."""
        query = select(_Trial).join(_Problem).where(_Problem.key == problem.key()).options(
            *self._trial_options)
        if device_id is not None:
            query = query.where(_Trial.device_id == device_id)
        if family_set is not None:
            query = query.where(_Trial.family_set == family_set)
        if study_name is not None:
            query = query.where(_Trial.study_name == study_name)
        if outcome is not None:
            query = query.where(_Trial.outcome == outcome)
        with self.session() as s:
            rows = s.scalars(query.order_by(_Trial.id))
            return [self._record(row, problem.key()) for row in rows]

    def _winners(self, s: Session, query) -> list[Winner]:
        result = []
        for best, key in s.execute(query.join(_Problem).add_columns(_Problem.key)):
            trial = s.get(_Trial, best.trial_id, options=self._trial_options)
            default = (s.get(_Trial, best.default_trial_id, options=self._trial_options)
                       if best.default_trial_id else None)
            result.append(Winner(
                device_id=best.device_id, problem_key=key, family_set=best.family_set,
                trial=self._record(trial, key),
                default_trial=self._record(default, key) if default else None,
                speedup_over_default=best.speedup_over_default, decided_at=best.decided_at,
                imported_trials=best.imported_trials,
            ))
        return result

    def best_for(self, device_id: str, problem: Problem,
                 family_set: str | None = None) -> Winner | None:
        """The winner for an exact problem on a device. Without `family_set`, the one that runs
        of every family set searched for it (problem.preferred_per_problem: the fastest that the
        newest decision's code measured)."""
        query = select(_Best).where(_Best.device_id == device_id, _Problem.key == problem.key())
        if family_set is not None:
            query = query.where(_Best.family_set == family_set)
        with self.session() as s:
            found = self._winners(s, query)
        preferred = preferred_per_problem(found, lambda w: w.problem_key,
                                          lambda w: w.stored_time)
        return preferred[0] if preferred else None

    def winners(self, device_id: str | None = None) -> list[Winner]:
        """Every stored winner (optionally of one device), by problem key then family set."""
        query = select(_Best)
        if device_id is not None:
            query = query.where(_Best.device_id == device_id)
        with self.session() as s:
            found = self._winners(s, query)
        return sorted(found, key=lambda w: (w.device_id, w.problem_key, w.family_set))

    def devices(self) -> dict[str, dict]:
        """device id -> the latest full fingerprint recorded for it."""
        with self.session() as s:
            return {d.id: json.loads(d.fingerprint_json) for d in s.scalars(select(_Device))}
