"""wgmma family: knobs, search space, constraint set and the register-P key order (CPU only)."""

import dataclasses

import pytest

from tuner.errors import TunerError
from tuner.gpus import PROFILES
from tuner.problem import Problem
from variants import wgmma
from variants.base import enumerate_space, load_space
from variants.prepare import register_p_key_order
from variants.wgmma.config import register_estimate, register_split, smem_bytes
from variants.wgmma.defaults import ROTATE_FROM

H200 = PROFILES["h200"]
PROBLEM = Problem(batch=1, heads=56, seq_len=30272)


def _cfg(**overrides):
    """PROBLEM's default kernel with K smoothing alone (its default also rotates Q and K, from
    wgmma's ROTATE_FROM): the base the knobs under test act on."""
    return dataclasses.replace(wgmma.default("sm_90a", PROBLEM),
                               **{"qk_rotation": "none", **overrides})


def test_space_fields_match_yaml_and_config():
    space = wgmma.space("sm_90a")
    assert set(space) == {f.name for f in dataclasses.fields(wgmma.Config)}
    assert set(space) == set(load_space("wgmma", "sm_120a"))
    assert space["consumer_wgs"] == [1, 2, 3]
    assert set(space["p_source"]) == {"registers", "smem"}
    for knob in ("intra_wg_overlap", "pingpong", "persistent"):
        assert set(space[knob]) == {True, False}


def test_default_is_feasible_and_in_space():
    cfg = wgmma.default("sm_90a", PROBLEM)
    assert wgmma.can_implement(cfg, PROBLEM, H200) == (True, None)
    space = wgmma.space("sm_90a")
    for name, value in cfg.to_dict().items():
        assert value in space[name], name


def test_config_round_trip_and_hash():
    cfg = _cfg(block_n=192)
    assert wgmma.Config.from_dict(cfg.to_dict()) == cfg
    assert hash(cfg) == hash(wgmma.Config.from_dict(cfg.to_dict()))
    assert cfg.block_m == 128 and cfg.threads == 384
    assert cfg.pad_to() == 384


def test_a_config_written_before_fma_exp2_existed_loads_as_fma_exp2_0():
    # Tables and database rows from before the knob: the kernel they measured is fma_exp2=0.
    old = {k: v for k, v in _cfg().to_dict().items() if k != "fma_exp2"}
    assert wgmma.Config.from_dict(old) == _cfg(fma_exp2=0)
    # A knob without a default is still required, and unknown ones are refused.
    with pytest.raises(TunerError, match="missing knobs \\['block_n'\\]"):
        wgmma.Config.from_dict({k: v for k, v in old.items() if k != "block_n"})
    with pytest.raises(TunerError, match="unknown knobs \\['exp2'\\]"):
        wgmma.Config.from_dict({**old, "exp2": 1})


def test_head_dim_64_has_its_own_feasible_default():
    small = Problem(1, 56, 8192, 64)
    cfg = wgmma.default("sm_90a", small)
    assert cfg.consumer_wgs == 3 and cfg != wgmma.default("sm_90a", Problem(1, 56, 8192, 128))
    assert wgmma.can_implement(cfg, small, H200) == (True, None)
    # Without a problem the default is PROBLEM's but for the rotation, which needs the lengths.
    assert PROBLEM.seq_len >= ROTATE_FROM
    assert wgmma.default("sm_90a", PROBLEM).qk_rotation == "hadamard"
    assert wgmma.default("sm_90a") == _cfg()


def test_every_space_config_is_judged_with_a_reason():
    ok = 0
    for cfg in enumerate_space(wgmma.Config, wgmma.space("sm_90a")):
        feasible, reason = wgmma.can_implement(cfg, PROBLEM, H200)
        assert feasible == (reason is None)
        if feasible:
            ok += 1
            assert smem_bytes(cfg, 128) <= H200.smem_per_block
            assert register_estimate(cfg, 128) <= register_split(cfg)[0]
    assert ok > 0


