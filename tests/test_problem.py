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
        (dict(batch=1, heads=1, seq_len=8, causal=1), "causal must be a bool"),
        (dict(batch=1, heads=8, seq_len=8, kv_heads=3), "kv_heads=3 does not divide heads=8"),
        (dict(batch=1, heads=8, seq_len=8, kv_heads=16), "kv_heads=16 does not divide heads=8"),
        (dict(batch=1, heads=8, seq_len=8, kv_heads=0), "kv_heads must be >= 1"),
        (dict(batch=1, heads=8, seq_len=8, seq_len_kv=0), "seq_len_kv must be >= 1"),
        (dict(batch=1, heads=8, seq_len=8, seq_len_kv=2**30 + 1), "seq_len_kv must be <= "),
        (dict(batch=1, heads=8, seq_len=8, seq_len_kv=8.0), "seq_len_kv must be an int"),
        (dict(batch=1.0, heads=1, seq_len=8), "batch must be an int"),
        (dict(batch=True, heads=1, seq_len=8), "batch must be an int"),
    ],
)
def test_invalid_problems_say_what_is_wrong(kwargs, fragment):
    with pytest.raises(TunerError, match=fragment):
        Problem(**kwargs)


@pytest.mark.parametrize("key", ["nonsense", "b1-h56-s4096-d128", "b1-h56-s4096-d128-full-kv",
                                 "b1-h32-s8192-d128-causal-kv512-kvh8", "b1-h8-s64-d128-full-x2"])
def test_malformed_key(key):
    with pytest.raises(TunerError, match="malformed problem key"):
        Problem.from_key(key)


@pytest.mark.parametrize("key, canonical", [
    ("b1-h56-s4096-d128-full-kvh56", "b1-h56-s4096-d128-full"),  # kv_heads == heads
    ("b1-h56-s4096-d128-full-kv4096", "b1-h56-s4096-d128-full"),  # seq_len_kv == seq_len
    ("b01-h56-s4096-d128-full", "b1-h56-s4096-d128-full"),
])
def test_a_key_not_in_canonical_form_is_refused(key, canonical):
    # One problem, one key: another spelling would be another row in the database.
    with pytest.raises(TunerError, match=f"not in canonical form; it is written '{canonical}'"):
        Problem.from_key(key)


def test_defaults_resolve_so_equal_problems_are_equal():
    p = Problem(1, 8, 64)
    assert (p.seq_len_kv, p.kv_heads, p.group, p.seq_len_q) == (64, 8, 1, 64)
    assert p == Problem(1, 8, 64, 128, False, 64, 8) and hash(p) == hash(Problem(1, 8, 64, 128,
                                                                                 False, 64, 8))
    assert p.to_dict() == dict(batch=1, heads=8, seq_len=64, head_dim=128, causal=False,
                               seq_len_kv=64, kv_heads=8)
    # A dict written before the new fields existed (an old table, a sandbox task) still builds.
    assert Problem(**dict(batch=1, heads=8, seq_len=64, head_dim=128, causal=False)) == p
    assert Problem(**p.to_dict()) == p


@pytest.mark.parametrize("problem, key", [
    (Problem(1, 56, 4096), "b1-h56-s4096-d128-full"),  # the key every old database holds
    (Problem(2, 24, 4608, 64), "b2-h24-s4608-d64-full"),
    (Problem(1, 56, 8192, causal=True), "b1-h56-s8192-d128-causal"),
    (Problem(1, 32, 8192, causal=True, kv_heads=8), "b1-h32-s8192-d128-causal-kvh8"),
    (Problem(1, 40, 75600, seq_len_kv=512), "b1-h40-s75600-d128-full-kv512"),
    (Problem(2, 32, 77, 64, True, 1000, 4), "b2-h32-s77-d64-causal-kvh4-kv1000"),
    (Problem(65535, 65535, 2**30, 128, True, 2**30 - 1, 5),
     "b65535-h65535-s1073741824-d128-causal-kvh5-kv1073741823"),
])
def test_keys_of_every_kind_round_trip(problem, key):
    assert problem.key() == key
    assert Problem.from_key(key) == problem
    assert len(key) <= 64  # the database's key column is String(64)


def test_causal_flops_count_the_visible_region():
    full = Problem(1, 56, 8192)
    causal = Problem(1, 56, 8192, causal=True)
    assert causal.flops == full.flops / 2  # FA's convention at equal lengths, exactly
    # The FA3 measurement: 1.005 ms for causal S=8192 H=56 is 957 TFLOP/s.
    assert causal.tflops(1.005) == pytest.approx(957, abs=1)
    cross = Problem(2, 24, 4608, seq_len_kv=512)
    assert cross.flops == 4 * 2 * 24 * 4608 * 512 * 128


@pytest.mark.parametrize("sq, skv", [(1, 1), (5, 5), (3, 10), (10, 3), (77, 16), (16, 77),
                                     (128, 4096), (4096, 128)])
def test_causal_pairs_are_the_discrete_count_less_half_the_diagonal(sq, skv):
    # Query i sees keys j <= i + skv - sq (bottom-right aligned), counted one by one.
    discrete = sum(max(0, min(skv, i + skv - sq + 1)) for i in range(sq))
    p = Problem(1, 1, sq, causal=True, seq_len_kv=skv)
    assert p.visible_pairs == discrete - min(sq, skv) / 2
    assert Problem(1, 1, sq, seq_len_kv=skv).visible_pairs == sq * skv
