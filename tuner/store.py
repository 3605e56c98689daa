"""The results database: every trial with its typed outcome, and the winner per (device, problem).

One class, `Store`, over SQLAlchemy 2.x ORM, with one session context manager (commit on success,
rollback on any error). The default is a SQLite file in WAL mode (readers never block the writer,
so a `tuner show` during a search works) at `default_db_url()`; any SQLAlchemy URL works, e.g.
PostgreSQL for several hosts sharing one database. The Optuna study of a search lives in the same
file by default; our tables are prefixed `tuner_` because Optuna already owns `trials`.

Readers never wait for a writer: `Store(url, readonly=True)` (show, export, the runtime lookup)
opens an existing database only (a missing one is a TunerError, never created), takes no lock
file and reads in deferred transactions, which WAL serves at once from the last commit while
another process writes. Writers take the write lock up front (BEGIN IMMEDIATE) and say what
they wait for when another process holds it longer than LOCK_NOTICE_S.

Contract for the runtime (issue 5) and the other commands:
  Store(url)                                  open (create on first use), check the schema version
                                              (migrate a version-1 file: SCHEMA_VERSION)
  Store(url, readonly=True)                   open an existing database for reading only
  best_for(device_id, problem, family_set)    the stored winner, or None
  winners(device_id=None)                     every stored winner
  trials(problem, device_id=None, ...)        the trials of a problem, oldest first
  record_device / record_trial / set_best     what the search writes
Records come back as frozen dataclasses, never ORM objects, so they outlive the session.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import hashlib
import json
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from sqlalchemy import (
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Integer,
    String,
    Text,
    UniqueConstraint,
    create_engine,
    event,
    inspect,
    select,
    text,
)
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, IntegrityError, OperationalError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker
from sqlalchemy.pool import NullPool

from tuner.dburl import connection_error, display_url, engine_url
from tuner.errors import TunerError, argument
from tuner.outcomes import Outcome, Role
from tuner.problem import Problem, StoredTime, preferred_per_problem

# Bump on any change to the tables below. A newer file, or an older one without a migration
# below, is refused with a clear error instead of being half-read.
#   1: the first schema.
#   2: tuner_problems.seq_len_kv and .kv_heads (cross-attention, grouped KV heads; causal had a
#      column from the start). A version-1 database is migrated when a writer opens it
#      (_migrate_1_to_2); readers read it as it is (READABLE_VERSIONS).
SCHEMA_VERSION = 2
# Versions a reader takes without migrating: every read takes a problem from its key
# (Problem.from_key), never from tuner_problems' other columns, and a version-1 key is the
# version-2 key of the same self-attention problem. A reader never writes, so it cannot
# migrate (the file may be read-only to it, and `tuner show` must not wait on a writer).
READABLE_VERSIONS = (1, 2)

log = logging.getLogger("tuner.store")

# How long a writer waits for another process's write transaction before it gives up (a search
# holds one for the few milliseconds of storing a trial), and after how long it says so.
BUSY_TIMEOUT_S = 60.0
LOCK_NOTICE_S = 2.0

OUTCOMES = tuple(Outcome)


class NoResults(TunerError):
    """A read-only open found no tuner tables in the database (a file some other tool made)."""


def default_db_path() -> Path:
    """$TUNER_HOME/tuner.sqlite, else <$XDG_DATA_HOME or ~/.local/share>/fp8-attn-tuner/..."""
    home = os.environ.get("TUNER_HOME")
    if home:
        return Path(home).expanduser() / "tuner.sqlite"
    data = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(data).expanduser() / "fp8-attn-tuner" / "tuner.sqlite"


def default_db_url() -> str:
    """--db, else $TUNER_DB_URL, else the SQLite file at default_db_path()."""
    return os.environ.get("TUNER_DB_URL") or f"sqlite:///{default_db_path()}"


def config_hash(family: str, config: dict) -> str:
    """Stable id of a candidate: family plus knobs, key order irrelevant."""
    text = json.dumps({"family": family, "config": config}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(tzinfo=None)


class _Base(DeclarativeBase):
    pass


class _SchemaVersion(_Base):
    __tablename__ = "tuner_schema_version"
    version: Mapped[int] = mapped_column(Integer, primary_key=True)


class _Device(_Base):
    __tablename__ = "tuner_devices"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)  # gpus.fingerprint_id
    name: Mapped[str] = mapped_column(String(128))
    fingerprint_json: Mapped[str] = mapped_column(Text)  # the latest full fingerprint seen
    first_seen: Mapped[dt.datetime] = mapped_column(DateTime, default=_now)


class _Problem(_Base):
    __tablename__ = "tuner_problems"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    key: Mapped[str] = mapped_column(String(64), unique=True)
    batch: Mapped[int] = mapped_column(Integer)
    heads: Mapped[int] = mapped_column(Integer)
    seq_len: Mapped[int] = mapped_column(Integer)
    head_dim: Mapped[int] = mapped_column(Integer)
    causal: Mapped[bool] = mapped_column(Boolean)
    # Since schema 2. Nullable as the migration adds them: a version-1 process that opened the
    # file before the migration may still insert its (self-attention) problems, without them;
    # the key is the truth either way.
    seq_len_kv: Mapped[int | None] = mapped_column(Integer)
    kv_heads: Mapped[int | None] = mapped_column(Integer)


class _Trial(_Base):
    __tablename__ = "tuner_trials"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    device_id: Mapped[str] = mapped_column(ForeignKey("tuner_devices.id"), index=True)
    problem_id: Mapped[int] = mapped_column(ForeignKey("tuner_problems.id"), index=True)
    family_set: Mapped[str] = mapped_column(String(128))
    study_name: Mapped[str | None] = mapped_column(String(256), index=True)
    optuna_number: Mapped[int | None] = mapped_column(Integer)
    role: Mapped[str] = mapped_column(String(16))  # a tuner.outcomes.Role value
    family: Mapped[str] = mapped_column(String(128))
    config_json: Mapped[str] = mapped_column(Text)
    config_hash: Mapped[str] = mapped_column(String(32), index=True)
    outcome: Mapped[str] = mapped_column(String(16))  # a tuner.outcomes.Outcome value
    message: Mapped[str | None] = mapped_column(Text)
    median_ms: Mapped[float | None] = mapped_column(Float)
    iqr_ms: Mapped[float | None] = mapped_column(Float)
    tflops: Mapped[float | None] = mapped_column(Float)
    prepare_ms: Mapped[float | None] = mapped_column(Float)
    rel_rms: Mapped[float | None] = mapped_column(Float)
    max_abs: Mapped[float | None] = mapped_column(Float)
    lse_max_err: Mapped[float | None] = mapped_column(Float)
    nonfinite: Mapped[int | None] = mapped_column(Integer)
    compile_s: Mapped[float | None] = mapped_column(Float)
    registers: Mapped[int | None] = mapped_column(Integer)
    spill_bytes: Mapped[int | None] = mapped_column(Integer)
    smem_bytes: Mapped[int | None] = mapped_column(Integer)
    sm_clock_mhz: Mapped[float | None] = mapped_column(Float)
    temperature_c: Mapped[float | None] = mapped_column(Float)
    timing_json: Mapped[str | None] = mapped_column(Text)  # repeats, rotated sets, quartiles
    seed: Mapped[int | None] = mapped_column(Integer)
    code_version: Mapped[str | None] = mapped_column(String(64))
    started_at: Mapped[dt.datetime | None] = mapped_column(DateTime)
    finished_at: Mapped[dt.datetime] = mapped_column(DateTime, default=_now)


class _Best(_Base):
    __tablename__ = "tuner_best"
    __table_args__ = (UniqueConstraint("device_id", "problem_id", "family_set"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    device_id: Mapped[str] = mapped_column(ForeignKey("tuner_devices.id"))
    problem_id: Mapped[int] = mapped_column(ForeignKey("tuner_problems.id"))
    family_set: Mapped[str] = mapped_column(String(128))
    trial_id: Mapped[int] = mapped_column(ForeignKey("tuner_trials.id"))
    default_trial_id: Mapped[int | None] = mapped_column(ForeignKey("tuner_trials.id"))
    speedup_over_default: Mapped[float | None] = mapped_column(Float)
    decided_at: Mapped[dt.datetime] = mapped_column(DateTime, default=_now)
    # For a winner imported from a YAML table: how many trials the search behind it ran there.
    imported_trials: Mapped[int | None] = mapped_column(Integer)


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


def is_sqlite(url: str) -> bool:
    return make_url(url).get_backend_name() == "sqlite"


def sqlite_path(url: str) -> Path | None:
    """The file behind a SQLite URL, None for other backends and in-memory databases."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database).expanduser()


