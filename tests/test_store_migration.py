"""Results databases written by schema version 1 (before seq_len_kv and kv_heads) and 2 (before
the accuracy budget's e2e_error, e2e_data and max_error): readers read them as they are, a writer
migrates them in one transaction, and writers opening one at once migrate it once. The old files
are written here from their own DDL, frozen below, not by today's Store."""

from __future__ import annotations

import json
import multiprocessing
import sqlite3
import time

import pytest

from tuner import runtime, store_schema
from tuner.gpus import PROFILES
from tuner.problem import Problem
from tuner.store import SCHEMA_VERSION, Store, TrialRecord
from variants import mma_sync

# What Store created at schema version 1 (sqlite_master of a fresh file, 2026-12-01).
V1_DDL = """
CREATE TABLE tuner_schema_version (version INTEGER NOT NULL, PRIMARY KEY (version));
CREATE TABLE tuner_devices (id VARCHAR(32) NOT NULL, name VARCHAR(128) NOT NULL,
    fingerprint_json TEXT NOT NULL, first_seen DATETIME NOT NULL, PRIMARY KEY (id));
CREATE TABLE tuner_problems (id INTEGER NOT NULL, "key" VARCHAR(64) NOT NULL,
    batch INTEGER NOT NULL, heads INTEGER NOT NULL, seq_len INTEGER NOT NULL,
    head_dim INTEGER NOT NULL, causal BOOLEAN NOT NULL, PRIMARY KEY (id), UNIQUE ("key"));
CREATE TABLE tuner_trials (id INTEGER NOT NULL, device_id VARCHAR(32) NOT NULL,
    problem_id INTEGER NOT NULL, family_set VARCHAR(128) NOT NULL, study_name VARCHAR(256),
    optuna_number INTEGER, role VARCHAR(16) NOT NULL, family VARCHAR(128) NOT NULL,
    config_json TEXT NOT NULL, config_hash VARCHAR(32) NOT NULL, outcome VARCHAR(16) NOT NULL,
    message TEXT, median_ms FLOAT, iqr_ms FLOAT, tflops FLOAT, prepare_ms FLOAT, rel_rms FLOAT,
    max_abs FLOAT, lse_max_err FLOAT, nonfinite INTEGER, compile_s FLOAT, registers INTEGER,
    spill_bytes INTEGER, smem_bytes INTEGER, sm_clock_mhz FLOAT, temperature_c FLOAT,
    timing_json TEXT, seed INTEGER, code_version VARCHAR(64), started_at DATETIME,
    finished_at DATETIME NOT NULL, PRIMARY KEY (id),
    FOREIGN KEY(device_id) REFERENCES tuner_devices (id),
    FOREIGN KEY(problem_id) REFERENCES tuner_problems (id));
CREATE INDEX ix_tuner_trials_device_id ON tuner_trials (device_id);
CREATE INDEX ix_tuner_trials_study_name ON tuner_trials (study_name);
CREATE INDEX ix_tuner_trials_problem_id ON tuner_trials (problem_id);
CREATE INDEX ix_tuner_trials_config_hash ON tuner_trials (config_hash);
CREATE TABLE tuner_best (id INTEGER NOT NULL, device_id VARCHAR(32) NOT NULL,
    problem_id INTEGER NOT NULL, family_set VARCHAR(128) NOT NULL, trial_id INTEGER NOT NULL,
    default_trial_id INTEGER, speedup_over_default FLOAT, decided_at DATETIME NOT NULL,
    imported_trials INTEGER, PRIMARY KEY (id), UNIQUE (device_id, problem_id, family_set),
    FOREIGN KEY(device_id) REFERENCES tuner_devices (id),
    FOREIGN KEY(problem_id) REFERENCES tuner_problems (id),
    FOREIGN KEY(trial_id) REFERENCES tuner_trials (id),
    FOREIGN KEY(default_trial_id) REFERENCES tuner_trials (id));
"""
# What schema version 2 added to it (the version-1 -> 2 migration, 2026-12-02), frozen.
V2_DDL = """
ALTER TABLE tuner_problems ADD COLUMN seq_len_kv INTEGER;
ALTER TABLE tuner_problems ADD COLUMN kv_heads INTEGER;
UPDATE tuner_problems SET seq_len_kv = seq_len, kv_heads = heads;
UPDATE tuner_schema_version SET version = 2;
"""
DEVICE = "dev-h200"
SMALL = mma_sync.Config(block_m=64, block_n=64, warps=4, rows_per_warp=16, kv_stages=2,
                        p_source="smem", swizzle="bank_period", q_in_registers=False, mma="fp8")
