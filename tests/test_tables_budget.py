"""Table schema 5 (the prepare times behind a speedup, the accuracy budget's error) through
export -> import -> export, older tables without them, and what `tuner import` leaves behind and
says."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import yaml

from tests.test_tables import FINGERPRINT, SEED, SHIPPED, SMALL, shipped_entry_count
from tuner.cli import main
from tuner.gpus import fingerprint_id
from tuner.problem import Problem
from tuner.store import Store, TrialRecord
from tuner.tables import SCHEMA_VERSION, TableError, build_table, dump_table, import_table

# A schema-4 table (the H200 table as exported in that schema), kept as it is.
SHIPPED_V4 = Path(__file__).resolve().parent / "data" / "h200_schema4.yaml"
DEVICE = fingerprint_id(FINGERPRINT)
CALIBRATION = "calibration:" + hashlib.sha256(b"the user's tensors").hexdigest()
# (problem, winner config, kernel ms, prepare ms, e2e error, e2e data)
WINNERS = [(Problem(1, 56, 4096), SMALL, 0.91, 0.052, 0.066, "realistic"),
           (Problem(1, 56, 30272), SEED, 48.5, 1.31, 0.0412, CALIBRATION)]


def budget_store(url: str) -> Store:
    store = Store(url)
    store.record_device(DEVICE, FINGERPRINT)
    for problem, cfg, ms, prep, err, data in WINNERS:
        common = dict(id=None, device_id=DEVICE, problem_key=problem.key(), family_set="mma_sync",
                      family="mma_sync", config_hash="h", outcome="ok")
        win = store.record_trial(TrialRecord(
            config=cfg.to_dict(), median_ms=ms, prepare_ms=prep, e2e_error=err, e2e_data=data,
            max_error=0.1, **common))
        default = store.record_trial(TrialRecord(config=SEED.to_dict(), median_ms=ms * 0.98,
                                                 prepare_ms=prep * 1.5, **common))
        store.set_best(DEVICE, problem, "mma_sync", win, default, 1.02)
    return store


@pytest.fixture
def table(tmp_path):
    store = budget_store(f"sqlite:///{tmp_path / 'a.sqlite'}")
    text = dump_table(build_table(store, DEVICE, "h200"))
    store.close()
    path = tmp_path / "h200.yaml"
    path.write_text(text)
    return path, text


def test_the_budget_and_the_prepare_times_survive_export_import_export(table, tmp_path):
    path, text = table
    doc = yaml.safe_load(text)
    assert doc["schema_version"] == SCHEMA_VERSION == 5
    entry = next(e for e in doc["entries"] if e["problem"]["seq_len"] == 30272)
    assert (entry["e2e_error"], entry["e2e_data"], entry["max_error"]) == (0.0412, CALIBRATION,
                                                                          0.1)
    assert (entry["prepare_ms"], entry["default_prepare_ms"]) == (1.31, 1.965)
    fresh = Store(f"sqlite:///{tmp_path / 'b.sqlite'}")
    assert import_table(fresh, path, local_fingerprint=FINGERPRINT) == 2
    best = fresh.best_for(DEVICE, Problem(1, 56, 30272))
    assert (best.trial.e2e_error, best.trial.e2e_data, best.trial.max_error) == (
        0.0412, CALIBRATION, 0.1)
    assert (best.trial.prepare_ms, best.default_trial.prepare_ms) == (1.31, 1.965)
    assert dump_table(build_table(fresh, DEVICE, "h200")) == text


def test_an_older_table_imports_with_its_errors_unknown(tmp_path):
    v4 = SHIPPED_V4
    assert yaml.safe_load(v4.read_text())["schema_version"] == 4
    store = Store(f"sqlite:///{tmp_path / 'v4.sqlite'}")
    assert import_table(store, v4, force=True) == yaml.safe_load(v4.read_text())["entry_count"]
    assert {w.trial.e2e_error for w in store.winners()} == {None}
    exported = yaml.safe_load(dump_table(build_table(store, next(iter(store.devices())),
                                                     "h200")))
    assert exported["schema_version"] == 5
    assert {e["e2e_error"] for e in exported["entries"]} == {None}


@pytest.mark.parametrize("edit, expected", [
    (lambda d: d["entries"][0].update(e2e_data="calibration:1234"),
     r"entries\.0\.e2e_data: must be 'realistic', 'calibration:' and a file's sha256"),
    (lambda d: d["entries"][0].update(e2e_error=-0.5), r"entries\.0\.e2e_error: must be >= 0"),
    (lambda d: d["entries"][0].update(max_error="0.1"),
     r"entries\.0\.max_error: must be a number or null"),
    (lambda d: d.update(schema_version=4),
     r"entries\.0\.prepare_ms: prepare_ms needs schema_version >= 5, this is a version-4 table"),
], ids=["e2e-data", "negative-error", "text-budget", "version-4-with-new-fields"])
def test_a_bad_budget_field_is_named_and_changes_nothing(table, tmp_path, edit, expected):
    from tuner.tables import entries_digest

    _, text = table
    doc = yaml.safe_load(text)
    edit(doc)
    doc["entries_sha256"] = entries_digest(doc["entries"])
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc, sort_keys=False))
    store = Store(f"sqlite:///{tmp_path / 'c.sqlite'}")
    with pytest.raises(TableError, match=r"bad\.yaml: line \d+: " + expected):
        import_table(store, bad, local_fingerprint=FINGERPRINT)
    assert store.winners() == []


@pytest.mark.parametrize("args, says", [
    (["--force"], "schema version 99"),  # a table that cannot be imported
    ([], "no local GPU. Re-run with --force"),  # a device this machine cannot vouch for
], ids=["bad-table", "unchecked-device"])
def test_a_failed_import_into_a_new_database_leaves_nothing(tmp_path, capsys, monkeypatch, args,
                                                            says):
    from tuner.commands import import_

    monkeypatch.setattr(import_, "_local_fingerprint", lambda: None)  # as on a CPU machine
    table = tmp_path / "t.yaml"
    text = SHIPPED.read_text()
    table.write_text(text.replace("schema_version: 4", "schema_version: 99") if args else text)
    where = tmp_path / "new"
    where.mkdir()
    assert main(["import", str(table), "--db", f"sqlite:///{where / 'db.sqlite'}", *args]) == 2
    assert says in capsys.readouterr().err
    assert list(where.iterdir()) == []  # no database, no .lock, no -wal


def test_a_write_that_fails_in_a_new_database_leaves_nothing(tmp_path, capsys, monkeypatch):
    from tuner.store import Store as Real

    def fail(self, *a):
        raise RuntimeError("disk full")

    monkeypatch.setattr(Real, "import_winners", fail)
    where = tmp_path / "new"
    where.mkdir()
    assert main(["import", str(SHIPPED), "--db", f"sqlite:///{where / 'db.sqlite'}",
                 "--force"]) == 1
    assert "disk full" in capsys.readouterr().err
    assert list(where.iterdir()) == []


def test_a_failed_import_into_an_existing_database_keeps_it(tmp_path, capsys, monkeypatch):
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    assert main(["import", str(SHIPPED), "--db", url, "--force"]) == 0
    before = sorted(p.name for p in tmp_path.iterdir())
    from tuner.store import Store as Real

    def fail(self, *a):
        raise RuntimeError("disk full")

    monkeypatch.setattr(Real, "import_winners", fail)
    assert main(["import", str(SHIPPED), "--db", url, "--force"]) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert len(Real(url, readonly=True).winners()) == shipped_entry_count()


def test_importing_a_table_again_says_nothing_new_was_added(tmp_path, capsys, table):
    path, _ = table
    url = f"sqlite:///{tmp_path / 'twice.sqlite'}"
    total = shipped_entry_count()
    assert main(["import", str(SHIPPED), "--db", url, "--force"]) == 0
    first = capsys.readouterr().out
    assert first.startswith(f"imported {total} tuned problems from {SHIPPED}")
    assert main(["import", str(SHIPPED), "--db", url, "--force"]) == 0
    again = capsys.readouterr().out
    assert again.count("\n") == 1 and "imported" not in again
    assert f"nothing new from {SHIPPED}: its {total} tuned problems are already in" in again
    # A table with one problem new and one already there says both.
    from tuner.tables import entries_digest

    part = f"sqlite:///{tmp_path / 'part.sqlite'}"
    one = yaml.safe_load(path.read_text())
    one["entries"], one["entry_count"] = one["entries"][:1], 1
    one["entries_sha256"] = entries_digest(one["entries"])
    first_only = tmp_path / "one.yaml"
    first_only.write_text(yaml.safe_dump(one, sort_keys=False))
    assert main(["import", str(first_only), "--db", part, "--force"]) == 0
    capsys.readouterr()
    assert main(["import", str(path), "--db", part, "--force"]) == 0
    out = capsys.readouterr().out
    assert "imported 1 tuned problems" in out and "(1 already there)" in out