# Any constant both our tables and Optuna's are created under (pg_advisory_lock takes a bigint).
_PG_CREATION_LOCK = 0x7475_6E65_72  # "tuner"


@contextmanager
def creation_lock(url: str) -> Iterator[None]:
    """Serialize schema creation across processes: two searches started at once would otherwise
    both see an empty database and race on CREATE TABLE (on PostgreSQL the loser fails with a
    duplicate key in pg_type even though DDL is transactional). A file lock beside a SQLite file,
    a session advisory lock on PostgreSQL; other backends get no lock."""
    if make_url(url).get_backend_name() == "postgresql":
        engine = create_engine(url, poolclass=NullPool)
        try:
            with engine.connect() as conn:
                conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _PG_CREATION_LOCK})
                try:
                    yield
                finally:
                    conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _PG_CREATION_LOCK})
        finally:
            engine.dispose()
        return
    path = sqlite_path(url)
    if path is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{path}.lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@contextmanager
def opening(what: str, url: str, *, lock: bool = True) -> Iterator[None]:
    """Create or open the database at `url` (ours or Optuna's): under creation_lock (unless
    `lock` is False: a reader creates nothing), with an unreachable server, a refused
    connection or a missing driver reported as one connection_error naming `what`."""
    try:
        with creation_lock(url) if lock else contextlib.nullcontext():
            yield
    except OperationalError as exc:
        if _locked(exc):
            raise _lock_error(url) from None
        raise connection_error(what, url, exc) from None
    except (DBAPIError, ArgumentError, ImportError) as exc:
        raise connection_error(what, url, exc) from None


