"""pack_gqa and head_swizzle on the GPU: the query heads of a KV group packed into a tile's rows
(variants/wgmma/pack_gqa.py) through the correctness gate (tuner.gate.validate_kernel: random,
structured and realistic inputs, NaN-poisoned outputs, the fp32 reference) at groups 2, 4 and 8
with causal and full masks, ragged lengths, queries and keys of different lengths and one query
row; the same inputs packed and unpacked give the same bits; and the planted bugs on a packed
base are rejected (kv_head_shifted, packed_heads_swapped among them). `-m gpu` runs each shape
with one config (cycling); `-m gpu_full` every config on every shape and every bug."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

import tuner
from tests.doubles.planted import APPLIES, BUGS, expected_check
from tests.gpu import tiered
from tuner.gate import validate_kernel
from tuner.gpus import PROFILES
from tuner.problem import Problem
from variants import wgmma

# (batch, heads, kv_heads, seq_len, seq_len_kv, head_dim, causal)
SHAPES = [
    (1, 16, 8, 1000, 1000, 128, True),    # group 2, ragged
    (2, 32, 8, 777, 777, 128, True),      # group 4, two batches
    (1, 64, 8, 300, 1300, 128, True),     # group 8, more keys than queries
    (1, 32, 8, 1500, 1100, 64, True),     # group 4, head_dim 64: queries outnumber keys
    (1, 8, 1, 1, 1, 128, True),           # group 8, one query and one key
    (1, 16, 4, 1, 2049, 128, False),      # group 4, one query row, the ragged strip
    (2, 16, 2, 2000, 2000, 128, False),   # group 8, full mask
    (1, 8, 4, 4097, 3000, 64, False),     # group 2, head_dim 64, cross lengths
]

CONFIGS = [
    dict(pack_gqa=True),
    dict(pack_gqa=True, persistent=False, q_quant="prepare", block_n=64),
    dict(pack_gqa=True, tile_order="longest_first", head_swizzle=4, split_tail=False),
    dict(pack_gqa=True, tile_order="longest_first", head_swizzle=8, persistent=False),
    dict(pack_gqa=True, tile_order="longest_first", head_swizzle=16, consumer_wgs=1,
         pingpong=False, block_n=64),
    dict(pack_gqa=True, q_quant="kernel", intra_wg_overlap=False, pingpong=False),
    dict(pack_gqa=True, v_layout="kernel", p_source="smem", kv_stages=3),
]


def _problem(shape):
    batch, heads, kv_heads, seq, seq_kv, head_dim, causal = shape
    return Problem(batch, heads, seq, head_dim, causal, seq_kv, kv_heads)


def _config(problem, overrides):
    cfg = dataclasses.replace(wgmma.default("sm_90a", problem), **overrides)
    if problem.causal or not cfg.persistent:
        cfg = dataclasses.replace(cfg, split_tail=False)
    if cfg.consumer_wgs == 1:
        cfg = dataclasses.replace(cfg, pingpong=False)
    ok, reason = wgmma.can_implement(cfg, problem, PROFILES["h200"])
    assert ok, reason
    return cfg


def _id(case):
    overrides, shape = case
    knobs = ",".join(f"{k}={v}" for k, v in overrides.items() if k != "pack_gqa") or "default"
    return f"{knobs}-b{shape[0]}-h{shape[1]}-kvh{shape[2]}-s{shape[3]}-kv{shape[4]}-d{shape[5]}" \
        + ("-causal" if shape[6] else "")


@pytest.mark.parametrize("overrides, shape", tiered(
    [(o, s) for s in SHAPES for o in CONFIGS],
    lambda _, case: CONFIGS.index(case[0]) == SHAPES.index(case[1]) % len(CONFIGS), ids=_id))
def test_the_gate_passes_pack_gqa(overrides, shape):
    problem = _problem(shape)
    cfg = _config(problem, overrides)
    seed = int.from_bytes(os.urandom(4), "little")
    report = validate_kernel(wgmma.compile(cfg, problem, "sm_90a"), problem,
                             torch.device("cuda"), seed)
    assert report.passed, f"seed={seed} {cfg.short()}: {report.reason}"


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_packed_and_unpacked_tiles_give_the_same_bits(tmp_path, monkeypatch, causal):
    """Each row's strips are the same updates in the same order whichever tile holds it (a
    strip a row does not see leaves its state as it was), so packing changes no bit."""
    monkeypatch.setenv("TUNER_DB_URL", f"sqlite:///{tmp_path / 'empty.sqlite'}")
    g = torch.Generator(device="cuda").manual_seed(5)
    q = torch.randn(2, 1999, 32, 128, device="cuda", generator=g, dtype=torch.bfloat16)
    k, v = (torch.randn(2, 2100, 8, 128, device="cuda", generator=g, dtype=torch.bfloat16)
            for _ in range(2))
    problem = Problem(2, 32, 1999, 128, causal, 2100, 8)
    # Without split_tail: the two tile counts (1024 and 1008) split different tails.
    plain = _config(problem, {"q_quant": "prepare", "split_tail": False})
    out, lse = tuner.attention(q, k, v, causal=causal, config=plain, return_lse=True)
    got, got_lse = tuner.attention(q, k, v, causal=causal,
                                   config=dataclasses.replace(plain, pack_gqa=True),
                                   return_lse=True)
    assert torch.equal(got, out) and torch.equal(got_lse, lse)


PLANTED = {"causal": Problem(1, 8, 1500, 128, True, 1100, 2),
           "full": Problem(2, 16, 999, 64, False, 999, 2)}
ALWAYS = {"none", "kv_head_shifted", "packed_heads_swapped", "causal_diagonal_dropped",
          "tail_row"}


@pytest.mark.parametrize("bug, shape", tiered(
    [(b, s) for b in BUGS for s in PLANTED],
    lambda _, case: case[0] in ALWAYS and (case[1] == "causal" or case[0] == "none"),
    ids=lambda case: f"{case[1]}-{case[0]}"))
def test_planted_bugs_on_a_packed_base_are_rejected(bug, shape):
    from tests.doubles import planted_wgmma_packed as planted

    problem = PLANTED[shape]
    if bug in APPLIES and not APPLIES[bug](problem):
        pytest.skip(f"{bug} needs a problem with that feature")
    kernel = planted.compile(planted.Config(bug), problem, "sm_90a")
    assert kernel.config.pack_gqa
    seed = int.from_bytes(os.urandom(4), "little")
    report = validate_kernel(kernel, problem, torch.device("cuda"), seed)
    if BUGS[bug] is None:
        assert report.passed, f"seed={seed}: {report.reason}"
    else:
        assert not report.passed and expected_check(bug, problem) in report.reason, \
            f"seed={seed}: {report.reason}"


def gpu_builds(name, params):
    """The kernels a test here builds (tests/conftest.py compiles them ahead, in parallel)."""
    if "shape" in params and "overrides" in params:
        problem = _problem(params["shape"])
        return [("wgmma", _config(problem, params["overrides"]), problem)]
    if "bug" in params:
        from tests.doubles import wgmma_packed

        problem = PLANTED[params["shape"]]
        return [("wgmma", wgmma_packed.default("sm_90a", problem), problem)]
    return []
