"""How a search stops and how far it runs ahead: a patience stop abandons what is in flight,
patience counts from the first valid time and waits for the known configs, at most
pool.READY_DEPTH compiled candidates are asked ahead of the GPU, and the GPU takes the earliest
trial among those compiled."""

from __future__ import annotations

import optuna

from tests.doubles import fake_family
from tests.test_search import BASE, LARGE_SEARCH, PROBLEM, SMALL, measured, run_cli
from tuner.search import ProblemSearch, SearchSettings, make_target
from tuner.store import Store


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



def _search_with_known(tmp_path, monkeypatch, known: list[dict], patience: int = 2):
    """A search of the small fake family whose warm start is `known`; its candidates in the
    order proposed (the default, the known configs, then the sampler's), and a function that
    stores a result for one (a time in ms, else a wrong result) and says why the search stops."""
    from tuner.outcomes import Outcome
    from tuner.sandbox import CandidateResult
    from tuner.search import run
    from tuner.search.known import Known
    from tuner.search.storage import open_storage

    monkeypatch.setattr(run, "known_configs",
                        lambda *a: [Known(SMALL, config, "test") for config in known])
    url = f"sqlite:///{tmp_path}/k.db"
    target = make_target("h200", {SMALL: fake_family})
    store = Store(url)
    store.record_device(target.device_id, target.fingerprint)
    search = ProblemSearch(PROBLEM, [SMALL], target, store, open_storage(url),
                           SearchSettings(patience=patience, trials=40))
    cands = {}
    for _ in range(8):
        cand = search.proposer.next(search.records.stored(), set(cands))
        cands[cand.hash] = cand

    def finish(cand, ms=None) -> str:
        result = (CandidateResult(Outcome.OK, "", timing={"median_ms": ms, "prepare_ms": 0.0})
                  if ms is not None else CandidateResult(Outcome.WRONG_RESULT, "planted"))
        search._finish(cand, result)
        stored = search.records.stored()
        return search._stop_reason(len(stored), 0.0, stored, set())[0]

    return list(cands.values()), finish


def test_patience_counts_from_the_first_valid_time(tmp_path, monkeypatch):
    """A search with nothing valid yet has nothing to improve on: its failures do not count."""
    (default, *proposals), finish = _search_with_known(tmp_path, monkeypatch, [])
    assert default.config == {"tile": 64, "stages": 2}
    assert [finish(c) for c in (default, *proposals[:3])] == ["", "", "", ""]
    assert finish(proposals[3], 6.0) == ""  # the first valid time
    assert finish(proposals[4]) == ""
    assert finish(proposals[5]) == "no improvement in 2 trials"


def test_patience_waits_for_the_known_configs(tmp_path, monkeypatch):
    """Results come back in compile order, not trial order, so sampler proposals can be measured
    before the known configs; patience never stops a search with one still to come (an H100
    main job once stopped with no winner: six over-budget proposals came back first, the
    table's own row still in flight)."""
    known = {"tile": 64, "stages": 3}
    (default, known_cand, *proposals), finish = _search_with_known(tmp_path, monkeypatch,
                                                                   [known])
    assert known_cand.config == known
    assert finish(default, 6.0) == ""
    assert [finish(c) for c in proposals[:3]] == ["", "", ""]  # patience run out: known to come
    assert finish(known_cand, 7.0) == "no improvement in 2 trials"


def test_the_gpu_takes_the_earliest_trial_among_those_compiled():
    """Compiles finish in any order; the GPU sandbox still measures the baselines and the
    known configs (asked first) before the sampler's proposals compiled beside them."""
    from dataclasses import dataclass
    from types import SimpleNamespace

    from tuner.search.pool import Pipeline

    @dataclass
    class Task:
        kind: str = "compile"

    class Gpu:
        busy, got = False, []

        def submit(self, task, payload):
            self.got.append(payload[0].trial.number)

    pipeline = Pipeline(compile_jobs=1)  # started on first use: nothing starts here
    real_gpu, pipeline.gpu = pipeline.gpu, Gpu()
    try:
        for number in (5, 2, 9, 3):
            cand = SimpleNamespace(trial=SimpleNamespace(number=number))
            pipeline.ready.append((cand, Task()))
        for _ in range(4):
            pipeline.feed()
        assert pipeline.gpu.got == [2, 3, 5, 9] and not pipeline.ready
    finally:
        pipeline.gpu = real_gpu
        pipeline.close()
