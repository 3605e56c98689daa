"""`tuner search` and `tuner bench` with --kv-len, --kv-heads and --causal: the Problems they
build, bad values named before a GPU is looked for, and a causal search end to end on the CPU
fake family (whose kernel is not causal: the gate must reject every candidate)."""

import json

import pytest

from tuner.cli import build_parser, main
from tuner.commands._args import problems_from_args
from tuner.problem import Problem


@pytest.mark.parametrize("command", ["search", "bench"])
def test_the_flags_build_the_problems(command):
    args = build_parser().parse_args([command, "--seq-lens", "4096,75600", "--heads", "40",
                                      "--kv-heads", "8", "--kv-len", "512", "--causal",
                                      "--batch", "2", "--head-dim", "64"])
    assert problems_from_args(args) == [Problem(2, 40, 4096, 64, True, 512, 8),
                                        Problem(2, 40, 75600, 64, True, 512, 8)]
    plain = build_parser().parse_args([command, "--seq-lens", "4096", "--heads", "8"])
    assert problems_from_args(plain) == [Problem(1, 8, 4096)]
    assert problems_from_args(plain)[0].key() == "b1-h8-s4096-d128-full"


@pytest.mark.parametrize("command", ["search", "bench"])
@pytest.mark.parametrize("args, message", [
    (["--kv-heads", "7"], "--kv-heads 7 does not divide --heads 32: each key/value head serves "
     "a whole group of query heads; pick one of 1, 2, 4, 8, 16, 32"),
    (["--kv-heads", "64"], "--kv-heads 64 does not divide --heads 32"),
])
def test_a_kv_head_count_that_does_not_divide_is_named_before_a_gpu(command, args, message,
                                                                    capsys):
    assert main([command, "--seq-lens", "4096", "--heads", "32", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "GPU" not in err, err


@pytest.mark.parametrize("command", ["search", "bench"])
@pytest.mark.parametrize("flag, value, message", [
    ("--kv-len", "0", "must be >= 1, got 0"),
    ("--kv-len", str(2**31), "must be <= 1073741824"),
    ("--kv-heads", "-2", "must be >= 1, got -2"),
    ("--kv-heads", "eight", "expected an integer, got 'eight'"),
])
def test_bad_values_are_named_by_their_option(command, flag, value, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([command, "--seq-lens", "4096", "--heads", "32", flag, value])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1
    assert f"argument {flag}" in err and message in err, err


@pytest.mark.parametrize("command", ["search", "bench", "show", "export", "space"])
def test_every_command_documents_the_flags(command):
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices[command]
    helps = {o: a.help for a in sub._actions for o in a.option_strings}
    for flag in ("--kv-len", "--kv-heads", "--causal"):
        assert helps.get(flag), f"{command} {flag} has no help"


def test_space_judges_the_problem_the_flags_build(capsys):
    """`tuner space` checks can_implement against the shaped problem: the causal GQA problem is
    feasible for the family, and a KV head count that does not divide is named."""
    assert main(["space", "--gpu", "h200", "--family", "mma_sync", "--heads", "32", "--kv-heads",
                 "8", "--kv-len", "512", "--causal", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["problem"] == Problem(1, 32, 4096, 128, True, 512, 8).to_dict()
    assert out["summary"]["feasible"] > 0
    assert main(["space", "--gpu", "h200", "--heads", "32", "--kv-heads", "7"]) == 2
    assert "--kv-heads 7 does not divide --heads 32" in capsys.readouterr().err


def test_a_causal_search_stores_its_problem_and_rejects_a_non_causal_kernel(tmp_path, capsys):
    db = f"sqlite:///{tmp_path / 'causal.sqlite'}"
    args = ["search", "--gpu", "h200", "--families", "tests.doubles.fake_family", "--seq-lens",
            "64", "--heads", "2", "--head-dim", "64", "--causal", "--repeats", "10",
            "--compile-jobs", "1", "--trials", "3", "--patience", "0", "--db", db, "--json",
            # The fake family plants a hanging config: a sampler that draws it must not hold
            # the test for the default 600 s candidate timeout.
            "--seed", "0", "--timeout", "20"]
    assert main(args) == 0
    (result,) = json.loads(capsys.readouterr().out)["results"]
    assert result["problem"] == "b1-h2-s64-d64-causal"
    # The fake kernel computes unmasked attention: right for no causal problem.
    assert result["winner"] is None and result["outcomes"].get("wrong_result", 0) >= 1
    from tuner.store import Store

    store = Store(db, readonly=True)
    try:
        trials = store.trials(Problem(1, 2, 64, 64, causal=True))
        assert trials and all(t.outcome != "ok" for t in trials if t.role != "bench")
    finally:
        store.close()