@pytest.mark.parametrize("gpu", ["5080", "4090"])
def test_rejects_other_archs(gpu):
    ok, reason = wgmma.can_implement(_cfg(), PROBLEM, PROFILES[gpu])
    assert not ok and "sm_90a" in reason


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"consumer_wgs": 1, "pingpong": True}, "pingpong"),
        ({"consumer_wgs": 4}, "consumer_wgs"),
        ({"block_n": 96 + 8}, "multiple of 32"),
        ({"block_n": 288}, "block_n"),
        ({"kv_stages": 5}, "kv_stages"),
        ({"p_source": "tmem"}, "p_source"),
        ({"v_layout": "transposed"}, "v_layout"),
        ({"fma_exp2": 9}, "fma_exp2"),
        ({"fma_exp2": -1}, "fma_exp2"),
        ({"fma_exp2": 2.5}, "fma_exp2"),
        ({"fma_exp2": True}, "fma_exp2"),
        ({"tile_order": "random"}, "tile_order"),
        ({"q_quant": "register"}, "q_quant"),
        ({"consumer_wgs": 3, "block_n": 256}, "register estimate"),
        # One warpgroup's 64 x 256 S and O at head_dim 128 fill 255 registers before the
        # block scales' 14 (ptxas spills 32 B).
        ({"consumer_wgs": 1, "pingpong": False, "block_n": 256}, "register estimate"),
        ({"block_n": 256, "kv_stages": 4}, "shared memory"),
    ],
)
def test_rejections_name_the_constraint(overrides, words):
    ok, reason = wgmma.can_implement(_cfg(**overrides), PROBLEM, H200)
    assert not ok and words in reason


@pytest.mark.parametrize("head_dim, seq_len", [(64, 8192), (64, 30272)])
def test_the_default_deals_causal_tiles_longest_first_and_others_per_head(head_dim, seq_len):
    causal = Problem(1, 56, seq_len, head_dim=head_dim, causal=True)
    full = Problem(1, 56, seq_len, head_dim=head_dim)
    assert wgmma.default("sm_90a", causal).tile_order == "longest_first"
    assert wgmma.default("sm_90a", full).tile_order == "per_head"
    # Nothing else moves with the mask here but the tail's split, which is for full masks.
    assert not wgmma.default("sm_90a", causal).split_tail
    assert (dataclasses.replace(wgmma.default("sm_90a", causal), tile_order="per_head",
                                split_tail=True)
            == wgmma.default("sm_90a", full))


@pytest.mark.parametrize("seq_len", [8193, 16384, 30272])
def test_the_long_causal_default_at_128_deals_per_head_tiles_to_a_hardware_scheduled_grid(
        seq_len):
    causal = Problem(1, 56, seq_len, causal=True)
    full = Problem(1, 56, seq_len)
    cfg = wgmma.default("sm_90a", causal)
    assert (cfg.tile_order, cfg.persistent) == ("per_head", False)
    # Only the grid moves with the mask there (and the tail's split, for full masks; below
    # ROTATE_FROM the rotation, which a full mask turns on from ROTATE_FULL_128_FROM).
    assert not cfg.split_tail
    assert cfg.qk_rotation == ("hadamard" if seq_len >= ROTATE_FROM else "none")
    assert (dataclasses.replace(cfg, persistent=True, split_tail=True, qk_rotation="hadamard")
            == wgmma.default("sm_90a", full))
    assert wgmma.can_implement(cfg, causal, H200) == (True, None)


