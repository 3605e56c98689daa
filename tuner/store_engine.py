"""Opening the results database: where it lives by default, the lock its schema is created under,
and SQLite's locking (WAL, BEGIN IMMEDIATE, a busy timeout that says what it waits for).

Used by the Store (tuner/store.py) and by the Optuna storage of a search on the same file
(tuner/search/storage.py), so both open one file the same way.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, OperationalError
from sqlalchemy.pool import NullPool

from tuner.dburl import connection_error, display_url
from tuner.errors import TunerError

log = logging.getLogger("tuner.store")

# How long a writer waits for another process's write transaction before it gives up (a search
# holds one for the few milliseconds of storing a trial), and after how long it says so.
BUSY_TIMEOUT_S = 60.0
LOCK_NOTICE_S = 2.0


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
        if locked(exc):
            raise lock_error(url) from None
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
            # With WAL a commit survives a killed process without an fsync of its own (a search
            # commits every knob of every proposal); only an OS crash may lose the last ones.
            cur.execute("PRAGMA synchronous=NORMAL")
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
            if not locked(exc):
                raise
        log.warning("tuner: waiting for the write lock on %s: another process holds a write "
                    "transaction (giving up after %g s)", database, BUSY_TIMEOUT_S)
        conn.exec_driver_sql(
            f"PRAGMA busy_timeout={int((BUSY_TIMEOUT_S - LOCK_NOTICE_S) * 1000)}")
        conn.exec_driver_sql("BEGIN IMMEDIATE")
    finally:
        conn.exec_driver_sql(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")


def locked(exc: OperationalError) -> bool:
    text = str(exc.orig)
    return "locked" in text or "busy" in text


def lock_error(url: str) -> TunerError:
    return TunerError(
        f"{display_url(url)} is still locked by another process's write transaction after "
        f"{BUSY_TIMEOUT_S:g} s; retry when it has finished (a search holds the lock only while "
        "it stores a trial, so a longer lock is a stuck process)")

