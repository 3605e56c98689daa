"""Which of a problem's winners runs where several family sets were searched for it: times of
two searches are compared only where the same code measured both (problem.preferred_per_problem),
in a database (store.best_for, the runtime's lookup) and in a table (load_table_entries)."""

import datetime as dt
import time

from tuner.gpus import fingerprint_id
from tuner.problem import Problem, StoredTime, preferred_per_problem
from tuner.runtime import _Resolver
from tuner.store import Store, TrialRecord
from tuner.tables import build_table, dump_table, import_table, load_table_entries
from variants import mma_sync

FINGERPRINT = {"name": "NVIDIA H200", "compute_capability": "9.0", "sm_count": 132}
DEVICE = fingerprint_id(FINGERPRINT)
PROBLEM = Problem(1, 56, 4096)
EARLY, LATE = dt.datetime(2026, 11, 29), dt.datetime(2026, 12, 2)


def _pick(*times: StoredTime) -> int:
    """The index of the winner that runs among one problem's `times`."""
    items = list(enumerate(times))
    (index, _), = preferred_per_problem(items, lambda _: "p", lambda item: item[1])
    return index


def test_winners_measured_by_the_same_code_are_ranked_by_time():
    assert _pick(StoredTime(0.50, EARLY, "aaa"), StoredTime(0.55, LATE, "aaa")) == 0


def test_a_faster_time_measured_by_older_code_does_not_outrank_the_newest_decision():
    # The early search's 0.50 ms was the kernel as it was then.
    assert _pick(StoredTime(0.50, EARLY, "aaa"), StoredTime(0.55, LATE, "bbb")) == 1
    # Among several of the newest code's winners, the fastest.
    assert _pick(StoredTime(0.40, EARLY, "aaa"), StoredTime(0.60, LATE, "bbb"),
                 StoredTime(0.55, EARLY, "bbb")) == 2


def test_without_code_versions_the_newest_decision_runs():
    assert _pick(StoredTime(0.50, EARLY), StoredTime(0.55, LATE)) == 1
    # Nothing dated nor versioned: nothing tells the searches apart but their times.
    assert _pick(StoredTime(0.55), StoredTime(0.50)) == 1


def test_a_winner_without_a_time_ranks_last_among_comparable_ones():
    assert _pick(StoredTime(None, LATE, "bbb"), StoredTime(0.9, EARLY, "bbb")) == 1


def _store_with_two_family_sets(url: str) -> tuple[Store, dict, dict]:
    """One problem's winners of two searches: the first (over mma_sync) faster by its time but
    measured by code "aaa"; the second (over both families), later, by code "bbb"."""
    store = Store(url)
    store.record_device(DEVICE, FINGERPRINT)
    first = mma_sync.default("sm_90a").to_dict()
    second = mma_sync.Config(block_m=64, block_n=64, warps=4, rows_per_warp=16, kv_stages=2,
                             p_source="smem", swizzle="bank_period", q_in_registers=False,
                             mma="fp8").to_dict()
    for family_set, config, ms, code in (("mma_sync", first, 0.50, "aaa"),
                                         ("mma_sync+wgmma", second, 0.55, "bbb")):
        tid = store.record_trial(TrialRecord(
            id=None, device_id=DEVICE, problem_key=PROBLEM.key(), family_set=family_set,
            family="mma_sync", config=config, config_hash=family_set, outcome="ok",
            median_ms=ms, tflops=PROBLEM.tflops(ms), code_version=code))
        store.set_best(DEVICE, PROBLEM, family_set, tid, None, None)
        time.sleep(1.05)  # decided_at orders the two decisions (a table writes it to the second)
    return store, first, second


def test_the_database_and_its_exported_table_run_the_newest_codes_winner(tmp_path):
    url = f"sqlite:///{tmp_path / 'a.sqlite'}"
    store, _, second = _store_with_two_family_sets(url)
    assert store.best_for(DEVICE, PROBLEM).config == second
    (problem, _, config, _), = _Resolver._db_winners(url, DEVICE)
    assert (problem, config) == (PROBLEM, second)

    # The table keeps each entry's code version, so its lookup picks the same entry.
    table = tmp_path / "h200.yaml"
    table.write_text(dump_table(build_table(store, DEVICE, "h200")))
    assert "code_version: bbb" in table.read_text()
    (problem, _, config, _), = load_table_entries(table)
    assert (problem, config) == (PROBLEM, second)
    fresh = Store(f"sqlite:///{tmp_path / 'b.sqlite'}")
    assert import_table(fresh, table, local_fingerprint=FINGERPRINT) == 2
    assert sorted(w.trial.code_version for w in fresh.winners()) == ["aaa", "bbb"]
    assert fresh.best_for(DEVICE, PROBLEM).config == second


def test_a_code_version_the_table_cannot_hold_is_refused_and_changes_nothing(tmp_path):
    import pytest
    import yaml

    from tuner.tables import TableError, entries_digest

    store, _, _ = _store_with_two_family_sets(f"sqlite:///{tmp_path / 'a.sqlite'}")
    text = dump_table(build_table(store, DEVICE, "h200"))
    fresh = Store(f"sqlite:///{tmp_path / 'b.sqlite'}")
    for edit, expected in (
            (lambda d: d.update(schema_version=3),
             r"entries\.0\.code_version: code_version needs schema_version >= 4, this is a "
             r"version-3 table"),
            (lambda d: d["entries"][1].update(code_version=12),
             r"entries\.1\.code_version: must be the text export wrote .* got 12")):
        doc = yaml.safe_load(text)
        edit(doc)
        doc["entries_sha256"] = entries_digest(doc["entries"])
        bad = tmp_path / "bad.yaml"
        bad.write_text(yaml.safe_dump(doc, sort_keys=False))
        with pytest.raises(TableError, match=expected):
            import_table(fresh, bad, local_fingerprint=FINGERPRINT)
        assert fresh.winners() == []
