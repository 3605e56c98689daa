"""wgmma kernels compile for sm_90a without a GPU (fake pointers), every knob value at least once.

One compile takes ~2 s on a CI core, so the set is the default plus one change per knob value
(and the extreme tiles), not the space.
"""

import dataclasses

import pytest

from tuner.gpus import PROFILES
from tuner.problem import Problem
from variants import wgmma

pytestmark = pytest.mark.compile

H200 = PROFILES["h200"]
PROBLEM = Problem(batch=1, heads=2, seq_len=77)
_DEFAULT = wgmma.default("sm_90a", PROBLEM)
CASES = [
    {},
    {"p_source": "smem"},
    {"intra_wg_overlap": False, "pingpong": False, "persistent": False},
    # The widest strip: at head_dim 128 one warpgroup's S, O and block scales outgrow 256
    # registers (can_implement refuses it), so at head_dim 64.
    {"consumer_wgs": 1, "pingpong": False, "block_n": 256, "kv_stages": 3, "head_dim": 64},
    {"consumer_wgs": 3, "block_n": 64, "kv_stages": 4},
    {"block_n": 192, "p_source": "smem", "intra_wg_overlap": False},
    # V transposed in shared memory: the staging ring, TMA of the natural V, ldmatrix/stmatrix.
    {"v_layout": "kernel"},
    {"v_layout": "kernel", "p_source": "smem", "kv_stages": 3},
    {"v_layout": "kernel", "consumer_wgs": 1, "pingpong": False, "block_n": 64,
     "intra_wg_overlap": False, "persistent": False},
    # Exponentials on the FMA pipe (an inline-PTX cubic), with P from registers and from smem.
    {"fma_exp2": 1},
    {"fma_exp2": 2, "p_source": "smem"},
    # Every head's last query block first (the causal default; here without a mask).
    {"tile_order": "longest_first"},
]


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path))
    monkeypatch.chdir(tmp_path)  # --keep-cubin writes the cubin to the working directory


@pytest.mark.parametrize("overrides", CASES, ids=lambda o: ",".join(f"{k}={v}" for k, v in
                                                                   o.items()) or "default")
def test_compiles_without_spills(overrides):
    overrides = dict(overrides)
    problem = dataclasses.replace(PROBLEM, head_dim=overrides.pop("head_dim", PROBLEM.head_dim))
    cfg = dataclasses.replace(_DEFAULT, **overrides)
    assert wgmma.can_implement(cfg, problem, H200) == (True, None)
    kernel = wgmma.compile(cfg, problem, "sm_90a")
    assert kernel.config == cfg
    assert 0 < kernel.resources.registers <= 255
    assert kernel.resources.spill_bytes == 0
    assert kernel.resources.smem_bytes <= H200.smem_per_block
    assert wgmma.compile(cfg, problem, "sm_90a") is kernel


def test_cases_cover_every_knob_value():
    space = wgmma.space("sm_90a")
    seen = {name: set() for name in space}
    for overrides in CASES:
        knobs = {k: v for k, v in overrides.items() if k != "head_dim"}
        for name, value in dataclasses.replace(_DEFAULT, **knobs).to_dict().items():
            seen[name].add(value)
    for name, values in space.items():
        assert set(values) <= seen[name], name
