"""Store: schema versioning, the session contract, and the reads the runtime relies on."""

from __future__ import annotations

import sqlite3

import pytest

from tuner.errors import TunerError
from tuner.problem import Problem
from tuner.store import (
    SCHEMA_VERSION,
    Store,
    TrialRecord,
    _Device,
    config_hash,
    default_db_path,
    default_db_url,
)

P4K = Problem(1, 56, 4096)
DEV = "dev0"


@pytest.fixture
def db_url(tmp_path):
    return f"sqlite:///{tmp_path / 'tuner.sqlite'}"


@pytest.fixture
def store(db_url_any):
    s = Store(db_url_any)
    s.record_device(DEV, {"name": "NVIDIA H200", "compute_capability": "9.0", "sm_count": 132})
    yield s
    s.close()


def trial(config, outcome="ok", median=1.0, problem=P4K, role="search", **kw) -> TrialRecord:
    return TrialRecord(
        id=None, device_id=DEV, problem_key=problem.key(), family_set="mma_sync",
        family="mma_sync", config=config, config_hash=config_hash("mma_sync", config),
        outcome=outcome, median_ms=median if outcome == "ok" else None, role=role,
        iqr_ms=0.01 if outcome == "ok" else None, timing={"repeats": 20}, **kw,
    )


def test_new_database_is_wal_and_versioned(db_url, tmp_path):
    Store(db_url).close()
    con = sqlite3.connect(tmp_path / "tuner.sqlite")
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert con.execute("SELECT version FROM tuner_schema_version").fetchall() == [(SCHEMA_VERSION,)]


def test_sqlite_commits_of_the_store_and_the_study_skip_the_fsync_wal_makes_optional(tmp_path):
    from tuner.search.storage import open_storage

    url = f"sqlite:///{tmp_path / 'tuner.sqlite'}"
    store, storage = Store(url), open_storage(url)
    try:
        for engine in (store.engine, storage.engine):
            with engine.connect() as conn:  # 1: NORMAL (2, FULL, is the driver's default)
                assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 1
    finally:
        store.close()
        storage.engine.dispose()


@pytest.mark.parametrize(("tamper", "message"), [
    ("UPDATE tuner_schema_version SET version = 999",
     r"schema version 999, this tuner expects 3 \(a newer tuner wrote it\): upgrade .*db="),
    ("UPDATE tuner_schema_version SET version = 0", r"schema version 0, this tuner expects 3; "
     r"export its winners .*db="),
    ("DELETE FROM tuner_schema_version", "schema version None"),
], ids=["newer-version", "unknown-older-version", "no-version-row"])
def test_a_database_of_another_schema_version_is_refused_with_the_fix(db_url, tmp_path, tamper,
                                                                      message):
    Store(db_url).close()
    con = sqlite3.connect(tmp_path / "tuner.sqlite")
    con.execute(tamper)
    con.commit()
    con.close()
    with pytest.raises(TunerError, match=message):
        Store(db_url)


def test_reopening_keeps_data(store):
    store.record_trial(trial({"a": 1}))
    again = Store(store.url)
    assert [t.config for t in again.trials(P4K)] == [{"a": 1}]


def test_session_rolls_back_on_error(store):
    with pytest.raises(RuntimeError):
        with store.session() as s:
            s.add(_Device(id="half-written", name="x", fingerprint_json="{}"))
            s.flush()
            raise RuntimeError("boom")
    assert "half-written" not in store.devices()


def test_failed_record_leaves_nothing(store):
    with pytest.raises(ValueError, match="unknown outcome"):
        store.record_trial(trial({"a": 1}, outcome="exploded"))
    assert store.trials(P4K) == []


def test_trial_roundtrip_and_filters(store):
    first = store.record_trial(trial({"a": 1}, registers=128, message=None))
    store.record_trial(trial({"a": 2}, outcome="crash", message="worker died (signal SIGSEGV)"))
    store.record_trial(trial({"a": 3}, problem=Problem(1, 56, 8192)))
    got = store.trials(P4K)
    assert [t.id for t in got][0] == first
    assert [t.config for t in got] == [{"a": 1}, {"a": 2}]
    assert got[0].registers == 128 and got[0].timing == {"repeats": 20}
    assert got[1].message == "worker died (signal SIGSEGV)" and got[1].median_ms is None
    assert [t.config for t in store.trials(P4K, outcome="crash")] == [{"a": 2}]
    assert store.trials(P4K, device_id="other") == []


