"""The results database's tables (SQLAlchemy ORM), their schema version, and the migrations that
bring an older file to it.

Readers (show, export, the runtime lookup) read every READABLE_VERSIONS file as it is: they never
write, so they cannot migrate (the file may be read-only to them, and `tuner show` must not wait
on a writer); what a column added later would hold reads as None (`absent_trial_columns`). A
writer migrates an older file when it opens it: every step from the file's version to
SCHEMA_VERSION in ONE transaction (a failure leaves the file at its old version), under the
creation lock the Store holds around `open_schema`, with the version read again inside the
write transaction, so that of several writers opening one old file at once one migrates and
the others find it done.
"""

from __future__ import annotations

import datetime as dt
import logging

from sqlalchemy import (
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Integer,
    String,
    Text,
    UniqueConstraint,
    inspect,
    select,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from tuner.dburl import display_url
from tuner.errors import TunerError, argument

log = logging.getLogger("tuner.store")

# Bump on any change to the tables below, with a step in MIGRATIONS. A newer file, or an older
# one without a migration, is refused with a clear error instead of being half-read.
#   1: the first schema.
#   2: tuner_problems.seq_len_kv and .kv_heads (cross-attention, grouped KV heads; causal had a
#      column from the start), filled from seq_len and heads: every version-1 problem is
#      self-attention over all heads.
#   3: tuner_trials.e2e_error, .e2e_data and .max_error (the accuracy budget), NULL for trials
#      measured before: their error is unknown.
SCHEMA_VERSION = 3
# Versions a reader takes without migrating: every read takes a problem from its key
# (Problem.from_key), never from tuner_problems' other columns (a version-1 key is the version-2
# key of the same self-attention problem), and reads a trial column added later as None.
READABLE_VERSIONS = (1, 2, 3)
# tuner_trials columns by the schema version that added them (the others: every version).
TRIAL_COLUMNS_SINCE = {"e2e_error": 3, "e2e_data": 3, "max_error": 3}
# The SQL of each step, from the version in the key to the next one: plain ADD COLUMNs, the same
# statement on SQLite and PostgreSQL.
MIGRATIONS = {
    1: ["ALTER TABLE tuner_problems ADD COLUMN seq_len_kv INTEGER",
        "ALTER TABLE tuner_problems ADD COLUMN kv_heads INTEGER",
        "UPDATE tuner_problems SET seq_len_kv = seq_len, kv_heads = heads"],
    2: ["ALTER TABLE tuner_trials ADD COLUMN e2e_error FLOAT",
        "ALTER TABLE tuner_trials ADD COLUMN e2e_data VARCHAR(96)",
        "ALTER TABLE tuner_trials ADD COLUMN max_error FLOAT"],
}


class NoResults(TunerError):
    """A read-only open found no tuner tables in the database (a file some other tool made)."""


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
    # Since schema 3 (TRIAL_COLUMNS_SINCE): the accuracy budget's check (tuner/budget.py), the
    # end-to-end error on its data, which data ("realistic" or "calibration:<sha256>") and the
    # budget it was held to.
    e2e_error: Mapped[float | None] = mapped_column(Float)
    e2e_data: Mapped[str | None] = mapped_column(String(96))
    max_error: Mapped[float | None] = mapped_column(Float)


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


def absent_trial_columns(version: int) -> tuple[str, ...]:
    """tuner_trials columns a file of `version` does not have (a reader reads them as None)."""
    return tuple(name for name, since in TRIAL_COLUMNS_SINCE.items() if version < since)


def open_schema(store) -> int:
    """Create the tables in an empty database (a writer), check the version of an existing one
    and migrate it if older (a writer); returns the version the file holds now. `store`: the
    Store opening it (its engine, session(), readonly and url)."""
    names = set(inspect(store.engine).get_table_names())
    ours = {t.name for t in _Base.metadata.sorted_tables}
    if not names & ours:
        if store.readonly:
            store.engine.dispose()
            raise NoResults(
                f"{display_url(store.url)} holds no tuner results (no tuner_ tables); check "
                f"{argument('db')} or TUNER_DB_URL (`tuner search` and `tuner import` write "
                "them)")
        _Base.metadata.create_all(store.engine)
        with store.session() as s:
            s.add(_SchemaVersion(version=SCHEMA_VERSION))
        return SCHEMA_VERSION
    version = None
    if _SchemaVersion.__tablename__ in names:
        with store.session() as s:
            version = s.scalar(select(_SchemaVersion.version))
    if version not in READABLE_VERSIONS:
        newer = isinstance(version, int) and version > SCHEMA_VERSION
        raise TunerError(
            f"results database {display_url(store.url)} has schema version {version}, this "
            f"tuner expects {SCHEMA_VERSION}"
            + (" (a newer tuner wrote it): upgrade fp8-attn-tuner, or" if newer else ";")
            + " export its winners with the tuner version that wrote it (`tuner export`), "
            f"then point {argument('db')} (or TUNER_DB_URL) at a new file"
        )
    if store.readonly:
        return version
    if version < SCHEMA_VERSION:
        migrate(store)
    _Base.metadata.create_all(store.engine)  # a table added without a version bump
    return SCHEMA_VERSION


def migrate(store) -> None:
    """Every step of MIGRATIONS from the file's version to SCHEMA_VERSION, and the new version,
    in one transaction; the version is read inside it, so a writer that got here second (a
    backend without the creation lock, a lock file on another host's view of a network disk)
    finds it current and does nothing."""
    with store.session() as s:
        found = s.scalar(select(_SchemaVersion.version))
        if found >= SCHEMA_VERSION:
            return
        for step in range(found, SCHEMA_VERSION):
            for statement in MIGRATIONS[step]:
                s.execute(text(statement))
        s.execute(text(f"UPDATE {_SchemaVersion.__tablename__} SET version = {SCHEMA_VERSION}"))
    log.info("tuner: migrated %s from schema version %s to %s", display_url(store.url), found,
             SCHEMA_VERSION)
