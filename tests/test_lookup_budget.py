"""The runtime lookup with max_error: winners whose stored end-to-end error is above it are passed
over (logged once), winners without a stored error are used as unknown, in the database and in
the shipped table alike; tuner.attention hands max_error to the lookup."""

from __future__ import annotations

import logging

import pytest
import torch

from tests.doubles.tables import write_table
from tests.test_runtime import ALT_CFG, DEVICE, SEED_CFG, db  # noqa: F401 - the db fixture
from tuner import runtime
from tuner.problem import Problem
from tuner.store import TrialRecord

P4K, P8K = Problem(1, 56, 4096), Problem(1, 56, 8192)


def add(store, problem, cfg, e2e_error, family_set="mma_sync", ms=1.0):
    tid = store.record_trial(TrialRecord(
        id=None, device_id=DEVICE, problem_key=problem.key(), family_set=family_set,
        family="mma_sync", config=cfg.to_dict(), config_hash="x", outcome="ok", median_ms=ms,
        code_version="c0", e2e_error=e2e_error, e2e_data=None if e2e_error is None else "realistic",
        max_error=None if e2e_error is None else 0.5))
    store.set_best(DEVICE, problem, family_set, tid, None, None)


def best(url, seq_len, max_error=None):
    return runtime.load_best_config(seq_len, heads=56, db=url, with_source=True,
                                    max_error=max_error)


def test_a_winner_over_max_error_is_passed_over_and_logged_once(db, caplog):  # noqa: F811
    url, store = db
    add(store, P4K, ALT_CFG, 0.3)
    add(store, P8K, SEED_CFG, 0.05)
    assert (best(url, 4096).source, best(url, 4096).config) == ("db-exact", ALT_CFG)
    with caplog.at_level(logging.WARNING, logger="tuner.runtime"):
        found = best(url, 4096, max_error=0.1)
        again = best(url, 4096, max_error=0.1)
    assert (found.source, found.config, found.tuned_problem) == ("db-nearest", SEED_CFG, P8K)
    assert found.e2e_error == 0.05 and again == found
    passed = [r for r in caplog.records if "passed over" in r.getMessage()]
    assert len(passed) == 1
    assert "db winner mma_sync for b1-h56-s4096-d128-full: end-to-end error 0.3 > " \
        "max_error=0.1" in passed[0].getMessage()
    # A looser budget takes the exact winner again.
    assert best(url, 4096, max_error=0.5).source == "db-exact"


def test_a_problems_family_set_within_the_budget_runs_instead_of_a_faster_one_over_it(db):  # noqa: F811
    url, store = db
    add(store, P4K, ALT_CFG, 0.3, ms=0.5)  # the faster, over the budget
    add(store, P4K, SEED_CFG, 0.05, family_set="wgmma+mma_sync", ms=0.9)
    assert best(url, 4096).config == ALT_CFG
    found = best(url, 4096, max_error=0.1)
    assert (found.source, found.config) == ("db-exact", SEED_CFG)


def test_a_winner_without_a_stored_error_is_used_as_unknown(db, caplog):  # noqa: F811
    url, store = db
    add(store, P4K, ALT_CFG, None)
    with caplog.at_level(logging.WARNING, logger="tuner.runtime"):
        found = best(url, 4096, max_error=0.1)
    assert (found.source, found.config, found.e2e_error) == ("db-exact", ALT_CFG, None)
    assert "end-to-end error is not stored: unknown against max_error=0.1" in caplog.text


def test_the_shipped_tables_winners_are_held_to_max_error_too(db, tmp_path):  # noqa: F811
    url, _ = db
    rows = [{"problem": p.to_dict(), "family": "mma_sync", "config": cfg.to_dict(),
             "median_ms": 1.0, "e2e_error": err, "e2e_data": "realistic", "max_error": 0.5}
            for p, cfg, err in ((P4K, ALT_CFG, 0.3), (P8K, SEED_CFG, 0.05))]
    tables = tmp_path / "tables"
    tables.mkdir()
    write_table(tables, rows)
    runtime.clear_cache()
    assert (best(url, 4096).source, best(url, 4096).config) == ("table-exact", ALT_CFG)
    found = best(url, 4096, max_error=0.1)
    assert (found.source, found.config, found.e2e_error) == ("table-nearest", SEED_CFG, 0.05)


def test_tuner_attention_hands_max_error_to_the_lookup(monkeypatch):
    import variants.input_checks
    from tuner import ops

    seen = []
    monkeypatch.setattr(variants.input_checks, "check_qkv", lambda *a, **kw: None)
    monkeypatch.setattr(ops, "attention_op", lambda *args: seen.append(args) or (args[0], None))
    q = torch.zeros(1, 8, 2, 64, dtype=torch.bfloat16)
    import tuner

    tuner.attention(q, q, q, max_error=0.07)
    # The op's arguments end with causal, max_error, want_lse.
    assert seen[0][-2:] == (0.07, False)
    with pytest.raises(TypeError):
        tuner.attention(q, q, q, max_eror=0.07)
