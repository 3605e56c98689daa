"""Readers of the results database: they read at once while another process writes (WAL), never
create a database (a mistyped --db is an error, not a new empty file), and a writer that waits
for another's lock says what it waits on."""

import json
import logging
import sqlite3
import time
from pathlib import Path

import pytest

from tests.test_tables import shipped_entry_count
from tuner import runtime, store_engine
from tuner.cli import main
from tuner.errors import TunerError
from tuner.store import Store

SHIPPED = Path(__file__).resolve().parents[1] / "db" / "tables" / "h200.yaml"


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "db.sqlite"
    assert main(["import", str(SHIPPED), "--db", f"sqlite:///{path}", "--force"]) == 0
    return path


@pytest.fixture
def writer_holding_the_lock(db):
    """Another process's open write transaction (an uncommitted row)."""
    con = sqlite3.connect(db, isolation_level=None)
    con.execute("BEGIN IMMEDIATE")
    con.execute("INSERT INTO tuner_devices VALUES ('other', 'x', '{}', '2026-01-01')")
    yield con
    con.execute("ROLLBACK")
    con.close()


@pytest.mark.parametrize("command", [["show", "--json"], ["export", "--device-id",
                                                          "3ed397d3d55ef1dd"]])
def test_readers_read_at_once_while_another_process_writes(db, writer_holding_the_lock,
                                                            command, capsys):
    capsys.readouterr()
    start = time.perf_counter()
    assert main([*command, "--db", f"sqlite:///{db}"]) == 0
    assert time.perf_counter() - start < 5  # not the writer's busy timeout (60 s)
    out = capsys.readouterr().out
    assert "b1-h56-s30272-d128-full" in out or "seq_len: 30272" in out
    if command[0] == "show":
        assert len(json.loads(out)) == shipped_entry_count()


def test_a_waiting_writer_says_what_it_waits_on_and_gives_up_clearly(
        db, writer_holding_the_lock, monkeypatch, caplog):
    monkeypatch.setattr(store_engine, "BUSY_TIMEOUT_S", 1.0)
    monkeypatch.setattr(store_engine, "LOCK_NOTICE_S", 0.2)
    with caplog.at_level(logging.WARNING, logger="tuner.store"):
        with pytest.raises(TunerError, match=r"still locked by another process's write "
                                             r"transaction after 1 s; retry"):
            Store(f"sqlite:///{db}").record_device("mine", {"name": "y"})
    assert f"waiting for the write lock on {db}" in caplog.text


@pytest.mark.parametrize("command", [["show"], ["show", "--json"], ["show", "--trials", "4096"],
                                     ["export", "--gpu", "h200"]])
def test_read_only_commands_never_create_a_database(tmp_path, command, capsys):
    missing = tmp_path / "nonexistent" / "dir" / "x.db"
    assert main([*command, "--db", f"sqlite:///{missing}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"no results database at {missing}" in err
    assert "--db" in err
    assert not (tmp_path / "nonexistent").exists()


def test_readers_leave_no_lock_file(db, monkeypatch):
    lock = Path(f"{db}.lock")
    lock.unlink()
    assert main(["show", "--db", f"sqlite:///{db}"]) == 0
    from tuner.gpus import PROFILES

    monkeypatch.setattr(runtime, "_local_gpu_and_device",
                        lambda gpu: (PROFILES["h200"], "3ed397d3d55ef1dd"))
    runtime.clear_cache()
    best = runtime.load_best_config(4096, heads=56, db=f"sqlite:///{db}", with_source=True)
    runtime.clear_cache()
    assert best.source.startswith("db-")
    assert not lock.exists()


def test_a_file_without_our_tables_is_named_not_filled(tmp_path, capsys):
    other = tmp_path / "other.sqlite"
    sqlite3.connect(other).execute("CREATE TABLE x (a)").connection.close()
    assert main(["show", "--db", f"sqlite:///{other}"]) == 2
    assert "holds no tuner results" in capsys.readouterr().err
    con = sqlite3.connect(other)
    assert [r[0] for r in con.execute("SELECT name FROM sqlite_master")] == ["x"]


def test_the_runtime_lookup_passes_over_an_empty_database_file(tmp_path, monkeypatch):
    from tuner.gpus import PROFILES

    empty = tmp_path / "empty.sqlite"
    empty.touch()
    monkeypatch.setattr(runtime, "_local_gpu_and_device", lambda gpu: (PROFILES["h200"], "dev"))
    runtime.clear_cache()
    best = runtime.load_best_config(4096, heads=56, db=f"sqlite:///{empty}", with_source=True)
    runtime.clear_cache()
    assert best.source == "table-exact" and empty.stat().st_size == 0
