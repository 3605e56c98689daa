"""The correctness gate on the CPU: its structured inputs have the structure they promise, and
every planted bug (tests/doubles/planted.py around the CPU fake family) is rejected, by the check
that exists for it, directly and in a real `tuner search`."""

from __future__ import annotations

import json

import pytest
import torch

from tests.doubles import ANY_ACCURACY, planted_fake
from tests.doubles.planted import BUGS, expected_check
from tuner.cli import main
from tuner.gate import EDGE_ROWS, case_inputs, checked_rows, gate_cases, validate_kernel
from tuner.problem import Problem

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("seq_len", [1, 64, 77, 4096])
def test_cases_are_ragged_and_have_two_batches_and_heads(seq_len):
    random, structured = gate_cases(Problem(1, 1, seq_len, 64))
    assert (random.batch, random.heads, random.seq_len) == (1, 1, seq_len)
    assert structured.seq_len % 2 == 1 and structured.seq_len - seq_len in (0, 1)
    assert structured.batch >= 2 and structured.heads >= 2


def _probabilities(q, k, head):
    qf, kf = q[:, :, head].float(), k[:, :, head].float()
    return torch.softmax(qf @ kf.transpose(-1, -2) * q.shape[-1] ** -0.5, dim=-1)


def test_structured_inputs_are_peaked_sunk_and_have_an_outlier_head():
    case = gate_cases(Problem(1, 3, 1000, 128))[1]
    q, k, v = case_inputs(case, 128, "cpu", seed=5)
    p = _probabilities(q, k, head=0)
    # Batch 0: query i is dominated by key L-1-i.
    diagonal = p[0][torch.arange(case.seq_len), torch.arange(case.seq_len).flip(0)]
    assert float(diagonal.median()) > 0.8 and int(p[0].argmax(-1)[0]) == case.seq_len - 1
    # Batch 1: key 0 is a sink for every query.
    assert float(p[1][:, 0].median()) > 0.15 and float((p[1].argmax(-1) == 0).float().mean()) > 0.9
    # The last head: 1000x the amax of q and v, logits unchanged.
    assert float(q[..., -1, :].abs().amax() / q[..., 0, :].abs().amax()) > 300
    assert float(v[..., -1, :].abs().amax() / v[..., 0, :].abs().amax()) > 300
    outlier = _probabilities(q, k, head=-1)
    scaled = _probabilities(q[..., -1:, :] / 1000, k[..., -1:, :] * 1000, head=0)
    torch.testing.assert_close(outlier, scaled, atol=2e-2, rtol=0)


@pytest.mark.parametrize("which", [0, 1])
def test_long_sequences_check_both_ends_whole_and_every_tile(which):
    case = gate_cases(Problem(1, 2, 30272))[which]
    rows = checked_rows(case, "cpu", seed=7)
    assert rows is not None and 1000 < rows.numel() < 2000 and len(set(rows.tolist())) == len(rows)
    got = set(rows.tolist())
    assert set(range(EDGE_ROWS)) <= got
    assert set(range(case.seq_len - EDGE_ROWS, case.seq_len)) <= got
    # Every 64-row query tile holds a checked row; another seed checks other rows.
    assert all(got & set(range(t, min(t + 64, case.seq_len))) for t in range(0, case.seq_len, 64))
    assert set(checked_rows(case, "cpu", seed=8).tolist()) != got
    assert checked_rows(gate_cases(Problem(1, 2, 8192))[0], "cpu") is None  # short: every row


@pytest.mark.parametrize("seq_len", [64, 77])
@pytest.mark.parametrize("bug", list(BUGS))
def test_every_planted_bug_is_rejected_by_its_check(bug, seq_len):
    problem = Problem(1, 2, seq_len, 64)
    kernel = planted_fake.compile(planted_fake.Config(bug), problem, "cpu")
    report = validate_kernel(kernel, problem, "cpu", seed=seq_len)
    if BUGS[bug] is None:
        assert report.passed, report.reason
        assert [c["case"] for c in report.cases] == ["random", "structured"]
        assert report.rel_rms is not None and report.rel_rms < 0.01
    else:
        assert not report.passed and expected_check(bug, problem) in report.reason, report.reason


def test_a_search_stores_every_planted_bug_as_a_wrong_result_with_its_check(tmp_path, capsys):
    db = f"sqlite:///{tmp_path / 'planted.sqlite'}"
    args = ["search", "--gpu", "h200", "--families", "tests.doubles.planted_fake", "--seq-lens",
            "77", "--heads", "2", "--head-dim", "64", "--repeats", "10", "--compile-jobs", "1",
            "--trials", "20", "--db", db, "--json", *ANY_ACCURACY]
    assert main(args) == 0
    (result,) = json.loads(capsys.readouterr().out)["results"]
    assert result["winner"]["config"] == {"bug": "none"}
    assert main(["show", "--gpu", "h200", "--db", db, "--trials", "77", "--json"]) == 0
    (problem,) = json.loads(capsys.readouterr().out)
    seen = {}
    for trial in problem["trials"]:
        if trial["config"]["bug"] != "none":
            seen[trial["config"]["bug"]] = (trial["outcome"], trial["message"])
    assert set(seen) == set(BUGS) - {"none"}
    for bug, (outcome, message) in seen.items():
        check = expected_check(bug, Problem(1, 2, 77, 64))
        assert outcome == "wrong_result" and check in message, (bug, message)