def engine_kwargs(url: str) -> dict[str, Any]:
    """create_engine keyword arguments for `url`: on SQLite, wait for a concurrent writer
    instead of failing at once ("database is locked")."""
    return {"connect_args": {"timeout": BUSY_TIMEOUT_S}} if is_sqlite(url) else {}


def configure_sqlite(engine: Engine, *, readonly: bool = False) -> None:
    """WAL, foreign keys, a busy timeout, and every transaction BEGIN IMMEDIATE (why below);
    for our engine and for Optuna's on the same file (search.open_storage). readonly: no
    journal-mode change (itself a write), writes refused, and deferred read transactions."""

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record):
        # Let SQLAlchemy, not the driver, open transactions, so BEGIN IMMEDIATE below takes
        # effect (the sqlite3 driver otherwise defers BEGIN to the first write).
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        if readonly:
            cur.execute("PRAGMA query_only=ON")
        else:
            cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn):
        if readonly:
            # A deferred transaction that only reads: under WAL it never waits for a writer.
            conn.exec_driver_sql("BEGIN")
            return
        # Take the write lock up front: a deferred transaction that reads and then writes can fail
        # with SQLITE_BUSY at the upgrade no matter the busy timeout, when another process commits
        # between the read and the write (two concurrent searches do exactly that).
        _begin_immediate(conn, engine.url.database)