SEED = mma_sync.default("sm_90a")
# (problem key, config, median ms) of the winners the version-1 file holds.
V1_WINNERS = [("b1-h56-s30272-d128-full", SEED, 48.5), ("b1-h56-s4096-d128-full", SMALL, 0.91)]


def write_v1_database(path, version: int = 1) -> str:
    """A file of schema `version` (1 or 2) holding V1_WINNERS."""
    con = sqlite3.connect(path)
    con.executescript(V1_DDL)
    con.execute("INSERT INTO tuner_schema_version VALUES (1)")
    con.execute("INSERT INTO tuner_devices VALUES (?, 'NVIDIA H200', ?, '2026-11-30 10:00:00')",
                (DEVICE, '{"compute_capability": "9.0", "name": "NVIDIA H200", "sm_count": 132}'))
    for i, (key, cfg, ms) in enumerate(V1_WINNERS, start=1):
        p = Problem.from_key(key)
        con.execute("INSERT INTO tuner_problems VALUES (?, ?, ?, ?, ?, ?, 0)",
                    (i, key, p.batch, p.heads, p.seq_len, p.head_dim))
        con.execute("INSERT INTO tuner_trials (id, device_id, problem_id, family_set, role, "
                    "family, config_json, config_hash, outcome, median_ms, finished_at) VALUES "
                    "(?, ?, ?, 'mma_sync', 'search', 'mma_sync', ?, 'h', 'ok', ?, "
                    "'2026-11-30 10:00:00')",
                    (i, DEVICE, i, json.dumps(cfg.to_dict(), sort_keys=True), ms))
        con.execute("INSERT INTO tuner_best (id, device_id, problem_id, family_set, trial_id, "
                    "decided_at) VALUES (?, ?, ?, 'mma_sync', ?, '2026-11-30 10:00:00')",
                    (i, DEVICE, i, i))
    if version == 2:
        con.executescript(V2_DDL)
    con.commit()
    con.close()
    return f"sqlite:///{path}"


def _winners(store):
    return [(w.problem_key, mma_sync.Config.from_dict(w.config), w.trial.median_ms)
            for w in store.winners()]


def _trial_columns(path) -> list[str]:
    con = sqlite3.connect(path)
    try:
        return [row[1] for row in con.execute("PRAGMA table_info(tuner_trials)")]
    finally:
        con.close()


def _schema(path):
    con = sqlite3.connect(path)
    try:
        version = con.execute("SELECT version FROM tuner_schema_version").fetchall()
        columns = [row[1] for row in con.execute("PRAGMA table_info(tuner_problems)")]
        new = ", ".join(c if c in columns else "NULL" for c in ("seq_len_kv", "kv_heads"))
        rows = con.execute(f"SELECT key, seq_len, heads, {new} FROM tuner_problems "
                           "ORDER BY key").fetchall()
        return version, columns, rows
    finally:
        con.close()


@pytest.mark.parametrize("version", [1, 2])
def test_a_reader_reads_an_older_database_as_it_is(tmp_path, monkeypatch, version):
    path = tmp_path / "old.sqlite"
    url = write_v1_database(path, version)
    before = _schema(path), _trial_columns(path)
    store = Store(url, readonly=True)
    try:
        assert _winners(store) == V1_WINNERS
        (trial,) = store.trials(Problem(1, 56, 4096))
        assert trial.config == SMALL.to_dict()
        # Columns the file does not have yet read as unknown.
        assert (trial.e2e_error, trial.e2e_data, trial.max_error) == (None, None, None)
        assert store.winners()[0].trial.e2e_error is None
    finally:
        store.close()
    # The runtime lookup, a reader too: the same winners, as self-attention problems.
    monkeypatch.setattr(runtime, "_local_gpu_and_device", lambda gpu: (PROFILES["h200"], DEVICE))
    monkeypatch.setattr(runtime, "TABLES_DIR", tmp_path / "no-tables")
    runtime.clear_cache()
    try:
        best = runtime.load_best_config(4096, heads=56, db=url, with_source=True)
        assert (best.source, best.config) == ("db-exact", SMALL)
        assert runtime.load_best_config(30272, heads=56, db=url) == SEED
    finally:
        runtime.clear_cache()
    assert (_schema(path), _trial_columns(path)) == before  # nothing migrated or written


