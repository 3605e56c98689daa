"""Causal masks, grouped KV heads and cross-attention lengths on the GPU, both families, through
the correctness gate (tuner.gate.validate_kernel: random and structured inputs at the problem's
mask and group size, outputs poisoned with NaN, the fp32 reference on the gate's own
quantization), and end to end through tuner.attention.

Lengths on both axes: one token, inside one tile, ragged across tiles, queries outnumbering keys
(causal: rows that see no key, output 0 and LSE -inf) and keys outnumbering queries (the
diagonal aligned to the bottom right)."""

import os

import pytest
import torch

import tuner
from tuner import runtime
from tuner.gate import validate_kernel
from tuner.gpus import PROFILES
from tuner.problem import Problem
from variants import load_family
from variants.reference import validate

pytestmark = pytest.mark.gpu

# (batch, heads, seq_len, seq_len_kv, kv_heads, causal)
SHAPES = [
    (1, 4, 1, 1, 4, True),
    (1, 4, 77, 77, 4, True),
    (2, 4, 300, 300, 2, True),
    (1, 8, 1000, 1000, 2, True),
    (1, 4, 300, 77, 4, True),    # 223 rows see no key
    (1, 4, 77, 300, 4, True),    # every row sees the first 223 keys
    (1, 4, 513, 1, 1, True),
    (1, 8, 1000, 77, 2, False),  # cross-attention to a short context, grouped KV heads
    (1, 4, 1, 513, 4, False),
    (1, 8, 4097, 4097, 1, False),  # one KV head for all
    (1, 4, 4097, 4097, 4, True),
]

# The defaults, and for wgmma the other V layout and the non-overlapped, non-persistent loop
# (the masks and the strip count sit in each of the consumer's two main loops and in the V
# transposing producer warps), every tile order on every shape (the default takes
# longest_first with a causal mask, per_head without), and pingpong on.
CONFIGS = {
    "wgmma": [None, dict(v_layout="kernel", p_source="smem"),
              dict(intra_wg_overlap=False, pingpong=False, persistent=False, split_tail=False),
              dict(tile_order="per_head"), dict(tile_order="longest_first"),
              # The causal default turns pingpong off up to 8192 keys at head_dim 128
              # (wgmma.defaults.CAUSAL_SHORT_KEYS_UP_TO); longer causal problems keep it on.
              dict(pingpong=True),
              # Both Q placements pinned (the default picks one by the key length,
              # wgmma.defaults.Q_IN_KERNEL_UP_TO): rows past seq_len, GQA heads, both loops.
              dict(q_quant="prepare"), dict(q_quant="kernel"),
              dict(q_quant="kernel", intra_wg_overlap=False, pingpong=False, persistent=False,
                   split_tail=False,
                   p_source="smem")],
    "mma_sync": [None],
}


def _gate_passes(family_name, problem, overrides=None):
    """The family's default for the problem (with overrides) is implementable on the H200 and
    passes the gate there."""
    import dataclasses

    family = load_family(family_name)
    cfg = family.default("sm_90a", problem)
    cfg = dataclasses.replace(cfg, **overrides) if overrides else cfg
    ok, reason = family.can_implement(cfg, problem, PROFILES["h200"])
    assert ok, reason
    seed = int.from_bytes(os.urandom(4), "little")
    report = validate_kernel(family.compile(cfg, problem, "sm_90a"), problem,
                             torch.device("cuda"), seed)
    assert report.passed, f"seed={seed} {cfg.short()}: {report.reason}"


def _config_id(family_name, overrides):
    knobs = ",".join(f"{k}={v}" for k, v in (overrides or {}).items())
    return f"{family_name}-{knobs or 'default'}"


@pytest.mark.parametrize("family_name, overrides",
                         [pytest.param(f, o, id=_config_id(f, o))
                          for f, configs in CONFIGS.items() for o in configs])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "b{}-h{}-s{}-kv{}-kvh{}-{}".format(
    *s[:5], "causal" if s[5] else "full"))
def test_the_gate_passes_the_kernels_on_every_shape(family_name, overrides, shape):
    batch, heads, seq, seq_kv, kv_heads, causal = shape
    _gate_passes(family_name, Problem(batch, heads, seq, seq_len_kv=seq_kv, kv_heads=kv_heads,
                                      causal=causal), overrides)


# head_dim 64: the families' head_dim-64 defaults (wgmma: three consumer warpgroups, P in
# registers; these lengths take the short-key default, so the long-key one and P through shared
# memory are pinned too) with the masks, grouped heads and another key/value length.
SHAPES_HEAD_DIM_64 = [
    (2, 8, 300, 300, 2, True),
    (1, 4, 300, 77, 4, True),     # rows that see no key
    (1, 8, 1000, 77, 2, False),
    (1, 4, 77, 4097, 1, True),
]


@pytest.mark.parametrize("family_name, overrides",
                         [pytest.param(f, o, id=_config_id(f, o)) for f, o in
                          (("wgmma", None), ("mma_sync", None), ("wgmma", dict(q_quant="kernel")),
                           ("wgmma", dict(intra_wg_overlap=True, pingpong=False, kv_stages=3,
                                          q_quant="prepare")),
                           ("wgmma", dict(p_source="smem", intra_wg_overlap=True,
                                          pingpong=False, kv_stages=4)))])
@pytest.mark.parametrize("shape", SHAPES_HEAD_DIM_64, ids=lambda s: "b{}-h{}-s{}-kv{}-kvh{}-{}"
                         .format(*s[:5], "causal" if s[5] else "full"))
def test_the_gate_passes_head_dim_64_on_the_new_shapes(family_name, overrides, shape):
    batch, heads, seq, seq_kv, kv_heads, causal = shape
    _gate_passes(family_name, Problem(batch, heads, seq, 64, causal, seq_kv, kv_heads),
                 overrides)


@pytest.mark.parametrize("causal", [False, True])
def test_attention_end_to_end_with_grouped_heads_and_its_own_kv_length(causal, tmp_path,
                                                                        monkeypatch):
    monkeypatch.setenv("TUNER_DB_URL", f"sqlite:///{tmp_path / 'empty.sqlite'}")
    runtime.clear_cache()
    g = torch.Generator(device="cuda").manual_seed(3)
    q = torch.randn(2, 700, 32, 128, device="cuda", generator=g, dtype=torch.bfloat16)
    k, v = (torch.randn(2, 900, 8, 128, device="cuda", generator=g, dtype=torch.bfloat16)
            for _ in range(2))
    out, lse = tuner.attention(q, k, v, causal=causal, return_lse=True)
    assert out.shape == q.shape and lse.shape == (2, 32, 700)
    metrics = validate(q, k, v, out, lse, causal=causal)
    assert metrics.passed, metrics.reason
    # The fp8-in path on the gate's own codes gives the same bits.
    from variants.reference import quantize_reference

    ref = quantize_reference(q, k, v)
    got = tuner.attention_fp8(ref.q, ref.k, ref.v, *ref.entry_descales(), causal=causal)
    assert torch.equal(got, out)
