"""A search's study is a plain Optuna study in the results database: optuna's own API (what
optuna-dashboard reads, README) opens the storage URL and sees every trial with our user
attributes."""

import json

import optuna

from tests.doubles import ANY_ACCURACY
from tuner.cli import main

SEARCH = ["search", "--gpu", "h200", "--seq-lens", "64", "--heads", "2", "--head-dim", "64",
          "--families", "tests.doubles.fake_family", "--trials", "3", "--repeats", "10",
          "--timeout", "5", "--compile-jobs", "1", "--seed", "1", "--json", *ANY_ACCURACY]


def test_optuna_opens_a_search_storage_with_our_attributes(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'tuner.sqlite'}"
    assert main([*SEARCH, "--db", url]) == 0
    result = json.loads(capsys.readouterr().out)["results"][0]
    summaries = optuna.get_all_study_summaries(storage=url)
    assert [s.study_name for s in summaries] == [result["study"]]
    study = optuna.load_study(study_name=result["study"], storage=url)
    assert study.user_attrs["problem"] == "b1-h2-s64-d64-full"
    assert {"seed", "families", "mode"} <= set(study.user_attrs)
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) >= 3
    assert all(t.user_attrs.get("outcome") in ("ok", "wrong_result", "compile_error",
                                               "launch_error", "crash", "timeout")
               for t in done)
    assert any(t.user_attrs.get("role") == "default" for t in study.trials)
