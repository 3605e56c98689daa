"""The runtime lookup over causal, cross-attention and grouped-KV-head winners (the rules of
tuner/runtime.py's docstring), and the fallback across head counts: the nearest tuned
problem by work, logged with its own source, before the default."""

import logging

import pytest

from tests.test_runtime import ALT_CFG, SEED_CFG
from tuner import runtime
from tuner.errors import TunerError
from tuner.gpus import PROFILES
from tuner.problem import Problem
from variants import mma_sync

# The runtime tests' pretend device and configs (tests/test_runtime.py), and one more.
A, B = SEED_CFG, ALT_CFG
C = mma_sync.Config(block_m=64, block_n=64, warps=4, rows_per_warp=16, kv_stages=2,
                    p_source="registers", swizzle="bank_period", q_in_registers=False, mma="fp8")


def test_causal_never_takes_a_non_causal_winner_nor_the_other_way(lookup):
    add, _, best, _ = lookup
    full, causal = Problem(1, 56, 8192), Problem(1, 56, 2048, causal=True)
    add(full, A)
    add(causal, B)
    assert best(Problem(1, 56, 8192, causal=True)) == ("db-nearest", causal, B)
    assert best(Problem(1, 56, 2048)) == ("db-nearest", full, A)
    # Nothing causal tuned at all: the default, not the exact non-causal winner.
    lone = Problem(1, 56, 8192, 64)
    add(lone, A)
    assert best(Problem(1, 56, 8192, 64, causal=True))[0] == "default"
    # ... also across head counts.
    assert best(Problem(1, 8, 8192, 64, causal=True))[0] == "default"


def test_the_same_group_size_comes_before_the_nearer_length(lookup):
    add, _, best, _ = lookup
    gqa, mha = Problem(1, 32, 4096, kv_heads=8), Problem(1, 32, 8192)
    add(gqa, A)
    add(mha, B)
    assert best(Problem(1, 32, 8192, kv_heads=8)) == ("db-nearest", gqa, A)
    assert best(Problem(1, 32, 4096)) == ("db-nearest", mha, B)
    assert best(Problem(1, 32, 4096, kv_heads=8)) == ("db-exact", gqa, A)
    # Another group size still beats nothing: group 2 takes the nearest of the others.
    assert best(Problem(1, 32, 8192, kv_heads=16))[1] == mha


def test_cross_attention_prefers_its_kind_then_its_kv_length_then_the_nearest(lookup):
    add, _, best, _ = lookup
    self_long = Problem(1, 40, 75600)
    cross_512 = Problem(2, 40, 4608, seq_len_kv=512)
    cross_1024 = Problem(1, 40, 75600, seq_len_kv=1024)
    cross_2048 = Problem(1, 40, 75600, seq_len_kv=2048)
    add(self_long, A)
    add(cross_512, B)
    add(cross_1024, C)
    add(cross_2048, B)
    # The same key/value length beats a query length 16x nearer.
    assert best(Problem(1, 40, 75600, seq_len_kv=512)) == ("db-nearest", cross_512, B)
    # No winner with 600 keys: nearest in both lengths, 1 x 1024/600 < 75600/4608 x 600/512,
    # and < 1 x 2048/600 (the same query length, farther key/value length).
    assert best(Problem(1, 40, 75600, seq_len_kv=600)) == ("db-nearest", cross_1024, C)
    # Self-attention takes self-attention, though a cross winner is nearer in both lengths
    # (4608 x 512: 1 x 9; 75600: 16.4 x 16.4).
    assert best(Problem(1, 40, 4608)) == ("db-nearest", self_long, A)
    assert best(Problem(1, 40, 75600)) == ("db-exact", self_long, A)
    assert best(Problem(1, 40, 30000)) == ("db-nearest", self_long, A)
    assert best(Problem(1, 40, 4608, seq_len_kv=512))[0] == "db-exact"


def test_a_cross_problem_without_cross_winners_takes_the_nearest_self_attention_one(lookup):
    """Rule c counts only cross-attention winners: a self-attention winner whose length equals
    the problem's key/value length is not preferred for it (it is 4.5x off in the query
    length, as far as the query-length one is in the key/value length; the tie goes to the
    longer query)."""
    add, _, best, _ = lookup
    short, long = Problem(2, 24, 1024), Problem(2, 24, 4608)
    add(short, B)
    add(long, A)
    assert best(Problem(2, 24, 4608, seq_len_kv=1024)) == ("db-nearest", long, A)
    # A cross-attention winner with that key/value length still comes first.
    cross = Problem(2, 24, 16384, seq_len_kv=1024)
    add(cross, C)
    assert best(Problem(2, 24, 4608, seq_len_kv=1024)) == ("db-nearest", cross, C)


def test_a_tie_in_both_lengths_goes_to_the_longer_query(lookup):
    add, _, best, _ = lookup
    short, long = Problem(1, 8, 2048, seq_len_kv=256), Problem(1, 8, 8192, seq_len_kv=256)
    add(short, B)
    add(long, A)
    assert best(Problem(1, 8, 4096, seq_len_kv=256)) == ("db-nearest", long, A)


