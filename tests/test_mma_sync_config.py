"""mma_sync family, CPU only: search space, constraint set, Config round trip, register-P order."""

from __future__ import annotations

import dataclasses

import pytest

from tuner.errors import TunerError
from tuner.gpus import PROFILES
from tuner.problem import Problem
from variants.base import enumerate_space
from variants.mma_sync import Config, can_implement, default, space
from variants.mma_sync.config import (
    E4M3_MAX,
    FP16_MAX,
    PV_FP16_ARCHS,
    p_shift_log2,
    register_estimate,
    smem_bytes,
)
from variants.mma_sync.layouts import register_p_slots
from variants.prepare import register_p_key_order

GPU_5080 = PROFILES["5080"]
GPU_H200 = PROFILES["h200"]
PROBLEM = Problem(batch=1, heads=56, seq_len=30272, head_dim=128)
KNOBS = [f.name for f in dataclasses.fields(Config)]


def _cfg(**overrides) -> Config:
    return dataclasses.replace(default("sm_120a", PROBLEM), **overrides)


@pytest.mark.parametrize("arch", ["sm_120a", "sm_90a", "sm_89"])
def test_space_has_exactly_the_knobs(arch):
    domains = space(arch)
    assert sorted(domains) == sorted(KNOBS)
    assert all(isinstance(values, list) and values for values in domains.values())


def test_mxf8_only_in_the_sm120_space():
    assert "mxf8" in space("sm_120a")["mma"]
    assert space("sm_90a")["mma"] == ["fp8"]
    assert space("sm_89")["mma"] == ["fp8"]


@pytest.mark.parametrize("gpu", [GPU_5080, GPU_H200], ids=lambda g: g.name)
def test_default_is_in_space_and_feasible(gpu):
    cfg = default(gpu.arch, PROBLEM)
    domains = space(gpu.arch)
    for knob, value in cfg.to_dict().items():
        assert value in domains[knob], knob
    assert can_implement(cfg, PROBLEM, gpu) == (True, None)


def test_default_is_the_seed_final_config():
    cfg = default("sm_120a", PROBLEM)
    assert (cfg.block_m, cfg.block_n, cfg.warps, cfg.rows_per_warp) == (128, 32, 4, 32)
    assert (cfg.kv_stages, cfg.p_source, cfg.swizzle) == (2, "registers", "bank_period")
    assert cfg.q_in_registers is False and cfg.mma == "fp8"
    # The path the seed measured (half rate on GeForce per the published rates: config.py).
    assert cfg.pv_accum == "fp32" and cfg.p_shift_log2 == 8


def test_config_round_trip_and_hash():
    cfg = _cfg(p_source="smem", q_in_registers=True)
    assert Config.from_dict(cfg.to_dict()) == cfg
    assert hash(Config.from_dict(cfg.to_dict())) == hash(cfg)
    assert len({cfg, _cfg(p_source="smem", q_in_registers=True)}) == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.block_n = 64  # type: ignore[misc]


def test_from_dict_names_unknown_and_missing_knobs():
    data = _cfg().to_dict()
    data.pop("swizzle")
    data["tile_m"] = 128
    with pytest.raises(TunerError,
                       match=r"unknown knobs \['tile_m'\].*missing knobs \['swizzle'\]"):
        Config.from_dict(data)


@pytest.mark.parametrize(
    "overrides, gpu, problem, reason",
    [
        (dict(block_m=256), GPU_5080, PROBLEM, "block_m=256 != warps*rows_per_warp=128"),
        (dict(mma="mxf8"), GPU_H200, PROBLEM, "mxf8"),
        (dict(block_n=48), GPU_5080, PROBLEM, "block_n=48"),
        # 96 keys would straddle two 64-key scale blocks unevenly (keys 64..95 of block 1).
        (dict(block_n=96), GPU_5080, PROBLEM, "scales cover 64 keys"),
        (dict(pv_accum="bf16"), GPU_5080, PROBLEM, "pv_accum='bf16' unknown"),
        # 8 warps x 16 rows x 128 keys: 3 stages of K and V (96 KB) + Q + P > 99 KB.
        (dict(block_m=128, warps=8, rows_per_warp=16, block_n=128, kv_stages=3), GPU_5080,
         PROBLEM, "shared memory"),
        # Two m16 tiles with a 128-key strip: 256 + 64 registers of accumulators alone.
        (dict(block_n=128), GPU_H200, PROBLEM, "register estimate"),
        # head_dim 64 rows are 4 cp.async chunks: 256 threads copy 64 K rows a pass > block_n.
        (dict(block_m=256, warps=8), GPU_5080, Problem(1, 8, 4096, head_dim=64), "cp.async"),
    ],
)
def test_can_implement_rejects_with_reason(overrides, gpu, problem, reason):
    ok, why = can_implement(_cfg(**overrides), problem, gpu)
    assert not ok
    assert reason in why


def test_can_implement_rejects_unsupported_arch():
    from types import SimpleNamespace

    ampere = SimpleNamespace(name="a100", arch="sm_80", smem_per_block=166912, sm_count=108)
    ok, why = can_implement(_cfg(), PROBLEM, ampere)
    assert not ok and "sm_80" in why


@pytest.mark.parametrize("gpu", [GPU_5080, GPU_H200], ids=lambda g: g.name)
def test_every_space_config_is_decided_with_a_reason(gpu):
    feasible = 0
    for cfg in enumerate_space(Config, space(gpu.arch)):
        ok, why = can_implement(cfg, PROBLEM, gpu)
        assert ok == (why is None)
        if ok:
            feasible += 1
            assert smem_bytes(cfg, 128) <= gpu.smem_per_block
            assert register_estimate(cfg, 128) <= 255
    assert feasible >= 50


