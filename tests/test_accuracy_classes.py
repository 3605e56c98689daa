"""A measured member far over the accuracy budget rules out its accuracy class
(tuner/search/accuracy_classes.py): the search proposes none of the class again, tells the study
each such proposal with the member that ruled it out, stores none, and counts the class's configs
as covered when it decides the space is exhausted."""

from __future__ import annotations

import json

import optuna

from tests.test_budget import BETWEEN, FAMILY, SEARCH, trials
from tuner.cli import main
from tuner.outcomes import Outcome
from tuner.search.accuracy_classes import RULE_OUT_FACTOR, accuracy_class, ruled_out_classes
from tuner.search.settings import FAILED_VALUE_MS
from tuner.store import TrialRecord


def record(config: dict, outcome: Outcome, error: float | None, family: str = "wgmma",
           digest: str = "h") -> TrialRecord:
    return TrialRecord(id=None, device_id="d", problem_key="p", family_set="f", family=family,
                       config=config, config_hash=digest, outcome=outcome, message=None,
                       role="search", study_name="s", optuna_number=None, tflops=None,
                       compile_s=None, timing=None, seed=0, code_version="v", e2e_error=error)


def test_a_class_is_its_family_and_the_knobs_that_set_its_rounding():
    plain = {"block_n": 128, "k_smoothing": "off", "qk_rotation": "none", "pv_dtype": "e4m3"}
    assert accuracy_class("wgmma", plain) == accuracy_class("wgmma", {**plain, "block_n": 64})
    for knob, value in (("k_smoothing", "mean"), ("qk_rotation", "hadamard"),
                        ("pv_dtype", "bf16")):
        assert accuracy_class("wgmma", plain) != accuracy_class("wgmma", {**plain, knob: value})
    assert accuracy_class("wgmma", plain) != accuracy_class("mma_sync", plain)
    assert accuracy_class("mma_sync", {"pv_accum": "fp16"}) != accuracy_class(
        "mma_sync", {"pv_accum": "fp32"})


def test_only_a_member_far_over_the_budget_rules_its_class_out():
    cfg = {"block_n": 128, "k_smoothing": "off"}
    far = record(cfg, Outcome.TOO_INACCURATE, RULE_OUT_FACTOR * 0.12 * 1.01, digest="far")
    near = record({**cfg, "k_smoothing": "mean"}, Outcome.TOO_INACCURATE,
                  RULE_OUT_FACTOR * 0.12 * 0.99)
    ok = record({**cfg, "pv_dtype": "bf16"}, Outcome.OK, 0.5)
    assert ruled_out_classes([far, near, ok], 0.12) == {accuracy_class("wgmma", cfg): "far"}
    assert ruled_out_classes([far], None) == {}  # no budget: nothing is ruled out


def test_tpe_proposals_of_a_ruled_out_class_are_told_and_never_measured(tmp_path, capsys):
    db = tmp_path / "db.sqlite"
    # 6 trials over 8 configs: TPE. The default (64, off) is ~0.49 against 0.35: ruled out.
    assert main([*SEARCH[:-4], "--trials", "6", "--seed", "6", "--db", f"sqlite:///{db}",
                 "--json", "--max-error", BETWEEN]) == 0
    (result,) = json.loads(capsys.readouterr().out)["results"]
    assert result["mode"] == "tpe"
    got = trials(db)
    (default,) = got.pop((64, "off"))
    assert default.role == "default" and default.outcome == "too_inaccurate"
    assert {key[1] for key in got} == {"mean"}  # no other "off" config was measured
    study = optuna.load_study(study_name=result["study"], storage=f"sqlite:///{db}")
    ruled = [t for t in study.trials if t.params.get(f"{FAMILY}.k_smoothing") == "off"
             and t.number != default.optuna_number]
    assert ruled and len(ruled) == result["ruled_out_proposals"]
    for t in ruled:
        assert t.user_attrs["ruled_out_by"] == default.config_hash
        assert t.user_attrs["outcome"] == "too_inaccurate" and t.value == FAILED_VALUE_MS
    # Every "mean" config measured and the "off" class ruled out: the space is exhausted.
    assert result["stopped"] == "space exhausted" and len(got) == 4
    assert result["winner"]["config"] == {"tile": 64, "k_smoothing": "mean"}


def test_compiled_members_of_a_class_ruled_out_meanwhile_never_reach_the_gpu(tmp_path):
    """The pipeline compiles ahead: members of a class can wait for the GPU when their first
    member's result rules the class out. The GPU sandbox is held while one waits, and the
    search takes them off its queue unmeasured, told to the study like ruled-out proposals."""
    from tests.test_budget import PROBLEM
    from tuner.budget import Budget
    from tuner.sandbox import CandidateResult
    from tuner.search import ProblemSearch, SearchSettings, make_target, pool
    from tuner.search.storage import open_storage
    from tuner.store import Store
    from variants import load_family

    url = f"sqlite:///{tmp_path}/a.db"
    target = make_target("h200", {FAMILY: load_family(FAMILY)})
    store = Store(url)
    store.record_device(target.device_id, target.fingerprint)
    search = ProblemSearch(PROBLEM, [FAMILY], target, store, open_storage(url),
                           SearchSettings(trials=8, budget=Budget(max_error=float(BETWEEN))))
    cands = []
    while len(cands) < 8:
        cand = search.proposer.next(search.records.stored(), {c.hash for c in cands})
        if cand is None:
            break
        cands.append(cand)
    default = cands[0]
    assert default.config["k_smoothing"] == "off"
    off = next(c for c in cands[1:] if c.config["k_smoothing"] == "off")
    mean = next(c for c in cands[1:] if c.config["k_smoothing"] == "mean")
    over = CandidateResult(Outcome.TOO_INACCURATE, "over",
                           accuracy={"e2e_error": 2 * RULE_OUT_FACTOR * float(BETWEEN)})

    class Gpu:  # the GPU sandbox returns the default's result, then takes what it is fed
        busy, got, deadline = True, [], float("inf")

        def submit(self, task, payload):
            self.busy = True
            self.got.append(payload[0])

    pipeline = pool.Pipeline(compile_jobs=1)  # started on first use: nothing starts here
    real_gpu, pipeline.gpu = pipeline.gpu, Gpu()
    default.compile_result = CandidateResult(Outcome.OK, "")
    real_poll = pool.poll
    try:
        def poll(busy, timeout):  # the GPU sandbox is done with the default: idle
            pipeline.gpu.busy = False
            return [(pipeline.gpu, ((default, None), over))]

        pool.poll = poll
        pipeline.ready.extend([(off, search._task(off)), (mean, search._task(mean))])
        ((cand, result),) = pipeline.step()
        assert pipeline.gpu.got == []  # held: an over-budget result, a member of its class queued
        stored = search.records.stored()
        record = search._finish(cand, result)
        stored[record.config_hash] = record
        search._discard_ruled_out(pipeline, stored)
        assert [c for c, _ in pipeline.ready] == [mean]
        pipeline._feed_gpu()
        assert pipeline.gpu.got == [mean]
    finally:
        pool.poll = real_poll
        pipeline.ready.clear()
        pipeline.gpu = real_gpu
        pipeline.close()
    assert search.proposer.ruled_out_proposals == 1
    assert off.hash not in search.records.stored()  # never stored
    trial = search.study.get_trials()[off.trial.number]
    assert trial.user_attrs["ruled_out_by"] == default.hash
    assert trial.value == FAILED_VALUE_MS
