"""The search loop against the CPU test-double families (tests/doubles/): outcomes as data,
feasibility before compile, the default first, mode choice, resume after a kill, concurrency."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from tests.doubles import ANY_ACCURACY, fake_family, fake_family_large
from tuner.cli import main
from tuner.commands._args import duration
from tuner.problem import Problem
from tuner.search import (
    ProblemSearch,
    SearchSettings,
    make_target,
    pick_winner,
)
from tuner.store import Store, TrialRecord, config_hash

REPO = Path(__file__).resolve().parents[1]
SMALL = "tests.doubles.fake_family"
LARGE = "tests.doubles.fake_family_large"
PROBLEM = Problem(1, 2, 64, 64)
# Small enough that the reference and the fake kernels take microseconds; timeouts short enough
# that the planted hang costs 3 s. Not 2 s: the gate's three cases and the timing of a candidate
# took 2 s and more on a loaded 2-core machine with two workers, and the winner timed out.
BASE = ["search", "--gpu", "h200", "--seq-lens", "64", "--heads", "2", "--head-dim", "64",
        "--repeats", "10", "--timeout", "3", "--compile-jobs", "1", "--json", *ANY_ACCURACY]
# The TPE searches over the large fake space, with their own candidate timeout (the planted hang
# costs it once a trial samples it). Not 1 s: a candidate's modelled 2-40 ms a run, slept, takes
# more than that on a slow 2-core CI machine, and then every candidate timed out and no winner
# was stored (2026-12-02).
LARGE_SEARCH = ["--families", LARGE, "--timeout", "4"]


def rows(db: Path | str) -> list:
    """The trial rows, oldest first: of a SQLite file (a Path), or of any database URL (dicts)."""
    if isinstance(db, str):
        from sqlalchemy import create_engine, text
        from sqlalchemy.pool import NullPool

        engine = create_engine(db, poolclass=NullPool)
        try:
            with engine.connect() as conn:
                result = conn.execute(text("SELECT * FROM tuner_trials ORDER BY id"))
                return [dict(r) for r in result.mappings()]
        finally:
            engine.dispose()
    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row
    try:
        return con.execute("SELECT * FROM tuner_trials ORDER BY id").fetchall()
    except sqlite3.OperationalError:  # not created yet
        return []
    finally:
        con.close()


def measured(db: Path | str) -> list:
    """Search/default rows that reached a compiler (not the final re-times, not infeasible)."""
    return [r for r in rows(db) if r["role"] != "retime" and r["outcome"] != "infeasible"]


def key(family_module, config: dict) -> tuple:
    cfg = family_module.Config.from_dict(config)
    return cfg.tile, cfg.stages


@pytest.fixture
def compile_log(tmp_path, monkeypatch) -> Path:
    """Where the test-double families log every config they compile, in any process."""
    log = tmp_path / "compiles.jsonl"
    monkeypatch.setenv("FAKE_FAMILY_COMPILE_LOG", str(log))
    return log


def compiled_configs(log: Path) -> list[dict]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines()]


def run_cli(capsys, args: list[str]) -> dict:
    assert main(args) == 0
    return json.loads(capsys.readouterr().out)


# ---- pure parts --------------------------------------------------------------------------------

def test_parse_duration():
    assert duration("90") == 90
    assert duration("90s") == 90
    assert duration("10m") == 600
    assert duration("1.5h") == 5400
    with pytest.raises(argparse.ArgumentTypeError, match="bad duration"):
        duration("ten minutes")


@pytest.mark.parametrize("family,trials,mode", [
    (SMALL, 20, "exhaustive"),  # 14 feasible <= 20 trials
    (SMALL, 10, "tpe"),
    (LARGE, 64, "tpe"),  # 140 feasible
])
def test_mode_follows_feasible_space_size(tmp_path, family, trials, mode):
    modules = {family: __import__(family, fromlist=["_"])}
    search = ProblemSearch(PROBLEM, [family], make_target("h200", modules),
                           Store(f"sqlite:///{tmp_path / 'db.sqlite'}"),
                           optuna.storages.InMemoryStorage(), SearchSettings(trials=trials))
    progress = search.progress()
    assert progress.mode == mode
    assert progress.feasible == (14 if family == SMALL else 140)


def test_cli_defaults_match_the_search_settings():
    from tuner.commands import search as command

    d = SearchSettings()
    assert (command.DEFAULTS.trials, command.DEFAULTS.patience, command.DEFAULTS.timeout_s,
            command.DEFAULTS.repeats, command.DEFAULTS.confirm_patience) == (
        d.trials, d.patience, d.timeout_s, d.repeats, d.confirm_patience)


def test_cpu_double_needs_no_gpu_but_real_family_does():
    from tuner.errors import TunerError

    target = make_target("h200", {SMALL: fake_family})
    assert target.device == "cpu" and target.gpu.arch == "sm_90a"
    import torch

    if not torch.cuda.is_available():
        with pytest.raises(TunerError, match="no CUDA GPU"):
            make_target("h200", {"real": object()})


# ---- searches in this process ------------------------------------------------------------------

def test_exhaustive_search_records_every_outcome_and_picks_a_valid_winner(tmp_path, capsys,
                                                                          compile_log):
    log = compile_log
    db = tmp_path / "db.sqlite"
    out = run_cli(capsys, [*BASE, "--families", SMALL, "--trials", "20", "--seed", "7",
                           "--db", f"sqlite:///{db}"])
    (result,) = out["results"]
    assert result["mode"] == "exhaustive" and result["stopped"] == "space exhausted"
    assert result["seed"] == 7

    # Infeasible configs never reach a compiler, in any process.
    compiled = compiled_configs(log)
    assert compiled, "the compile log is empty: did the workers see the environment?"
    problem = PROBLEM
    assert all(fake_family.can_implement(fake_family.Config(c["tile"], c["stages"]), problem,
                                         None)[0] for c in compiled)

    # Every planted failure is a stored outcome with its message, and the search went on.
    got = {key(fake_family, json.loads(r["config_json"])): r for r in measured(db)}
    assert len(got) == 14
    expected = {(16, 1): "compile_error", (16, 2): "compile_error", (32, 1): "crash",
                (16, 4): "timeout", (32, 4): "launch_error", (128, 1): "wrong_result"}
    for cfg, outcome in expected.items():
        assert got[cfg]["outcome"] == outcome, cfg
        assert got[cfg]["message"]
    assert "SIGSEGV" in got[(32, 1)]["message"]
    assert "exit code 7" in got[(16, 2)]["message"]
    ok = [r for r in got.values() if r["outcome"] == "ok"]
    assert len(ok) == 8 and all(r["median_ms"] > 0 and r["rel_rms"] is not None for r in ok)

    # The default went in first; a wrong result (the fastest config) never wins.
    default = [r for r in measured(db) if r["role"] == "default"]
    assert [(key(fake_family, json.loads(r["config_json"])), r["optuna_number"])
            for r in default] == [((64, 2), 0)]
    winner = result["winner"]
    assert (winner["config"]["tile"], winner["config"]["stages"]) == (64, 3)
    assert result["speedup_over_default"] > 1.1

    store = Store(f"sqlite:///{db}")
    best = store.best_for(out["device"], PROBLEM)
    assert best.trial.role == "retime" and best.config == {"tile": 64, "stages": 3}
    assert best.default_trial.config == {"tile": 64, "stages": 2}


def test_tpe_search_on_a_large_space_stays_feasible_and_within_budget(tmp_path, capsys,
                                                                      compile_log):
    log = compile_log
    db = tmp_path / "db.sqlite"
    out = run_cli(capsys, [*BASE, *LARGE_SEARCH, "--trials", "10", "--seed", "3",
                           "--db", f"sqlite:///{db}"])
    (result,) = out["results"]
    assert result["mode"] == "tpe"
    done = measured(db)
    assert len(done) == 10
    assert done[0]["role"] == "default" or any(
        r["role"] == "default" and r["optuna_number"] == 0 for r in done)
    # The family's seed (the default swizzled) is measured second, before TPE's proposals.
    (second,) = [r for r in done if r["optuna_number"] == 1]
    assert json.loads(second["config_json"]) == {"tile": 64, "stages": 2, "warps": 4,
                                                 "swizzle": True}
    for c in compiled_configs(log):
        cfg = fake_family_large.Config(c["tile"], c["stages"], 4, False)
        assert fake_family.can_implement(cfg, PROBLEM, None)[0]
    assert result["winner"] is not None
    assert fake_family.PLANTED.get((result["winner"]["config"]["tile"],
                                    result["winner"]["config"]["stages"])) is None
    # A re-run of the finished study measures nothing new: the budget is per study.
    again = run_cli(capsys, [*BASE, *LARGE_SEARCH, "--trials", "10", "--db", f"sqlite:///{db}",
                             "--resume"])
    assert again["results"][0]["measured_here"] == 0
    assert again["results"][0]["seed"] == 3  # the recorded seed
    assert len(measured(db)) == 10


def _timed(name: str, median_ms: float, iqr_ms: float) -> TrialRecord:
    return TrialRecord(id=None, device_id="d", problem_key="p", family_set="f", family="f",
                       config={"name": name}, config_hash=name, outcome="ok",
                       median_ms=median_ms, iqr_ms=iqr_ms)


def test_the_default_stays_unless_beaten_by_more_than_the_spread():
    default = _timed("default", 2.00, 0.05)
    close, clear = _timed("close", 1.96, 0.02), _timed("clear", 1.90, 0.02)
    assert pick_winner([close, default], default) == (default, True)  # 0.04 <= IQR 0.05
    assert pick_winner([clear, default], default) == (clear, False)  # 0.10 > 0.05
    assert pick_winner([default, close], default) == (default, False)  # fastest anyway
    assert pick_winner([close], None) == (close, False)  # the default failed its re-time


def test_patience_stops_a_search_without_improvement(tmp_path, capsys):
    out = run_cli(capsys, [*BASE, *LARGE_SEARCH, "--trials", "60", "--patience", "3",
                           "--seed", "5", "--db", f"sqlite:///{tmp_path}/p.db"])
    (result,) = out["results"]
    assert result["stopped"] == "no improvement in 3 trials"
    assert 4 <= result["measured_here"] < 60
    assert result["winner"] is not None


def test_time_budget_stops_a_search_and_leaves_it_resumable(tmp_path, capsys):
    db = f"sqlite:///{tmp_path}/t.db"
    out = run_cli(capsys, [*BASE, *LARGE_SEARCH, "--trials", "60", "--time-budget", "3",
                           "--patience", "0", "--db", db])
    (result,) = out["results"]
    assert result["stopped"] == "time budget"
    assert result["measured_here"] < 60
    study = optuna.load_study(study_name=result["study"], storage=db)
    assert not study.get_trials(states=(optuna.trial.TrialState.RUNNING,))  # all told
    assert len(measured(tmp_path / "t.db")) == result["measured_here"]


def test_storage_alone_is_the_results_database_too(tmp_path, capsys, monkeypatch):
    # Hosts that share a study with `--storage URL` alone must share the results as well.
    monkeypatch.delenv("TUNER_DB_URL", raising=False)
    monkeypatch.setenv("TUNER_HOME", str(tmp_path / "home"))
    shared = tmp_path / "shared.sqlite"
    out = run_cli(capsys, [*BASE, "--families", SMALL, "--trials", "20",
                           "--storage", f"sqlite:///{shared}"])
    assert len(measured(shared)) == out["results"][0]["measured_here"] == 14
    assert not (tmp_path / "home" / "tuner.sqlite").exists()


def test_a_process_finishing_while_another_still_searches_leaves_it_the_decision(
        tmp_path, capsys, monkeypatch):
    """Several hosts on one study: only the process that finishes last decides."""
    db = f"sqlite:///{tmp_path}/h.db"
    args = [*BASE, "--families", SMALL, "--trials", "20", "--db", db]
    first = run_cli(capsys, args)
    study = optuna.load_study(study_name=first["results"][0]["study"], storage=db)

    def retimes() -> int:
        return len([r for r in rows(tmp_path / "h.db") if r["role"] == "retime"])

    # Another host holds a trial of the study, just asked: this process leaves it the decision.
    other = study.ask()
    other.set_user_attr("owner", "elsewhere:4242")
    decided = retimes()
    (result,) = run_cli(capsys, args)["results"]
    assert result["winner"] is None and "left to elsewhere:4242" in result["stopped"]
    assert retimes() == decided
    # A trial older than any candidate can take belongs to a dead host: it blocks nothing.
    monkeypatch.setattr(SearchSettings, "longest_candidate", lambda self: dt.timedelta(0))
    assert run_cli(capsys, args)["results"][0]["winner"] is not None
    assert retimes() > decided
    monkeypatch.undo()
    # When the other host finishes its trial, the next process to finish decides again.
    study.tell(other.number, state=optuna.trial.TrialState.FAIL)
    decided = retimes()
    assert run_cli(capsys, args)["results"][0]["winner"] is not None
    assert retimes() > decided


def test_resume_requires_an_existing_study(tmp_path):
    from tuner.errors import TunerError

    with pytest.raises(TunerError, match="--resume: no stored study"):
        main(["--debug", *BASE, "--families", SMALL, "--db",
              f"sqlite:///{tmp_path / 'db.sqlite'}", "--resume"])


# ---- separate processes ------------------------------------------------------------------------

def _cli(db: Path | str, *extra: str) -> list[str]:
    url = db if isinstance(db, str) else f"sqlite:///{db}"
    return [sys.executable, "-m", "tuner", *BASE, "--db", url, *extra]


def _spawn(args: list[str]) -> subprocess.Popen:
    # A session of its own, so the test can kill the search with all its workers at once; and
    # SIGINT at its default in it, as under a terminal: a test run started in the background
    # by a shell ignores SIGINT, and its children would inherit that.
    return subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _wait_for(predicate, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting for the search to progress"
        time.sleep(0.1)


def _finish(proc: subprocess.Popen, timeout_s: float = 120.0) -> tuple[str, str]:
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    assert proc.returncode == 0, err[-3000:]
    return out, err


def test_kill_and_ctrl_c_mid_search_then_resume_loses_no_finished_trial(tmp_path):
    db = tmp_path / "db.sqlite"
    args = _cli(db, "--families", SMALL, "--trials", "20", "--seed", "11")
    first = _spawn(args)
    _wait_for(lambda: len(measured(db)) >= 4 or first.poll() is not None)
    assert first.poll() is None, f"the search ended before the kill: {first.communicate()[1]}"
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    before_rows = rows(db)
    before = [tuple(r) for r in before_rows]
    measured_before = len(measured(db))
    assert 4 <= measured_before < 14

    # Then Ctrl-C (SIGINT to the whole group, as a terminal sends it) during the resumed run.
    second = _spawn(args + ["--resume"])
    _wait_for(lambda: len(measured(db)) >= measured_before + 1 or second.poll() is not None)
    at_sigint = len(measured(db))
    assert second.poll() is None, ("the resumed search ended before the SIGINT: "
                                   + second.communicate()[1][-2000:])
    os.killpg(second.pid, signal.SIGINT)
    _, err = second.communicate(timeout=60)
    assert second.returncode == 130, (f"measured: {measured_before} before the resume, "
                                      f"{at_sigint} at the SIGINT, {len(measured(db))} after; "
                                      + err[-2000:])
    assert "interrupted" in err
    middle = [tuple(r) for r in rows(db)]
    assert middle[: len(before)] == before
    measured_middle = len(measured(db))

    third = _spawn(args + ["--resume"])
    out, err = _finish(third)
    after = [tuple(r) for r in rows(db)]
    assert after[: len(middle)] == middle  # every finished trial is still there, unchanged
    done = measured(db)
    hashes = [r["config_hash"] for r in done]
    study = optuna.load_study(study_name=json.loads(out)["results"][0]["study"],
                              storage=f"sqlite:///{db}")
    assert len(hashes) == len(set(hashes)) == 14, "\n".join(  # nothing twice, nothing missing
        [str((t.number, t.state, t.params, t.user_attrs, t.system_attrs)) for t in study.trials]
        + [out, err])
    result = json.loads(out)["results"][0]
    assert result["measured_here"] == 14 - measured_middle
    assert result["winner"]["config"] == {"tile": 64, "stages": 3}, err[-2000:]


def _check_shared_study(url: str, docs: list[dict]) -> list:
    """Every trial a process measured is stored exactly once and is a COMPLETE trial of the
    study with the same config; one winner per problem. Returns the measured rows."""
    done = measured(url)
    outs = [d["results"][0] for d in docs]
    assert len(done) == sum(o["measured_here"] for o in outs)  # none lost, none extra
    numbers = [r["optuna_number"] for r in done]
    assert len(numbers) == len(set(numbers)), "an Optuna trial stored twice"
    study = optuna.load_study(study_name=outs[0]["study"], storage=url)
    trials = {t.number: t for t in study.get_trials()}
    for r in done:
        trial = trials[r["optuna_number"]]
        assert trial.state == optuna.trial.TrialState.COMPLETE
        family = trial.params["family"]
        config = {k.split(".")[-1]: v for k, v in trial.params.items() if k != "family"}
        assert config_hash(family, config) == r["config_hash"] \
            == config_hash(family, json.loads(r["config_json"]))
    # ... and every trial the study counts as done has its measurement (or rejection) stored.
    stored = {r["config_hash"] for r in rows(url) if r["role"] != "retime"}
    for t in trials.values():
        if t.state == optuna.trial.TrialState.COMPLETE:
            family = t.params["family"]
            assert config_hash(family, {k.split(".")[-1]: v for k, v in t.params.items()
                                        if k != "family"}) in stored, t.number
    store = Store(url)
    try:
        assert [w.problem_key for w in store.winners(docs[0]["device"])] == [PROBLEM.key()]
    finally:
        store.close()
    return done


def test_two_concurrent_searches_on_one_database_lose_nothing(db_url_any):
    procs = [_spawn(_cli(db_url_any, *LARGE_SEARCH, "--trials", "12", "--seed", str(seed)))
             for seed in (1, 2)]
    docs = [json.loads(_finish(p)[0]) for p in procs]
    done = _check_shared_study(db_url_any, docs)
    assert 12 <= len(done) <= 14  # the shared budget, give or take the other's in-flight one


def test_workers_share_one_study_and_decide_once(db_url_any):
    """--workers 2: two child searches (CPU doubles need no GPU), one decision by the parent."""
    proc = _spawn(_cli(db_url_any, "--families", SMALL, "--trials", "20", "--workers", "2"))
    doc = json.loads(_finish(proc)[0])
    (result,) = doc["results"]
    # The --json keys of `tuner search` (README, Usage), as with one process.
    assert set(doc) == {"device", "gpu", "families", "accuracy", "results"}
    assert set(doc["accuracy"]) == {"data", "max_error"}
    assert set(result) == {"problem", "seq_len", "study", "seed", "mode", "feasible", "stopped",
                           "measured_here", "outcomes", "ruled_out_classes",
                           "ruled_out_proposals", "winner", "default",
                           "speedup_over_default", "default_kept", "no_winner"}
    assert {"e2e_error", "e2e_data"} <= set(result["winner"])
    done = _check_shared_study(db_url_any, [doc])
    # Exhaustive over 14 feasible configs: each measured once, by one process or the other.
    assert len({r["config_hash"] for r in done}) == len(done) == 14
    assert len({r["study_name"] for r in done}) == 1
    # Decided once: the top 3 and the default re-timed once each (3 rows if the default is in
    # the top 3); the children re-timed nothing.
    retimes = [r for r in rows(db_url_any) if r["role"] == "retime"]
    assert len({r["config_hash"] for r in retimes}) == len(retimes) in (3, 4)
    assert result["winner"]["config"] == {"tile": 64, "stages": 3}
    assert result["measured_here"] == 14
    # Each child's reason, merged: a child that finds every config taken may stop on its sampler.
    assert set(result["stopped"].split("; ")) <= {"space exhausted",
                                                  "the sampler proposes nothing new"}


def test_workers_take_one_visible_gpu_each_and_no_more(monkeypatch):
    from tuner.errors import TunerError
    from tuner.multi_gpu import visible_devices

    monkeypatch.setattr("torch.cuda.device_count", lambda: 2)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert visible_devices(2, on_cpu=False) == ["0", "1"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5,7")  # CUDA stops at the first bad entry
    assert visible_devices(1, on_cpu=False) == ["3"]
    with pytest.raises(TunerError, match=r"--workers 3 needs 3 GPUs, 2 visible "
                                         r"\(CUDA_VISIBLE_DEVICES=3,5,7\); use --workers 2"):
        visible_devices(3, on_cpu=False)
    with pytest.raises(TunerError, match="--workers must be >= 1"):
        visible_devices(0, on_cpu=False)
    assert visible_devices(3, on_cpu=True) == ["", "", ""]  # CPU doubles: no GPU needed


def test_a_failed_worker_is_one_line_from_the_parent(tmp_path):
    proc = _spawn(_cli(tmp_path / "db.sqlite", "--families", SMALL, "--workers", "2",
                       "--resume"))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and out == ""
    assert err.count("\n") == 1 and "failed: --resume: no stored study" in err, err


def test_more_workers_than_gpus_is_a_one_line_error(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("torch.cuda.device_count", lambda: 1)
    args = ["search", "--gpu", "h200", "--seq-lens", "64", "--heads", "2", "--families",
            "mma_sync", "--workers", "2", "--db", f"sqlite:///{tmp_path / 'db.sqlite'}"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--workers 2 needs 2 GPUs, 1 visible" in err


def test_final_table_names_the_winner_by_what_differs_from_the_default():
    import dataclasses

    from tuner.commands.search import SearchView

    def record(family, config):
        return dataclasses.replace(_timed("x", 1.0, 0.0), family=family, config=config)

    default = record("wgmma", {"block_n": 128, "kv_stages": 2})
    assert SearchView.short_label(record("wgmma", {"block_n": 128, "kv_stages": 4}),
                                  default) == "wgmma: kv_stages=4"
    assert SearchView.short_label(default, default) == "wgmma: the default"
    other = record("tests.doubles.fake_family", {"tile": 64, "stages": 3})
    assert SearchView.short_label(other, default) == "fake_family: tile=64 stages=3"


def test_decisions_of_several_problems_share_one_gpu_worker(tmp_path):
    """--workers N decides every problem in the parent: one GPU worker for all of them (a fresh
    one per problem cost 7-8 s each on the two-H200 machine), one winner per problem."""
    from tuner.search import decision_pipeline

    modules = {SMALL: fake_family}
    target = make_target("h200", modules)
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    storage = optuna.storages.InMemoryStorage()
    problems = [PROBLEM, Problem(1, 2, 96, 64)]
    settings = SearchSettings(trials=4, compile_jobs=1, timeout_s=5, repeats=10)
    store.record_device(target.device_id, target.fingerprint)
    try:
        searched = []
        for problem in problems:  # the children's part: search, no decision
            search = ProblemSearch(problem, [SMALL], target, store, storage, settings)
            searched.append((search, search.run(decide=False).stopped))
        with decision_pipeline() as pipeline:
            results = [search.decide(stopped, pipeline) for search, stopped in searched]
            assert pipeline.gpu.starts == 1
        assert all(r.winner is not None for r in results)
        assert [w.problem_key for w in store.winners(target.device_id)] == \
            [p.key() for p in problems]
    finally:
        store.close()


def test_problems_searched_one_after_another_share_one_gpu_worker(tmp_path, monkeypatch,
                                                                  capsys):
    """`tuner search` over several lengths: one GPU sandbox for all of them (a fresh one per
    problem cost 10-15 s each of an H100 main job), one winner per problem."""
    from tuner.search import pool

    made = []
    real = pool.Pipeline.__init__

    def counted(self, compile_jobs, **kwargs):
        real(self, compile_jobs, **kwargs)
        made.append(self)

    monkeypatch.setattr(pool.Pipeline, "__init__", counted)
    monkeypatch.setenv("FAKE_FAMILY_NO_PLANTS", "1")  # no crash or hang restarts a sandbox
    db = tmp_path / "db.sqlite"
    args = [*BASE, "--families", SMALL, "--seq-lens", "64,96,128", "--trials", "3", "--db",
            f"sqlite:///{db}"]
    assert main(args) == 0
    assert len(made) == 1 and made[0].gpu.starts == 1
    assert len({r["problem_id"] for r in rows(db) if r["role"] == "retime"}) == 3


def test_the_wgmma_space_seeds_the_defaults_other_q_placement():
    """Every wgmma search measures the default with Q quantized in the other place right
    after the default (which placement wins moves with the length), where that twin is
    feasible: from ROTATE_FULL_128_FROM the full-mask default rotates Q and K, which Q quantized
    in the kernel cannot, and the twin is left out."""
    import dataclasses

    from tuner.gpus import PROFILES
    from tuner.search.proposal import Space
    from variants import wgmma
    from variants.wgmma.defaults import ROTATE_FULL_128_FROM as ROTATE

    for seq, want in ((1024, "prepare"), (ROTATE - 1, "kernel"), (ROTATE, None)):
        problem = Problem(1, 8, seq, 128)
        space = Space.build({"wgmma": wgmma}, problem, PROFILES["h200"], exhaustive_up_to=64)
        default = wgmma.default("sm_90a", problem)
        assert space.seeds == ([] if want is None else
                               [("wgmma", dataclasses.replace(default, q_quant=want).to_dict())])
