"""wgmma with pack_gqa and head_swizzle compiles for sm_90a without a GPU (fake pointers): groups
2, 4 and 8, head_dim 64 and 128, causal and full masks, persistent or not, 64- and 128-key strips,
split_tail, Q quantized in the kernel, V transposed in the kernel; no spills, and a packed Q tile
is one 5-D TMA load (head_dim, group, tokens, KV head, batch)."""

from __future__ import annotations

import dataclasses
import re

import pytest

from tuner.gpus import PROFILES
from tuner.problem import Problem
from variants import wgmma
from variants.cubin import disassemble

pytestmark = [pytest.mark.compile, pytest.mark.usefixtures("compile_in_tmp")]

H200 = PROFILES["h200"]

# (heads, kv_heads, head_dim, causal, overrides of the problem's default)
CASES = [
    (16, 8, 128, True, {}),
    (32, 8, 128, False, {"q_quant": "prepare", "split_tail": True}),
    (64, 8, 128, True, {"q_quant": "prepare", "persistent": False, "block_n": 64}),
    (32, 8, 64, True, {"head_swizzle": 8}),
    (64, 8, 64, False, {"split_tail": True, "q_quant": "kernel", "block_n": 64}),
    (16, 8, 128, False, {"v_layout": "kernel", "p_source": "smem", "split_tail": False}),
    (32, 8, 128, True, {"intra_wg_overlap": False, "pingpong": True, "q_quant": "prepare"}),
    (64, 8, 128, True, {"consumer_wgs": 1, "pingpong": False, "head_swizzle": 4}),
    (32, 8, 128, True, {"tile_order": "longest_first", "head_swizzle": 16, "pack_gqa": False}),
]


def _build(heads, kv_heads, head_dim, causal, overrides):
    problem = Problem(1, heads, 77, head_dim=head_dim, causal=causal, kv_heads=kv_heads)
    cfg = dataclasses.replace(wgmma.default("sm_90a", problem),
                              **{"pack_gqa": True, **overrides})
    assert wgmma.can_implement(cfg, problem, H200) == (True, None)
    return cfg, problem, wgmma.compile(cfg, problem, "sm_90a")


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"g{c[0] // c[1]}-d{c[2]}-"
                         f"{'causal' if c[3] else 'full'}-" +
                         ",".join(f"{k}={v}" for k, v in c[4].items()))
def test_compiles_without_spills_and_loads_a_packed_q_tile_in_one_tma(case):
    cfg, problem, kernel = _build(*case)
    assert 0 < kernel.resources.registers <= 255
    assert kernel.resources.spill_bytes == 0
    assert kernel.resources.smem_bytes <= H200.smem_per_block
    builds = [kernel] + ([kernel._single_launch] if kernel._single_launch else [])
    for build in builds:
        tma = set(re.findall(r"UTMALDG\.(\dD)", disassemble(build.cubin_path.read_bytes())))
        # K and V strips are 4-D (head_dim, keys, KV head, batch); a packed Q tile is 5-D.
        assert tma == ({"4D", "5D"} if cfg.pack_gqa else {"4D"}), tma


def test_each_group_is_a_build_of_its_own():
    _, _, two = _build(16, 8, 128, True, {})
    _, _, four = _build(32, 8, 128, True, {})
    assert two.cubin_path != four.cubin_path
    assert two.cubin_path.read_bytes() != four.cubin_path.read_bytes()