@pytest.mark.parametrize("seq_len, seq_len_kv", [(2048, 2048), (8192, 8192), (16384, 8192)])
def test_the_short_causal_default_at_128_quantizes_q_in_the_kernel_without_pingpong(
        seq_len, seq_len_kv):
    from variants.wgmma.defaults import CAUSAL_SHORT_KEYS_UP_TO

    causal = Problem(1, 32, seq_len, causal=True, seq_len_kv=seq_len_kv, kv_heads=8)
    full = Problem(1, 32, seq_len, seq_len_kv=seq_len_kv, kv_heads=8)
    cfg = wgmma.default("sm_90a", causal)
    assert (cfg.tile_order, cfg.pingpong, cfg.q_quant) == ("longest_first", False, "kernel")
    # Only those three knobs move with the mask, decided by the keys (and the tail's split and,
    # from ROTATE_FULL_128_FROM, the rotation, for full masks).
    assert not cfg.split_tail
    assert (dataclasses.replace(cfg, tile_order="per_head", pingpong=True, split_tail=True,
                                q_quant=wgmma.default("sm_90a", full).q_quant,
                                qk_rotation=wgmma.default("sm_90a", full).qk_rotation)
            == wgmma.default("sm_90a", full))
    assert wgmma.can_implement(cfg, causal, H200) == (True, None)
    assert CAUSAL_SHORT_KEYS_UP_TO == 8192


def test_smem_counts_the_v_staging_ring_only_for_v_layout_kernel():
    prepared, kernel = _cfg(v_layout="prepared"), _cfg(v_layout="kernel")
    extra = smem_bytes(kernel, 128) - smem_bytes(prepared, 128)
    assert extra == kernel.kv_stages * kernel.block_n * 128


def test_v_layout_kernel_asks_prepare_for_natural_v_without_permutation():
    for p_source in ("registers", "smem"):
        cfg = _cfg(v_layout="kernel", p_source=p_source)
        assert (cfg.v_feature_major, cfg.v_key_permuted) == (False, False)
    assert (_cfg(v_layout="prepared", p_source="registers").v_key_permuted,
            _cfg(v_layout="prepared", p_source="smem").v_key_permuted) == (True, False)


def test_smem_counts_p_tile_for_smem_source_and_the_placeholder_for_registers():
    """With P in registers the kernel still allocates a one-byte P field, aligned like every
    buffer: one 1024-byte block (the kernel's trace-time check compares the estimate with the
    shared storage it builds)."""
    reg = _cfg(p_source="registers")
    smem = _cfg(p_source="smem")
    assert smem_bytes(smem, 128) - smem_bytes(reg, 128) == smem.block_m * smem.block_n - 1024


