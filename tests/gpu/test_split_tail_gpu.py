"""split_tail on the GPU: the last wave's tiles split along the keys over every SM and merged by
the warp that completes each tile (variants/wgmma/split_tail.py), through the correctness gate
(tuner.gate.validate_kernel: random and structured inputs, NaN-poisoned outputs, the fp32
reference) at shapes whose tile counts put the split in each of its cases on the H200's 132
SMs, and end to end through tuner.attention."""

import dataclasses
import os

import pytest
import torch

import tuner
from tuner.gate import validate_kernel
from tuner.gpus import PROFILES
from tuner.problem import Problem
from variants import wgmma
from variants.reference import validate

pytestmark = pytest.mark.gpu

# (batch, heads, seq_len, seq_len_kv, kv_heads, head_dim): tiles of 128 rows (192 at head_dim
# 64 with three consumer warpgroups) against 132 SMs.
SHAPES = [
    (1, 2, 77, 77, 2, 128),        # 2 tiles of one strip: a piece is a whole tile
    (1, 4, 1000, 1000, 2, 128),    # 32 tiles, 8 strips: every tile split 4-5 ways
    (1, 4, 1, 513, 4, 128),        # one query row a head, 5 strips, the ragged one in a piece
    (1, 9, 4097, 4097, 3, 128),    # 297 tiles: two whole waves, a tail of 33 over 132 SMs
    (1, 8, 4097, 4097, 1, 128),    # 264 tiles: no tail, the split never runs
    (2, 5, 2000, 3000, 5, 128),    # cross-attention, ragged keys: 160 tiles, a tail of 28
    (1, 8, 1000, 77, 2, 64),       # short context, grouped heads, head_dim 64
    (2, 6, 2500, 2500, 3, 64),
]

CONFIGS = [
    dict(split_tail=True),
    dict(split_tail=True, intra_wg_overlap=False, pingpong=False, q_quant="kernel"),
    dict(split_tail=True, v_layout="kernel", p_source="smem", kv_stages=3),
]


def _config(problem, overrides):
    cfg = dataclasses.replace(wgmma.default("sm_90a", problem), persistent=True, **overrides)
    ok, reason = wgmma.can_implement(cfg, problem, PROFILES["h200"])
    assert ok, reason
    return cfg


@pytest.mark.parametrize("overrides", CONFIGS, ids=lambda o: ",".join(
    f"{k}={v}" for k, v in o.items()))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "b{}-h{}-s{}-kv{}-kvh{}-d{}".format(*s))
def test_the_gate_passes_split_tail(overrides, shape):
    batch, heads, seq, seq_kv, kv_heads, head_dim = shape
    problem = Problem(batch, heads, seq, head_dim, seq_len_kv=seq_kv, kv_heads=kv_heads)
    cfg = _config(problem, overrides)
    seed = int.from_bytes(os.urandom(4), "little")
    report = validate_kernel(wgmma.compile(cfg, problem, "sm_90a"), problem,
                             torch.device("cuda"), seed)
    assert report.passed, f"seed={seed} {cfg.short()}: {report.reason}"


def test_split_tail_agrees_with_the_whole_tiles_and_repeats(tmp_path, monkeypatch):
    """The same inputs with and without the split: outputs within the rounding of a different
    summation order (the merge adds the pieces' fp32 partial sums, each P rounded to e4m3 the
    same way), and two split launches give the same bits (the pieces' slots and the merge's
    order are fixed; counters are zeroed per launch, so a second launch starts clean)."""
    monkeypatch.setenv("TUNER_DB_URL", f"sqlite:///{tmp_path / 'empty.sqlite'}")
    g = torch.Generator(device="cuda").manual_seed(11)
    q, k, v = (torch.randn(2, 2000, 6, 128, device="cuda", generator=g, dtype=torch.bfloat16)
               for _ in range(3))
    problem = Problem(2, 6, 2000, 128)
    whole = dataclasses.replace(_config(problem, {}), split_tail=False)
    split = dataclasses.replace(whole, split_tail=True)
    out, lse = tuner.attention(q, k, v, config=whole, return_lse=True)
    got, got_lse = tuner.attention(q, k, v, config=split, return_lse=True)
    again, again_lse = tuner.attention(q, k, v, config=split, return_lse=True)
    assert torch.equal(got, again) and torch.equal(got_lse, again_lse)
    assert validate(q, k, v, got, got_lse).passed
    assert (got.float() - out.float()).abs().max().item() < 2e-2
    assert (got_lse - lse).abs().max().item() < 1e-3