def test_mxf8_feasible_on_sm120():
    assert can_implement(_cfg(mma="mxf8"), PROBLEM, GPU_5080) == (True, None)


def test_smem_of_the_seed_steps():
    # The seed's numbers on the 5080 (Q + stages x (K + V) [+ P]): 28 KB for the 64x64 one-stage
    # kernel with P in smem, 44 KB with 2 stages, 40 KB with P in registers.
    first = _cfg(block_m=64, rows_per_warp=16, block_n=64, kv_stages=1, p_source="smem")
    assert smem_bytes(first, 128) == 28 * 1024
    assert smem_bytes(dataclasses.replace(first, kv_stages=2), 128) == 44 * 1024
    second = dataclasses.replace(first, kv_stages=2, p_source="registers")
    assert smem_bytes(second, 128) == 40 * 1024


def test_pad_to_covers_both_tiles():
    assert _cfg().pad_to() == 128
    assert _cfg(block_m=64, rows_per_warp=16, block_n=128).pad_to() == 128
    assert _cfg(block_m=256, warps=8, block_n=64).pad_to() == 256


@pytest.mark.parametrize("m_tiles, block_n", [(1, 32), (2, 32), (1, 64), (2, 128)])
def test_register_p_slots_match_prepare_key_order(m_tiles, block_n):
    """Replay the kernel's C->A register move for every lane and compare with prepare's V order."""
    order = register_p_key_order(block_n).tolist()  # stored position -> original key
    slots = register_p_slots(m_tiles, block_n)
    assert sorted(slots) == list(range(len(slots)))
    for t in range(4):  # lane % 4; the row (lane // 4) does not change the key mapping
        a_key = {}
        i = 0
        for nt in range(block_n // 8):
            for m in range(m_tiles):
                for r in range(2):
                    for p in range(2):
                        key = nt * 8 + 2 * t + p  # C fragment: keys 2t, 2t+1 of n-tile nt
                        byte = 2 * slots[i] + p
                        # A fragment byte -> (m tile, row half, k position in the strip)
                        kb, rest = divmod(byte, 16 * m_tiles)
                        m_a, v = divmod(rest, 16)
                        e, r_a, h = v % 4, (v // 4) % 2, v // 8
                        assert (m_a, r_a) == (m, r)
                        a_key[kb * 32 + 16 * h + 4 * t + e] = key
                    i += 1
        for position, key in a_key.items():
            assert order[position] == key


def test_stored_config_without_pv_accum_loads_as_fp32():
    # Tables and database rows written before the knob: the kernel of that time.
    data = _cfg().to_dict()
    del data["pv_accum"]
    assert Config.from_dict(data) == _cfg(pv_accum="fp32")


@pytest.mark.parametrize("arch", ["sm_120a", "sm_90a", "sm_89"])
def test_pv_accum_fp16_in_every_space_with_the_instruction(arch):
    assert arch in PV_FP16_ARCHS
    assert space(arch)["pv_accum"] == ["fp32", "fp16"]
    gpu = {"sm_120a": GPU_5080, "sm_90a": GPU_H200, "sm_89": PROFILES["4090"]}[arch]
    assert can_implement(_cfg(pv_accum="fp16"), PROBLEM, gpu) == (True, None)


@pytest.mark.parametrize("block_n", sorted(set(space("sm_120a")["block_n"])))
def test_fp16_p_scale_is_the_largest_that_cannot_overflow_a_strip(block_n):
    # Every P <= 2^shift, |V| <= 448: the strip sum over block_n keys is bounded by
    # block_n * 2^shift * 448 and must stay below fp16's largest finite value; one more bit of
    # scale would not (a smaller scale only costs P precision).
    shift = p_shift_log2("fp16", block_n)
    assert block_n * 2.0 ** shift * E4M3_MAX <= FP16_MAX
    assert block_n * 2.0 ** (shift + 1) * E4M3_MAX > FP16_MAX
    assert _cfg(block_n=block_n, pv_accum="fp16").p_shift_log2 == shift
    assert _cfg(block_n=block_n).p_shift_log2 == 8


@pytest.mark.parametrize("block_n", sorted(set(space("sm_120a")["block_n"])))
def test_fp16_strip_sum_worst_case_stays_finite(block_n):
    # The worst strip in fp16 arithmetic: every key tied at the row max (P = 2^shift, exact in
    # e4m3) against saturated V codes, summed product by product in fp16 (the most roundings
    # the tensor core could make); with twice the scale the same sum overflows.
    torch = pytest.importorskip("torch")

    def strip_sum(shift: int):
        p = torch.full((block_n,), 2.0 ** shift, dtype=torch.float8_e4m3fn).to(torch.float16)
        v = torch.full((block_n,), E4M3_MAX, dtype=torch.float8_e4m3fn).to(torch.float16)
        acc = torch.zeros((), dtype=torch.float16)
        for j in range(block_n):
            acc = acc + p[j] * v[j]
        return acc

    shift = p_shift_log2("fp16", block_n)
    assert torch.isfinite(strip_sum(shift))
    assert torch.isinf(strip_sum(shift + 1))


def test_the_old_name_of_p_source_still_loads():
    # Tables and database rows written before the knob took wgmma's name say p_staging.
    stored = {**default("sm_120a").to_dict(), "p_source": "smem"}
    old = {("p_staging" if k == "p_source" else k): v for k, v in stored.items()}
    assert Config.from_dict(old) == Config.from_dict(stored)
    with pytest.raises(TunerError, match="both 'p_staging' and its new name 'p_source'"):
        Config.from_dict({**old, "p_source": "smem"})