@pytest.mark.parametrize("version", [1, 2])
def test_a_writer_migrates_an_older_database_keeping_its_winners(tmp_path, version):
    path = tmp_path / "old.sqlite"
    url = write_v1_database(path, version)
    store = Store(url)
    try:
        assert _winners(store) == V1_WINNERS
        assert store.winners()[0].trial.e2e_error is None  # measured before the budget existed
        # New problems land beside the old ones, with the columns of the current version.
        gqa = Problem(1, 32, 8192, causal=True, kv_heads=8)
        tid = store.record_trial(TrialRecord(
            id=None, device_id=DEVICE, problem_key=gqa.key(), family_set="mma_sync",
            family="mma_sync", config=SEED.to_dict(), config_hash="h", outcome="ok",
            median_ms=0.6, e2e_error=0.07, e2e_data="realistic", max_error=0.1))
        store.set_best(DEVICE, gqa, "mma_sync", tid, None, None)
        best = store.best_for(DEVICE, gqa).trial
        assert (best.median_ms, best.e2e_error, best.e2e_data, best.max_error) == (
            0.6, 0.07, "realistic", 0.1)
    finally:
        store.close()
    assert [c for c in _trial_columns(path) if c in ("e2e_error", "e2e_data", "max_error")] == [
        "e2e_error", "e2e_data", "max_error"]
    version, columns, rows = _schema(path)
    assert version == [(SCHEMA_VERSION,)] == [(3,)]
    assert columns.count("seq_len_kv") == 1 and columns.count("kv_heads") == 1
    assert rows == [("b1-h32-s8192-d128-causal-kvh8", 8192, 32, 8192, 8),
                    ("b1-h56-s30272-d128-full", 30272, 56, 30272, 56),
                    ("b1-h56-s4096-d128-full", 4096, 56, 4096, 56)]
    reopened = Store(url, readonly=True)
    try:
        assert _winners(reopened)[1:] == V1_WINNERS
    finally:
        reopened.close()


def test_a_failed_migration_leaves_the_version_1_file_whole(tmp_path):
    path = tmp_path / "v1.sqlite"
    url = write_v1_database(path)
    # A column the migration's second ALTER then cannot add: it fails half way.
    con = sqlite3.connect(path)
    con.execute("ALTER TABLE tuner_problems ADD COLUMN kv_heads INTEGER")
    con.commit()
    con.close()
    with pytest.raises(Exception, match="duplicate column"):
        Store(url)
    version, columns, _ = _schema(path)
    assert version == [(1,)] and "seq_len_kv" not in columns  # the first ALTER rolled back
    assert "e2e_error" not in _trial_columns(path)


def test_a_failed_migration_leaves_the_version_2_file_whole(tmp_path):
    path = tmp_path / "v2.sqlite"
    url = write_v1_database(path, 2)
    # A column the version-3 step's last ALTER then cannot add: it fails after two columns.
    con = sqlite3.connect(path)
    con.execute("ALTER TABLE tuner_trials ADD COLUMN max_error FLOAT")
    con.commit()
    con.close()
    with pytest.raises(Exception, match="duplicate column"):
        Store(url)
    version, _, _ = _schema(path)
    assert version == [(2,)] and "e2e_error" not in _trial_columns(path)


def _open_and_write(url: str, index: int, barrier) -> None:
    # In this child only: a migration that starts half a second after its writer read the old
    # version, so that every writer has read it before the first one migrates (unless something
    # makes them wait for each other: without the creation lock and the check inside the
    # migration's transaction, the later ones fail on a duplicate column).
    migrate = store_schema.migrate

    def slow_migration(store):
        time.sleep(0.5)
        migrate(store)

    store_schema.migrate = slow_migration
    barrier.wait()
    store = Store(url)
    problem = Problem(1, 8, 64 * (index + 1), kv_heads=2)
    store.record_device(DEVICE, {"name": "NVIDIA H200"})
    store.record_trial(TrialRecord(
        id=None, device_id=DEVICE, problem_key=problem.key(), family_set="mma_sync",
        family="mma_sync", config=SEED.to_dict(), config_hash="h", outcome="ok", median_ms=1.0))
    store.close()


@pytest.mark.parametrize("old", [1, 2])
def test_writers_opening_an_older_database_at_once_migrate_it_once(tmp_path, old):
    path = tmp_path / "old.sqlite"
    url = write_v1_database(path, old)
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(3)
    procs = [ctx.Process(target=_open_and_write, args=(url, i, barrier)) for i in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    version, columns, rows = _schema(path)
    assert version == [(3,)] and columns.count("kv_heads") == 1
    assert _trial_columns(path).count("e2e_error") == 1
    assert sorted(key for key, *_ in rows) == sorted(
        [k for k, _, _ in V1_WINNERS] + [f"b1-h8-s{64 * (i + 1)}-d128-full-kvh2" for i in range(3)])
    assert all(kv_heads in (2, 56) for *_, kv_heads in rows)
