"""A measured member far over the accuracy budget rules out its accuracy class
(tuner/search/accuracy_classes.py): the search proposes none of the class again, tells the study
each such proposal with the member that ruled it out, stores none, and counts the class's configs
as covered when it decides the space is exhausted."""

from __future__ import annotations

import json
from collections import deque

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
                        ("pv_dtype", "bf16"), ("qk_dtype", "int8")):
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


class _Pipeline:
    """The search loop's pipeline (tuner/search/pool.py) without processes: a compile takes
    two steps, the GPU returns `result(cand)` in the step after it was fed, and compiles can
    land beside a GPU result, as they do in poll(); the caller feeds, as with the real one."""

    def __init__(self, result):
        self.result, self.ready, self.compiling = result, deque(), []
        self.gpu, self.measured = None, []

    def in_flight(self):
        return [c for c, _ in self.compiling] + [c for c, _ in self.ready] + \
            ([self.gpu] if self.gpu else [])

    def has_room(self):
        return len(self.compiling) + len(self.ready) < 4

    def compile(self, cand, task):
        self.compiling.append((cand, 2))

    def feed(self):
        if self.gpu is None and self.ready:
            first = min(self.ready, key=lambda item: item[0].trial.number)
            self.ready.remove(first)
            self.gpu = first[0]

    def step(self):
        finished = []
        if self.gpu is not None:
            self.measured.append(self.gpu)
            finished.append((self.gpu, self.result(self.gpu)))
            self.gpu = None
        left = [(c, n - 1) for c, n in self.compiling]
        self.ready.extend((c, None) for c, n in left if n == 0)
        self.compiling = [(c, n) for c, n in left if n > 0]
        return finished

    def discard(self, drop):
        gone = [c for c, _ in self.ready if drop(c)]
        self.ready = deque(item for item in self.ready if not drop(item[0]))
        return gone


def test_members_of_a_class_ruled_out_while_compiling_never_reach_the_gpu(tmp_path):
    """The pipeline compiles ahead: members of a class can be compiled, or finish compiling,
    after their class's first member came back far over the budget. The search takes them off
    the GPU's queue before it feeds the GPU, told to the study like ruled-out proposals."""
    from tests.test_budget import PROBLEM
    from tuner.budget import Budget
    from tuner.sandbox import CandidateResult
    from tuner.search import ProblemSearch, SearchSettings, make_target
    from tuner.search.storage import open_storage
    from tuner.store import Store
    from variants import load_family

    url = f"sqlite:///{tmp_path}/a.db"
    target = make_target("h200", {FAMILY: load_family(FAMILY)})
    store = Store(url)
    store.record_device(target.device_id, target.fingerprint)
    search = ProblemSearch(PROBLEM, [FAMILY], target, store, open_storage(url),
                           SearchSettings(trials=8, patience=None,
                                          budget=Budget(max_error=float(BETWEEN))))
    far = 2 * RULE_OUT_FACTOR * float(BETWEEN)

    def result(cand):
        if cand.config["k_smoothing"] == "off":
            return CandidateResult(Outcome.TOO_INACCURATE, "over", accuracy={"e2e_error": far})
        return CandidateResult(Outcome.OK, "", timing={"median_ms": cand.config["tile"] / 64,
                                                       "prepare_ms": 0.0})

    pipeline = _Pipeline(result)
    assert search._search(pipeline) == "space exhausted"
    offs = [c for c in pipeline.measured if c.config["k_smoothing"] == "off"]
    assert [c.role for c in offs] == ["default"]  # the class's first member only
    assert sorted(c.config["tile"] for c in pipeline.measured if c not in offs) == \
        [16, 32, 64, 128]
    discarded = [t for t in search.study.get_trials() if "ruled_out_by" in t.user_attrs]
    assert discarded and search.proposer.ruled_out_proposals == len(discarded)
    assert all(t.user_attrs["ruled_out_by"] == offs[0].hash and t.value == FAILED_VALUE_MS
               for t in discarded)
    assert all(t.config["k_smoothing"] == "mean" or t.role == "default"
               for t in search.records.stored().values())  # none of them stored
