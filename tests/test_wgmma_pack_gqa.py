"""wgmma's pack_gqa and head_swizzle knobs on the CPU: the space, can_implement's verdict and
reason for every combination it refuses, the knobs' place in the build key, and the tile count
the launch sizes split_tail's workspace with."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from tuner.gpus import PROFILES
from tuner.problem import Problem
from variants import wgmma
from variants.base import judge_space
from variants.build import codegen_key
from variants.wgmma import build as wgmma_build
from variants.wgmma.config import HEAD_SWIZZLE_MAX

H200 = PROFILES["h200"]
GQA = Problem(1, 32, 8192, causal=True, kv_heads=8)  # group 4


def _cfg(problem=GQA, **overrides):
    return dataclasses.replace(wgmma.default("sm_90a", problem), **overrides)


def test_the_space_offers_both_knobs_with_their_defaults_first():
    space = wgmma.space("sm_90a")
    assert space["pack_gqa"] == [False, True]
    assert space["head_swizzle"][0] == 0
    assert all(0 < v <= HEAD_SWIZZLE_MAX and v & (v - 1) == 0 for v in space["head_swizzle"][1:])
    cfg = wgmma.default("sm_90a", GQA)
    assert (cfg.pack_gqa, cfg.head_swizzle) == (False, 0)


@pytest.mark.parametrize(("heads", "kv_heads", "consumer_wgs"),
                         [(8, 4, 1), (16, 4, 2), (64, 8, 3), (64, 8, 1), (128, 2, 1),
                          (128, 2, 2)])
def test_pack_gqa_takes_a_power_of_two_group_that_divides_block_m(heads, kv_heads,
                                                                 consumer_wgs):
    problem = Problem(1, heads, 1000, kv_heads=kv_heads)
    cfg = _cfg(problem, pack_gqa=True, consumer_wgs=consumer_wgs,
               pingpong=consumer_wgs > 1, block_n=64, split_tail=False)
    assert wgmma.can_implement(cfg, problem, H200) == (True, None)


@pytest.mark.parametrize(("problem", "overrides", "words"), [
    (Problem(1, 8, 100), {"pack_gqa": True}, "one a KV head"),
    (Problem(1, 12, 100, kv_heads=4), {"pack_gqa": True, "consumer_wgs": 3, "block_n": 64,
                                       "split_tail": False},
     "3 query heads per KV head"),
    (Problem(1, 24, 100, kv_heads=4), {"pack_gqa": True, "consumer_wgs": 3, "block_n": 64,
                                       "split_tail": False}, "power of two dividing block_m"),
    (Problem(1, 128, 100, kv_heads=1), {"pack_gqa": True, "consumer_wgs": 1,
                                        "pingpong": False}, "block_m=64"),
    (Problem(1, 256, 100, kv_heads=1), {"pack_gqa": True}, "256 query heads"),
    (GQA, {"pack_gqa": 1}, "pack_gqa=1: true or false"),
    (GQA, {"head_swizzle": -1}, "head_swizzle=-1"),
    (GQA, {"head_swizzle": HEAD_SWIZZLE_MAX + 1}, f"0..{HEAD_SWIZZLE_MAX}"),
    (GQA, {"head_swizzle": 2.0}, "head_swizzle=2.0"),
    (GQA, {"head_swizzle": 8, "tile_order": "per_head"}, "walks one head at a time"),
])
def test_refusals_name_the_constraint(problem, overrides, words):
    ok, reason = wgmma.can_implement(_cfg(problem, **overrides), problem, H200)
    assert not ok
    assert words in reason


def test_pack_gqa_is_feasible_wherever_the_unpacked_config_is_for_a_group_of_four():
    """Packing changes no resource: every config feasible without it is feasible with it (the
    group divides every block_m), so the space's feasible count doubles and no more."""
    verdicts = {cfg: ok for cfg, ok, _ in judge_space(wgmma, Problem(1, 8, 4096, kv_heads=2),
                                                        H200)}
    packed = [(ok, verdicts[dataclasses.replace(cfg, pack_gqa=False)])
              for cfg, ok in verdicts.items() if cfg.pack_gqa]
    assert packed and all(a == b for a, b in packed)


def test_head_swizzle_applies_to_longest_first_with_any_mask():
    for causal in (False, True):
        problem = dataclasses.replace(GQA, causal=causal)
        for value in wgmma.space("sm_90a")["head_swizzle"]:
            cfg = _cfg(problem, tile_order="longest_first", head_swizzle=value, split_tail=False)
            assert wgmma.can_implement(cfg, problem, H200) == (True, None)


def test_the_group_enters_the_build_key_only_for_pack_gqa():
    cfg, src = _cfg(pack_gqa=True), wgmma_build._SRC_DIR
    keys = {codegen_key("wgmma", cfg, 128, "sm_90a", src, True, {"group": g}) for g in (2, 4, 8)}
    assert len(keys) == 3
    assert codegen_key("wgmma", cfg, 128, "sm_90a", src, True) == \
        codegen_key("wgmma", cfg, 128, "sm_90a", src, True, None)
    assert codegen_key("wgmma", cfg, 128, "sm_90a", src, True) != \
        codegen_key("wgmma", _cfg(), 128, "sm_90a", src, True)


@pytest.mark.parametrize(("heads", "kv_heads", "seq_len", "pack"),
                         [(32, 8, 4096, True), (32, 8, 4096, False), (8, 2, 77, True),
                          (6, 3, 1, True)])
def test_split_tails_workspace_counts_the_kernels_tiles(monkeypatch, heads, kv_heads, seq_len,
                                                        pack):
    """The launch sizes the workspace by the tiles the kernel deals: with pack_gqa KV heads
    times blocks of seq_len * group packed rows."""
    import torch

    seen = {}

    def split_tiles(tiles, grid, strips):
        seen["tiles"] = tiles
        return 0

    monkeypatch.setattr("variants.wgmma.split_tail.split_tiles", split_tiles)
    monkeypatch.setattr(wgmma_build, "_sm_count_arg", lambda device: (132,))
    cfg = _cfg(Problem(2, heads, seq_len, kv_heads=kv_heads), pack_gqa=pack, split_tail=True,
               persistent=True)
    prepared = SimpleNamespace(q=torch.empty(2, 1, heads, 1), k=torch.empty(2, 1, kv_heads, 1),
                               seq_len=seq_len, seq_len_kv=seq_len)
    assert wgmma_build._workspace_words(cfg, 128)(None, prepared) == 0
    group = heads // kv_heads if pack else 1
    assert seen["tiles"] == 2 * (heads // group) * -(-seq_len * group // cfg.block_m)


def test_a_packed_build_refuses_inputs_of_another_group():
    """The group is compiled in: a launch on inputs with another one would pack the wrong
    heads, so run() names the mismatch before launching."""
    import torch

    from variants.build import CompiledKernel

    cfg = _cfg(pack_gqa=True, q_quant="prepare", k_smoothing="off")
    kernel = CompiledKernel(cfg, GQA, "sm_90a", None, 0.0, _fn=object())
    prepared = SimpleNamespace(
        v_feature_major=cfg.v_feature_major, key_permuted=cfg.v_key_permuted,
        q_in_kernel=False, v_unquantized=False, k_mean=None, qk_rotated=False, padded_len=256,
        padded_len_kv=256,
        softmax_scale=0.1, q=torch.empty(1, 256, 32, 128), k=torch.empty(1, 256, 4, 128))
    with pytest.raises(ValueError, match="packs 4 query heads per KV head.*32 on 4"):
        kernel.run(prepared)
