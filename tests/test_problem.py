import pytest

from tuner.errors import TunerError
from tuner.problem import Problem


def test_key_is_stable_and_round_trips():
    p = Problem(1, 56, 30272)
    assert p.key() == "b1-h56-s30272-d128-full"
    assert Problem.from_key(p.key()) == p
    assert hash(p) == hash(Problem(1, 56, 30272, 128, False))


def test_flops_match_the_fa_convention():
    p = Problem(1, 56, 30272)
    assert p.flops == 4 * 56 * 30272**2 * 128
    # 32.1 ms is what cuDNN FP8 took on the H200: 818 TFLOP/s in the device README.
    assert p.tflops(32.1) == pytest.approx(818, rel=0.01)


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        (dict(batch=0, heads=1, seq_len=8), "batch must be >= 1"),
        (dict(batch=1, heads=0, seq_len=8), "heads must be >= 1"),
        (dict(batch=1, heads=1, seq_len=0), "seq_len must be >= 1"),
        (dict(batch=1, heads=1, seq_len=8, head_dim=96), "head_dim 96 is not supported"),
        (dict(batch=1, heads=1, seq_len=8, causal=True), "causal attention is not implemented"),
        (dict(batch=1.0, heads=1, seq_len=8), "batch must be an int"),
        (dict(batch=True, heads=1, seq_len=8), "batch must be an int"),
    ],
)
def test_invalid_problems_say_what_is_wrong(kwargs, fragment):
    with pytest.raises(TunerError, match=fragment):
        Problem(**kwargs)


def test_malformed_key():
    with pytest.raises(TunerError, match="malformed problem key"):
        Problem.from_key("nonsense")
