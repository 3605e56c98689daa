"""How a search stops and how far it runs ahead: a patience stop abandons what is in flight,
and at most pool.READY_DEPTH compiled candidates wait for the GPU."""

from __future__ import annotations

import optuna

from tests.test_search import BASE, LARGE_SEARCH, measured, run_cli


def test_a_patience_stop_abandons_what_is_in_flight(tmp_path, capsys):
    db = tmp_path / "p.db"
    out = run_cli(capsys, [*BASE, *LARGE_SEARCH, "--trials", "60", "--patience", "3",
                           "--compile-jobs", "3", "--seed", "5", "--db", f"sqlite:///{db}"])
    (result,) = out["results"]
    assert result["stopped"] == "no improvement in 3 trials"
    # Stored in the order measured: exactly 3 after the last improvement, none of the
    # candidates still compiling or waiting for the GPU when the third came in.
    costs = [r["median_ms"] + (r["prepare_ms"] or 0.0) if r["outcome"] == "ok" else None
             for r in measured(db)]
    best, last = None, 0
    for i, cost in enumerate(costs):
        if cost is not None and (best is None or cost < best):
            best, last = cost, i
    assert len(costs) - 1 - last == 3
    # Those were told FAIL (a re-run may propose them again), none left RUNNING.
    study = optuna.load_study(study_name=result["study"], storage=f"sqlite:///{db}")
    assert study.get_trials(states=(optuna.trial.TrialState.FAIL,))
    assert not study.get_trials(states=(optuna.trial.TrialState.RUNNING,))


def test_the_gpu_queue_holds_at_most_ready_depth_compiled_candidates():
    from tuner.search.pool import READY_DEPTH, Pipeline

    pipeline = Pipeline(compile_jobs=4)  # sandboxes start on first use: none does here
    try:
        for _ in range(READY_DEPTH):
            assert pipeline.has_room()  # compilers idle, the queue not full
            pipeline.ready.append((None, None))
        assert not pipeline.has_room()
    finally:
        pipeline.ready.clear()
        pipeline.close()