def _begin_immediate(conn, database: str | None) -> None:
    """BEGIN IMMEDIATE, waiting up to BUSY_TIMEOUT_S for another writer, and saying so once the
    wait passes LOCK_NOTICE_S (a silent minute looks like a hang)."""
    try:
        conn.exec_driver_sql(f"PRAGMA busy_timeout={int(LOCK_NOTICE_S * 1000)}")
        try:
            conn.exec_driver_sql("BEGIN IMMEDIATE")
            return
        except OperationalError as exc:
            if not _locked(exc):
                raise
        log.warning("tuner: waiting for the write lock on %s: another process holds a write "
                    "transaction (giving up after %g s)", database, BUSY_TIMEOUT_S)
        conn.exec_driver_sql(
            f"PRAGMA busy_timeout={int((BUSY_TIMEOUT_S - LOCK_NOTICE_S) * 1000)}")
        conn.exec_driver_sql("BEGIN IMMEDIATE")
    finally:
        conn.exec_driver_sql(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")


def _locked(exc: OperationalError) -> bool:
    text = str(exc.orig)
    return "locked" in text or "busy" in text


def _lock_error(url: str) -> TunerError:
    return TunerError(
        f"{display_url(url)} is still locked by another process's write transaction after "
        f"{BUSY_TIMEOUT_S:g} s; retry when it has finished (a search holds the lock only while "
        "it stores a trial, so a longer lock is a stuck process)")


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
            self._open_schema()

    def _open_schema(self) -> None:
        names = set(inspect(self.engine).get_table_names())
        ours = {t.name for t in _Base.metadata.sorted_tables}
        if not names & ours:
            if self.readonly:
                self.engine.dispose()
                raise NoResults(
                    f"{display_url(self.url)} holds no tuner results (no tuner_ tables); check "
                    f"{argument('db')} or TUNER_DB_URL (`tuner search` and `tuner import` write "
                    "them)")
            _Base.metadata.create_all(self.engine)
            with self.session() as s:
                s.add(_SchemaVersion(version=SCHEMA_VERSION))
            return
        version = None
        if _SchemaVersion.__tablename__ in names:
            with self.session() as s:
                version = s.scalar(select(_SchemaVersion.version))
        if version not in READABLE_VERSIONS:
            newer = isinstance(version, int) and version > SCHEMA_VERSION
            raise TunerError(
                f"results database {display_url(self.url)} has schema version {version}, this "
                f"tuner expects {SCHEMA_VERSION}"
                + (" (a newer tuner wrote it): upgrade fp8-attn-tuner, or" if newer else ";")
                + " export its winners with the tuner version that wrote it (`tuner export`), "
                f"then point {argument('db')} (or TUNER_DB_URL) at a new file"
            )
        if self.readonly:
            return
        if version == 1:
            self._migrate_1_to_2()
        _Base.metadata.create_all(self.engine)  # a table added without a version bump

    def _migrate_1_to_2(self) -> None:
        """Add tuner_problems.seq_len_kv and .kv_heads, filled from seq_len and heads (every
        version-1 problem is self-attention over all heads), and set the version, in one
        transaction: a failure leaves a version-1 file. Two writers opening one file at once
        are serialized by creation_lock (Store.__init__ holds it around _open_schema); the
        version is read again inside the write transaction too, so a writer that got here
        second (another backend without the lock, a lock file on another host's view of a
        network disk) finds version 2 and does nothing."""
        with self.session() as s:
            if s.scalar(select(_SchemaVersion.version)) != 1:
                return
            for column in ("seq_len_kv", "kv_heads"):
                s.execute(text(f"ALTER TABLE {_Problem.__tablename__} ADD COLUMN {column} "
                               "INTEGER"))
            s.execute(text(f"UPDATE {_Problem.__tablename__} SET seq_len_kv = seq_len, "
                           "kv_heads = heads"))
            s.execute(text(f"UPDATE {_SchemaVersion.__tablename__} SET version = 2"))
        log.info("tuner: migrated %s from schema version 1 to 2 (key/value length and head "
                 "count of each problem)", display_url(self.url))

    @contextmanager
    def session(self) -> Iterator[Session]:
        """The one unit of work: commit on success, roll back on any exception, always close."""
        session = self._sessions()
        try:
            yield session
            session.commit()
        except OperationalError as exc:
            session.rollback()
            if _locked(exc):
                raise _lock_error(self.url) from None
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

        self._write(work)

    def import_winners(self, device_id: str, fingerprint: dict, entries) -> None:
        """Store the winners of a validated tuning table (tables.TableEntry) in ONE transaction:
        all or nothing. Each becomes a trial of role "imported" (and one for the default's time
        when the table has it) and the best of its (device, problem, family set). Idempotent:
        an imported trial already stored with the same config, time and date is reused, so
        importing a table twice adds no rows."""
        with self.session() as s:
            device = s.get(_Device, device_id)
            if device is None:
                s.add(_Device(id=device_id, name=str(fingerprint.get("name", "?")),
                              fingerprint_json=json.dumps(fingerprint, sort_keys=True)))
            for e in entries:
                f = e.fields
                config = e.config.to_dict() if hasattr(e.config, "to_dict") else dict(e.config)
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
                    iqr_ms=f.get("iqr_ms"), tflops=f.get("tflops"), rel_rms=f.get("rel_rms"),
                    code_version=f.get("code_version"), **common))
                default = None
                if f.get("default_median_ms") is not None:
                    ms = f["default_median_ms"]
                    default = self._imported_trial(s, _Trial(
                        config_json="{}", config_hash="default",
                        message="imported: the family default's time, config not in the table",
                        median_ms=ms, tflops=e.problem.tflops(ms), **common))
                s.flush()
                best = s.scalar(select(_Best).where(
                    _Best.device_id == device_id, _Best.problem_id == problem_id,
                    _Best.family_set == e.family_set))
                if best is None:
                    best = _Best(device_id=device_id, problem_id=problem_id,
                                 family_set=e.family_set, trial_id=win.id)
                    s.add(best)
                best.trial_id = win.id
                best.default_trial_id = default.id if default is not None else None
                best.speedup_over_default = f.get("speedup_over_default")
                best.decided_at = decided or _now()
                best.imported_trials = f.get("trials")

    @staticmethod
    def _imported_trial(s: Session, row: _Trial) -> _Trial:
        """The stored trial that `row` (of role "imported") repeats, else `row`, added."""
        same = select(_Trial).where(
            _Trial.device_id == row.device_id, _Trial.problem_id == row.problem_id,
            _Trial.family_set == row.family_set, _Trial.family == row.family,
            _Trial.role == row.role, _Trial.config_hash == row.config_hash,
            _Trial.median_ms == row.median_ms, _Trial.finished_at == row.finished_at)
        found = s.scalars(same.order_by(_Trial.id).limit(1)).first()
        if found is not None:
            return found
        s.add(row)
        return row

    # ---- reads -----------------------------------------------------------------------------------

    @staticmethod
    def _record(row: _Trial, problem_key: str) -> TrialRecord:
        return TrialRecord(
            id=row.id, device_id=row.device_id, problem_key=problem_key,
            config=json.loads(row.config_json),
            timing=json.loads(row.timing_json) if row.timing_json else None,
            **{name: getattr(row, name) for name in _PLAIN},
        )

    def trials(self, problem: Problem, device_id: str | None = None,
               family_set: str | None = None, study_name: str | None = None,
               outcome: str | None = None) -> list[TrialRecord]:
        """Trials of a problem, oldest first, optionally narrowed to a device/family set/study."""
        query = select(_Trial).join(_Problem).where(_Problem.key == problem.key())
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
            trial = s.get(_Trial, best.trial_id)
            default = s.get(_Trial, best.default_trial_id) if best.default_trial_id else None
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
