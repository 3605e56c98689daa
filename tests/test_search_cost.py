"""A search ranks what the caller pays: kernel plus prepare, wherever the config moves
work between them (wgmma's v_layout=kernel transposes V in the kernel instead of in prepare)."""

from tuner.outcomes import Outcome
from tuner.search.cost import caller_ms, record_cost
from tuner.search.decision import _fastest_first, pick_winner
from tuner.store import TrialRecord


def _trial(name: str, kernel_ms: float, prepare_ms: float | None, iqr_ms: float = 0.001):
    return TrialRecord(id=None, device_id="d", problem_key="p", family_set="f", family="fam",
                       config={"name": name}, config_hash=name, outcome=Outcome.OK,
                       median_ms=kernel_ms, prepare_ms=prepare_ms, iqr_ms=iqr_ms)


def test_a_faster_kernel_behind_a_slower_prepare_does_not_win():
    moves_work_to_prepare = _trial("prepared-v", 1.00, 0.30)
    transposes_in_kernel = _trial("kernel-v", 1.05, 0.10)
    ranked = _fastest_first([moves_work_to_prepare, transposes_in_kernel])
    assert [r.config_hash for r in ranked] == ["kernel-v", "prepared-v"]
    winner, kept = pick_winner(ranked, default=moves_work_to_prepare)
    assert winner is transposes_in_kernel and not kept


def test_the_spread_rule_compares_what_the_caller_pays():
    default = _trial("default", 1.00, 0.20, iqr_ms=0.05)
    # Its kernel is 0.1 ms faster, its prepare 0.08 ms slower: a lead of 0.02 ms, inside the
    # default's spread, so the default stays (by the kernel alone it would have lost).
    challenger = _trial("challenger", 0.90, 0.28, iqr_ms=0.01)
    winner, kept = pick_winner(_fastest_first([challenger, default]), default=default)
    assert winner is default and kept


def test_cost_of_a_trial_without_a_prepare_time_is_its_kernel():
    assert caller_ms(None, 0.2) is None
    assert caller_ms(1.5, None) == 1.5
    assert record_cost(_trial("a", 1.0, 0.25)) == 1.25