def test_other_heads_take_the_nearest_tuned_problem_by_work(lookup, caplog):
    add, _, best, _ = lookup
    # B=1 S=4096 H=40: 40 x 32 = 1280 query tiles of 128 rows, 4096 keys each.
    short = Problem(4, 32, 1024)  # 4 x 32 x 8 = 1024 tiles (1.25x off) but 4x off in keys: 5
    near = Problem(1, 56, 4096)  # 56 x 32 = 1792 tiles (1.4x off), the same keys: 1.4
    far = Problem(2, 24, 4608)  # 2 x 24 x 36 = 1728 tiles (1.35x), 1.125x in keys: 1.52
    for p, cfg in ((short, B), (near, A), (far, C)):
        add(p, cfg)
    with caplog.at_level(logging.WARNING, logger="tuner.runtime"):
        assert best(Problem(1, 40, 4096)) == ("db-nearest-work", near, A)
    (message,) = [r.getMessage() for r in caplog.records]
    assert "db-nearest-work" in message and "1792 query tiles of 128 rows for 1280" in message
    assert "no winner with 40 heads" in message
    # A winner with the head count comes first, whatever its batch and work.
    assert best(Problem(8, 24, 1024)) == ("db-nearest", far, C)
    # The problem's own batch counts: B=2 S=4096 H=8 has 512 tiles: the B=4 row is 2x off in
    # work and 4x in keys (8), the S=4096 row 3.5x in work only (3.5); B=1 S=1024 H=8 has 64,
    # the B=4 row 16x off in work only (16), the others 27-28x and 4-4.5x in keys.
    assert best(Problem(2, 8, 4096))[1] == near
    assert best(Problem(1, 8, 1024))[1] == short


def test_a_tie_in_work_goes_by_length_then_to_the_longer_query(lookup):
    add, _, best, _ = lookup
    wide, narrow = Problem(1, 32, 512), Problem(1, 2, 2048)  # 128 and 32 query tiles
    add(wide, B)
    add(narrow, A)
    # 64 tiles: both 2x off in work and 2x off in length; the longer query wins.
    assert best(Problem(1, 8, 1024)) == ("db-nearest-work", narrow, A)
    add(Problem(1, 4, 1024), C)  # 32 tiles, 2x off in work, the exact length
    assert best(Problem(1, 8, 1024))[1] == Problem(1, 4, 1024)


def test_work_fallback_keeps_the_mask_and_prefers_the_group(lookup):
    add, _, best, _ = lookup
    add(Problem(1, 56, 1024), A)  # work 448
    add(Problem(1, 56, 2048, causal=True), B)  # work 896
    add(Problem(1, 56, 8192, kv_heads=14), C)  # work 3584, the group of 4
    assert best(Problem(4, 32, 1024, causal=True))[1:] == (Problem(1, 56, 2048, causal=True), B)
    assert best(Problem(4, 32, 1024, kv_heads=8))[1:] == (Problem(1, 56, 8192, kv_heads=14), C)
    # Cross-attention takes cross-attention: 1792 tiles (28x off) before 448 (7x).
    add(Problem(1, 56, 4096, seq_len_kv=512), B)
    assert best(Problem(1, 8, 1024, seq_len_kv=512))[1] == Problem(1, 56, 4096, seq_len_kv=512)


def test_a_table_with_the_head_count_comes_before_the_database_by_work(lookup):
    add, table, best, _ = lookup
    add(Problem(1, 56, 1024), A)
    table((Problem(1, 24, 4096), B), (Problem(1, 56, 1024), C))
    assert best(Problem(2, 24, 4608)) == ("table-nearest", Problem(1, 24, 4096), B)
    # No 8 heads anywhere: the database's nearest by work before the table's.
    assert best(Problem(1, 8, 1024)) == ("db-nearest-work", Problem(1, 56, 1024), A)
    table((Problem(1, 24, 4096), B))
    add(Problem(1, 8, 512, causal=True), C)  # another mask: never
    assert best(Problem(1, 40, 1024))[0] == "db-nearest-work"


def test_load_best_config_takes_the_new_fields(lookup):
    add, _, _, url = lookup
    gqa = Problem(1, 32, 8192, causal=True, kv_heads=8)
    add(gqa, A)
    add(Problem(1, 32, 8192, causal=True), B)
    add(Problem(1, 32, 8192), C)
    found = runtime.load_best_config(8192, heads=32, kv_heads=8, causal=True, db=url,
                                     with_source=True)
    assert (found.source, found.tuned_problem, found.config) == ("db-exact", gqa, A)
    assert runtime.load_best_config(8192, heads=32, causal=True, db=url) == B
    assert runtime.load_best_config(8192, heads=32, db=url) == C
    cross = runtime.load_best_config(8192, heads=32, seq_len_kv=512, db=url, with_source=True)
    assert (cross.source, cross.config) == ("db-nearest", C)
    with pytest.raises(TunerError, match="kv_heads=8 needs heads"):
        runtime.load_best_config(8192, kv_heads=8, causal=True, db=url)


# ---- can_implement's shape rejections reach the caller -------------------------------------------


@pytest.mark.parametrize("problem", [
    Problem(1, 32, 4096, causal=True), Problem(1, 32, 4096, kv_heads=8),
    Problem(1, 40, 75600, seq_len_kv=512), Problem(2, 24, 4608, seq_len_kv=512, causal=True),
    Problem(1, 32, 77, seq_len_kv=1, kv_heads=1, causal=True),
])
def test_every_family_implements_the_shapes(problem):
    """Causal masks, grouped KV heads and cross-attention lengths are the kernels' own now:
    can_implement takes every family's default for them (a rejection coming back fails here)."""
    from variants import load_family

    for name in ("wgmma", "mma_sync"):
        family = load_family(name)
        cfg = family.default("sm_90a", problem)
        assert family.can_implement(cfg, problem, PROFILES["h200"]) == (True, None)


