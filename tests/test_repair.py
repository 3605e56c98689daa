"""An infeasible or ruled-out proposal is replaced by the nearest usable config (tuner/search/
repair.py): feasible, the fewest knobs away from the proposal, not yet taken and of no ruled-out
class, enqueued as the next trial with the proposal's number as `repair_of`."""

from __future__ import annotations

import json

import optuna

from tests.doubles import fake_family_accuracy, fake_family_large
from tests.test_search import BASE, LARGE, LARGE_SEARCH
from tuner import gpus
from tuner.cli import main
from tuner.problem import Problem
from tuner.search.accuracy_classes import accuracy_class
from tuner.search.proposal import Space
from tuner.search.repair import Repairer
from tuner.store import config_hash

PROBLEM = Problem(1, 64, 2, 64)
H200 = gpus.PROFILES["h200"]


def _distance(a: dict, b: dict) -> int:
    return sum(a[k] != b[k] for k in a)


def test_the_nearest_feasible_config_differs_in_the_fewest_knobs_and_is_not_taken():
    space = Space.build({LARGE: fake_family_large}, PROBLEM, H200, exhaustive_up_to=0)
    repairer = Repairer(space, seed=3)
    wanted = {"tile": 128, "stages": 8, "warps": 4, "swizzle": True}  # 1024 > 256: infeasible
    feasible = [c for _, c in space.feasible]
    assert wanted not in feasible
    best = min(_distance(wanted, c) for c in feasible)
    near = repairer.nearest(LARGE, wanted, 7, taken=(), ruled_out={})
    assert near in feasible and _distance(wanted, near) == best == 1
    # Taken configs are passed over, down to none at all.
    taken = {config_hash(LARGE, near)}
    again = repairer.nearest(LARGE, wanted, 7, taken=taken, ruled_out={})
    assert again != near and again in feasible and _distance(wanted, again) >= best
    everything = {config_hash(LARGE, c) for c in feasible}
    assert repairer.nearest(LARGE, wanted, 7, taken=everything, ruled_out={}) is None
    # Ties go the same way for the same seed and trial number.
    assert Repairer(space, seed=3).nearest(LARGE, wanted, 7, (), {}) == near


def test_a_ruled_out_class_is_never_the_repair():
    family = "tests.doubles.fake_family_accuracy"
    space = Space.build({family: fake_family_accuracy}, PROBLEM, H200, exhaustive_up_to=0)
    off = {"tile": 32, "k_smoothing": "off"}
    ruled_out = {accuracy_class(family, off): "h"}
    near = Repairer(space, seed=0).nearest(family, off, 1, taken=(), ruled_out=ruled_out)
    assert near == {"tile": 32, "k_smoothing": "mean"}


def test_each_infeasible_proposal_of_a_tpe_search_is_followed_by_its_repair(tmp_path, capsys):
    db = tmp_path / "db.sqlite"
    assert main([*BASE, *LARGE_SEARCH, "--trials", "16", "--seed", "6",
                 "--db", f"sqlite:///{db}"]) == 0
    (result,) = json.loads(capsys.readouterr().out)["results"]
    assert result["mode"] == "tpe"
    study = optuna.load_study(study_name=result["study"], storage=f"sqlite:///{db}")
    space = Space.build({LARGE: fake_family_large}, PROBLEM, H200, exhaustive_up_to=0)
    feasible = [c for _, c in space.feasible]

    def config(trial) -> dict:
        return {k.rsplit(".", 1)[1]: v for k, v in trial.params.items() if k != "family"}

    infeasible = [t for t in study.trials if t.user_attrs.get("outcome") == "infeasible"]
    repairs = {t.user_attrs["repair_of"]: t for t in study.trials if "repair_of" in t.user_attrs}
    assert infeasible and len(repairs) == len(infeasible)
    for t in infeasible:
        repair = repairs[t.number]
        # Asked right after (the next trial but for a baseline enqueued before it), feasible,
        # and measured like any other proposal.
        assert t.number < repair.number <= t.number + 2 and config(repair) in feasible
        assert repair.user_attrs["outcome"] != "infeasible"