def _wgmma_c_coords(lane: int, block_n: int):
    """f32 accumulator of m64nN wgmma: register -> (row in warp's 16, key), PTX ISA layout."""
    t, g = lane % 4, lane // 4
    coords = []
    for j in range(block_n // 8):
        for i in range(2):
            for e in range(2):
                coords.append((g + 8 * i, 8 * j + 2 * t + e))  # register 4j + 2i + e
    return coords


def _wgmma_a_e4m3_coords(lane: int, block_n: int):
    """e4m3 A fragment of m64nNk32 wgmma: byte -> (row, k slot), per k32 block (4 registers)."""
    t, g = lane % 4, lane // 4
    coords = []
    for kb in range(block_n // 32):
        for h in range(2):
            for i in range(2):
                for b in range(4):
                    coords.append((g + 8 * i, 32 * kb + 16 * h + 4 * t + b))  # 16kb+8h+4i+b
    return coords


@pytest.mark.parametrize("block_n", [64, 128, 192, 256])
def test_register_p_views_feed_each_key_to_its_v_row(block_n):
    """With V's keys in register_p_key_order, the fp8 A byte that _p_views fills from an
    accumulator register holds the score of the key that V's k slot stores (no lane crossing)."""
    order = register_p_key_order(block_n).tolist()  # stored slot -> original key
    k_blocks = block_n // 32
    # _p_views: both tensors seen as (b0, b1, row half, k half, k-block) with these strides.
    c_stride, a_stride = (1, 4, 2, 8, 16), (1, 2, 4, 8, 16)
    for lane in range(32):
        c = _wgmma_c_coords(lane, block_n)
        a = _wgmma_a_e4m3_coords(lane, block_n)
        for kb in range(k_blocks):
            for h in range(2):
                for i in range(2):
                    for b1 in range(2):
                        for b0 in range(2):
                            idx = (b0, b1, i, h, kb)
                            c_reg = sum(x * s for x, s in zip(idx, c_stride, strict=True))
                            a_reg = sum(x * s for x, s in zip(idx, a_stride, strict=True))
                            row_c, key = c[c_reg]
                            row_a, slot = a[a_reg]
                            assert row_c == row_a
                            assert order[slot] == key



def test_smem_counts_the_bf16_q_staging_tile_only_for_q_quant_kernel():
    cfg = _cfg()
    for head_dim in (64, 128):
        assert (smem_bytes(dataclasses.replace(cfg, q_quant="kernel"), head_dim)
                - smem_bytes(cfg, head_dim)) == 2 * cfg.block_m * head_dim


def test_for_q_dtype_gives_fp16_and_fp8_callers_the_prepare_twin():
    cfg = _cfg(q_quant="kernel")
    assert cfg.for_q_dtype("bfloat16") is cfg
    for dtype in ("float16", "float8_e4m3fn"):
        twin = cfg.for_q_dtype(dtype)
        assert twin.q_quant == "prepare" and not twin.q_in_kernel
        # FP8 codes skip prepare's transforms: that twin has K smoothing off too.
        assert twin.k_smoothing == ("off" if dtype == "float8_e4m3fn" else cfg.k_smoothing)
        assert dataclasses.replace(twin, q_quant="kernel", k_smoothing=cfg.k_smoothing) == cfg
    assert _cfg().for_q_dtype("float16") == _cfg()


def test_the_default_quantizes_q_in_the_kernel_up_to_1024_keys_at_128_and_4608_at_64():
    # (causal at 128: up to 8192 keys, the test above)
    from variants.wgmma.defaults import HEAD_DIM_64_SHORT_UP_TO, Q_IN_KERNEL_UP_TO

    for seq, kv, causal, head_dim, want in ((1024, 1024, False, 128, "kernel"),
                                            (77, 77, True, 128, "kernel"),
                                            (8192, 1024, False, 128, "kernel"),  # by keys
                                            (1024, 1025, False, 128, "prepare"),
                                            (4608, 4608, False, 128, "prepare"),
                                            (8192, 8192, True, 128, "kernel"),  # causal
                                            (8192, 8193, True, 128, "prepare"),
                                            (4096, 8192, False, 128, "prepare"),
                                            (30272, 30272, False, 128, "prepare"),
                                            (1024, 1024, False, 64, "kernel"),
                                            (8192, 4608, True, 64, "kernel"),  # by keys
                                            (4608, 4609, False, 64, "prepare"),
                                            (30272, 30272, False, 64, "prepare")):
        problem = Problem(1, 8, seq, head_dim, causal, seq_len_kv=kv)
        cfg = wgmma.default("sm_90a", problem)
        assert cfg.q_quant == want, (seq, kv, head_dim)
        assert wgmma.can_implement(cfg, problem, H200) == (True, None)
    assert Q_IN_KERNEL_UP_TO == 1024 and HEAD_DIM_64_SHORT_UP_TO == 4608
    assert wgmma.default("sm_90a").q_quant == "prepare"  # no problem: the recipe as measured


def test_the_full_mask_default_splits_the_tail_where_the_rule_says():
    """split_tail is on in every full-mask default on the persistent grid (whether a launch
    splits is the cost rule's, on the device's SM count); never with a causal mask or a grid
    the hardware schedules, which can_implement refuses."""
    for problem in (Problem(1, 56, 8192), Problem(4, 32, 1024), Problem(1, 56, 30272, 64),
                    Problem(2, 24, 1024, 64), Problem(1, 8, 4096, seq_len_kv=1000, kv_heads=2)):
        cfg = wgmma.default("sm_90a", problem)
        assert cfg.split_tail and cfg.persistent, problem
        assert wgmma.can_implement(cfg, problem, H200) == (True, None)
    for seq_len in (2048, 8192, 16384, 30272):
        for head_dim in (64, 128):
            causal = Problem(1, 56, seq_len, head_dim, causal=True)
            cfg = wgmma.default("sm_90a", causal)
            assert not cfg.split_tail
            assert wgmma.can_implement(cfg, causal, H200) == (True, None)