def test_best_for_and_winners(store):
    default = store.record_trial(trial({"a": 0}, median=2.0, role="retime"))
    fast = store.record_trial(trial({"a": 1}, median=1.0, role="retime"))
    assert store.best_for(DEV, P4K) is None
    store.set_best(DEV, P4K, "mma_sync", default, default, 1.0)
    store.set_best(DEV, P4K, "mma_sync", fast, default, 2.0)  # replaces, does not add
    win = store.best_for(DEV, P4K)
    assert win.config == {"a": 1} and win.speedup_over_default == 2.0
    assert win.default_trial.config == {"a": 0}
    assert store.best_for(DEV, P4K, family_set="wgmma") is None
    assert store.best_for("other-device", P4K) is None
    assert [(w.problem_key, w.family) for w in store.winners()] == [(P4K.key(), "mma_sync")]
    assert store.winners("other-device") == []


def test_best_for_without_family_set_takes_the_fastest(store):
    slow = store.record_trial(trial({"a": 1}, median=3.0))
    fast = TrialRecord(**{**trial({"b": 1}, median=1.5).__dict__, "family_set": "mma_sync+wgmma"})
    fast = store.record_trial(fast)
    store.set_best(DEV, P4K, "mma_sync", slow, None, None)
    store.set_best(DEV, P4K, "mma_sync+wgmma", fast, None, None)
    assert store.best_for(DEV, P4K).trial.median_ms == 1.5
    assert store.best_for(DEV, P4K, "mma_sync").trial.median_ms == 3.0


def test_default_location(monkeypatch, tmp_path):
    monkeypatch.delenv("TUNER_DB_URL", raising=False)
    monkeypatch.setenv("TUNER_HOME", str(tmp_path))
    assert default_db_path() == tmp_path / "tuner.sqlite"
    assert default_db_url() == f"sqlite:///{tmp_path / 'tuner.sqlite'}"
    monkeypatch.delenv("TUNER_HOME")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert default_db_path() == tmp_path / "xdg" / "fp8-attn-tuner" / "tuner.sqlite"
    monkeypatch.setenv("TUNER_DB_URL", "postgresql://host/db")
    assert default_db_url() == "postgresql://host/db"


def test_config_hash_ignores_key_order():
    assert config_hash("f", {"a": 1, "b": 2}) == config_hash("f", {"b": 2, "a": 1})
    assert config_hash("f", {"a": 1}) != config_hash("g", {"a": 1})


def test_concurrent_writers_create_and_update_the_same_rows(db_url_any):
    """Two processes searching one study open the schema, record the device, the problem and
    the winner at the same moment; on PostgreSQL the later insert of a row hits its unique key
    and is retried (SQLite serializes writers)."""
    import threading

    barrier, errors, ids = threading.Barrier(2), [], []

    def writer() -> None:
        try:
            barrier.wait()
            s = Store(db_url_any)
            for i in range(15):
                barrier.wait()
                s.record_device(f"dev{i}", {"name": "NVIDIA H200"})
                problem = Problem(1, 8, 64 * (i + 1))
                rec = TrialRecord(**{**trial({"a": i}, problem=problem).__dict__,
                                     "device_id": f"dev{i}"})
                tid = s.record_trial(rec)
                ids.append(tid)
                s.set_best(f"dev{i}", problem, "mma_sync", tid, None, None)
            s.close()
        except Exception as exc:  # noqa: BLE001 - reported below, with the thread's own error
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=writer) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    store = Store(db_url_any)
    assert len(store.winners()) == 15 and len(set(ids)) == 30
    assert all(w.trial.id in ids for w in store.winners())


def test_enum_outcomes_and_roles_are_stored_and_printed_as_their_plain_values(store):
    import json

    from tuner.outcomes import Outcome, Role

    # --json and the rows must read as before the enums: plain strings, not "Outcome.OK".
    assert json.dumps({Outcome.WRONG_RESULT: 1, "role": Role.RETIME}) == \
        '{"wrong_result": 1, "role": "retime"}'
    store.record_trial(trial({"a": 9}, outcome=Outcome.TIMEOUT, role=Role.RETIME))
    (got,) = [t for t in store.trials(P4K) if t.config == {"a": 9}]
    assert type(got.outcome) is str and got.outcome == "timeout" == Outcome.TIMEOUT
    assert type(got.role) is str and got.role == "retime" == Role.RETIME
