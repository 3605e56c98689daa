"""The correctness gate on the CPU: its structured inputs have the structure they promise, and
every planted bug (tests/doubles/planted.py around the CPU fake family, and around the folded
family that has prepare's transforms) is rejected, by the check that exists for it, directly and
in a real `tuner search`."""

from __future__ import annotations

import importlib
import json

import pytest
import torch

from tests.doubles import ANY_ACCURACY
from tests.doubles.planted import BUGS, KNOBS, expected_check
from tuner.cli import main
from tuner.gate import EDGE_ROWS, case_inputs, checked_rows, gate_cases, validate_kernel
from tuner.problem import Problem

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("seq_len", [1, 64, 77, 4096])
def test_cases_are_ragged_and_have_two_batches_and_heads(seq_len):
    random, structured, realistic = gate_cases(Problem(1, 1, seq_len, 64))
    assert (random.batch, random.heads, random.seq_len) == (1, 1, seq_len)
    assert structured.seq_len % 2 == 1 and structured.seq_len - seq_len in (0, 1)
    assert structured.batch >= 2 and structured.heads >= 2
    # The realistic case: the structured case's small shape, tuner.activations' kind.
    shape = ("batch", "heads", "seq_len", "seq_len_kv", "kv_heads", "causal")
    assert [getattr(realistic, f) for f in shape] == [getattr(structured, f) for f in shape]
    assert realistic.activations == "realistic" and not realistic.structured
    # Every argument the runtime passes a kernel at a default and at another value.
    assert {c.scale_factor for c in (random, structured, realistic)} == {1.0, 0.7}
    assert {c.want_lse for c in (random, structured, realistic)} == {True, False}
    assert {c.fp16 for c in (random, structured, realistic)} == {True, False}


def _probabilities(q, k, head, scale):
    qf, kf = q[:, :, head].float(), k[:, :, head].float()
    return torch.softmax(qf @ kf.transpose(-1, -2) * scale, dim=-1)


def test_structured_inputs_are_peaked_sunk_and_have_an_outlier_head():
    case = gate_cases(Problem(1, 3, 1000, 128))[1]
    q, k, v = case_inputs(case, 128, "cpu", seed=5)
    # At the softmax scale the case passes the kernel (not the default one).
    scale = case.softmax_scale(128)
    assert scale == pytest.approx(0.7 * 128**-0.5)
    p = _probabilities(q, k, 0, scale)
    # Batch 0: query i is dominated by key L-1-i.
    diagonal = p[0][torch.arange(case.seq_len), torch.arange(case.seq_len).flip(0)]
    assert float(diagonal.median()) > 0.8 and int(p[0].argmax(-1)[0]) == case.seq_len - 1
    # Batch 1: key 0 is a sink for every query.
    assert float(p[1][:, 0].median()) > 0.15 and float((p[1].argmax(-1) == 0).float().mean()) > 0.9
    # The last head: 1000x the amax of q and v, logits unchanged.
    assert float(q[..., -1, :].abs().amax() / q[..., 0, :].abs().amax()) > 300
    assert float(v[..., -1, :].abs().amax() / v[..., 0, :].abs().amax()) > 300
    outlier = _probabilities(q, k, -1, scale)
    scaled = _probabilities(q[..., -1:, :] / 1000, k[..., -1:, :] * 1000, 0, scale)
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


PLANTED_PROBLEMS = [Problem(1, 2, 64, 64), Problem(1, 2, 77, 64),
                    # causal, grouped KV heads, queries outnumbering keys
                    Problem(2, 4, 70, 64, True, 50, 2)]


@pytest.mark.parametrize("problem", PLANTED_PROBLEMS, ids=lambda p: p.key())
@pytest.mark.parametrize("bug", list(BUGS))
@pytest.mark.parametrize("family", ["planted_fake", "planted_folded"])
def test_every_planted_bug_is_rejected_by_its_check(family, bug, problem):
    from tests.doubles.planted import APPLIES

    module = importlib.import_module(f"tests.doubles.{family}")
    cfg = module.Config(bug)
    ok, reason = module.can_implement(cfg, problem, None)
    if not ok:  # the fake family has no prepare-only knobs to plant a transform bug in
        assert family == "planted_fake" and bug in KNOBS, reason
        pytest.skip(reason)
    if bug in APPLIES and not APPLIES[bug](problem):
        pytest.skip(f"{bug} needs a problem with that feature")
    if problem.causal and family == "planted_fake":
        pytest.skip("the fake family's kernel has no mask")
    kernel = module.compile(cfg, problem, "cpu")
    report = validate_kernel(kernel, problem, "cpu", seed=problem.seq_len)
    if BUGS[bug] is None:
        assert report.passed, report.reason
        assert [c["case"] for c in report.cases] == ["random", "structured", "realistic"]
        # The fake kernel is the fp32 reference itself; the folded one rounds P as the GPU does.
        assert report.rel_rms is not None and report.rel_rms < (0.01 if family == "planted_fake"
                                                                else 0.04)
    else:
        assert not report.passed and expected_check(bug, problem) in report.reason, report.reason


def test_a_search_stores_every_planted_bug_as_a_wrong_result_with_its_check(tmp_path, capsys):
    db = f"sqlite:///{tmp_path / 'planted.sqlite'}"
    args = ["search", "--gpu", "h200", "--families", "tests.doubles.planted_folded", "--seq-lens",
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
