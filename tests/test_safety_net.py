"""The safety net of issue #16: each test here fails under one mutation of the production code
that the rest of the suite let through (benchmarks/mutations.md lists them and how each was
tried)."""

from __future__ import annotations

import json

from tests.doubles import fake_family_noisy as noisy
from tuner.cli import main
from tuner.problem import Problem
from tuner.store import Store

NOISY = "tests.doubles.fake_family_noisy"
PROBLEM = Problem(1, 2, 64, 64)
SEARCH = ["search", "--gpu", "h200", "--seq-lens", "64", "--heads", "2", "--head-dim", "64",
          "--repeats", "10", "--timeout", "5", "--compile-jobs", "1", "--json"]


# ---- 1. the spread rule, end to end ------------------------------------------------------------

def test_a_search_keeps_the_default_when_the_lead_is_within_the_spread(tmp_path, capsys):
    """Both candidates measure faster than the default, by 0.5 and 1 ms, with an IQR of about
    4 ms each (tests/doubles/fake_family_noisy.py): the stored winner is the default, kept."""
    db = f"sqlite:///{tmp_path / 'db.sqlite'}"
    assert main([*SEARCH, "--families", NOISY, "--trials", "3", "--seed", "1", "--db", db]) == 0
    doc = json.loads(capsys.readouterr().out)
    (result,) = doc["results"]
    assert result["mode"] == "exhaustive" and result["outcomes"] == {"ok": 3}
    default = noisy.default("sm_90a", None).to_dict()
    winner, kept = result["winner"], result["default"]
    assert kept["config"] == default
    assert kept["iqr_ms"] > 2 * noisy.LEAD_MS  # the double does make the spread it promises
    assert result["default_kept"] is True, result
    assert winner["config"] == default and winner["trial_id"] == kept["trial_id"]
    assert result["speedup_over_default"] == 1.0
    store = Store(db, readonly=True)
    try:
        best = store.best_for(doc["device"], PROBLEM)
        assert best.config == default and best.default_trial.id == best.trial.id
        # The candidates were re-timed beside it, and did measure faster than the default.
        retimed = [t for t in store.trials(PROBLEM, outcome="ok") if t.role == "retime"]
        assert min(retimed, key=lambda t: t.median_ms).config != default
    finally:
        store.close()
