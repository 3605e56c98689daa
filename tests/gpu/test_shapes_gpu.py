"""Causal masks, grouped KV heads and cross-attention lengths on the GPU, both families, through
the correctness gate (tuner.gate.validate_kernel: random and structured inputs at the problem's
mask and group size, outputs poisoned with NaN, the fp32 reference on the gate's own
quantization), and end to end through tuner.attention.

Lengths on both axes: one token, inside one tile, ragged across tiles, queries outnumbering keys
(causal: rows that see no key, output 0 and LSE -inf) and keys outnumbering queries (the
diagonal aligned to the bottom right). `-m gpu` runs both families' defaults on every shape and
each other config on one causal and one unmasked shape (a different pair for each); `-m gpu_full`
every config on every shape."""

import os

import pytest
import torch

import tuner
from tests.gpu import tiered
from tuner import runtime
from tuner.gate import validate_kernel
from tuner.gpus import PROFILES
from tuner.problem import Problem
from variants import load_family
from variants.reference import validate

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


def _config(family_name, problem, overrides=None):
    """The family's default for the problem, with overrides."""
    import dataclasses

    cfg = load_family(family_name).default("sm_90a", problem)
    return dataclasses.replace(cfg, **overrides) if overrides else cfg


def _problem(shape, head_dim):
    batch, heads, seq, seq_kv, kv_heads, causal = shape
    return Problem(batch, heads, seq, head_dim, causal, seq_kv, kv_heads)


def _gate_passes(family_name, problem, overrides=None):
    """The family's default for the problem (with overrides) is implementable on the H200 and
    passes the gate there."""
    family = load_family(family_name)
    cfg = _config(family_name, problem, overrides)
    ok, reason = family.can_implement(cfg, problem, PROFILES["h200"])
    assert ok, reason
    seed = int.from_bytes(os.urandom(4), "little")
    report = validate_kernel(family.compile(cfg, problem, "sm_90a"), problem,
                             torch.device("cuda"), seed)
    assert report.passed, f"seed={seed} {cfg.short()}: {report.reason}"


def _config_id(family_name, overrides):
    knobs = ",".join(f"{k}={v}" for k, v in (overrides or {}).items())
    return f"{family_name}-{knobs or 'default'}"


def _shape_id(shape) -> str:
    return "b{}-h{}-s{}-kv{}-kvh{}-{}".format(*shape[:5], "causal" if shape[5] else "full")


def _on_one_causal_and_one_full_shape(configs, shapes):
    """in_gpu for tiered((family, overrides, shape) cases): a default on every shape; the
    other configs, the n-th of them on the n-th causal and the n-th unmasked shape (cycling)."""
    causal = [s for s in shapes if s[5]]
    full = [s for s in shapes if not s[5]]
    others = [c for c in configs if c[1] is not None]

    def in_gpu(_, case) -> bool:
        family_name, overrides, shape = case
        if overrides is None:
            return True
        n = others.index((family_name, overrides))
        return shape in (causal[n % len(causal)], full[n % len(full)])

    return in_gpu


SHAPE_CONFIGS = [(f, o) for f, configs in CONFIGS.items() for o in configs]


@pytest.mark.parametrize("family_name, overrides, shape", tiered(
    [(f, o, s) for f, o in SHAPE_CONFIGS for s in SHAPES],
    _on_one_causal_and_one_full_shape(SHAPE_CONFIGS, SHAPES),
    ids=lambda case: f"{_config_id(*case[:2])}-{_shape_id(case[2])}"))
def test_the_gate_passes_the_kernels_on_every_shape(family_name, overrides, shape):
    _gate_passes(family_name, _problem(shape, 128), overrides)


# head_dim 64: the families' head_dim-64 defaults (wgmma: three consumer warpgroups, P in
# registers; these lengths take the short-key default, so the long-key one and P through shared
# memory are pinned too) with the masks, grouped heads and another key/value length.
SHAPES_HEAD_DIM_64 = [
    (2, 8, 300, 300, 2, True),
    (1, 4, 300, 77, 4, True),     # rows that see no key
    (1, 8, 1000, 77, 2, False),
    (1, 4, 77, 4097, 1, True),
]


HEAD_DIM_64_CONFIGS = [
    ("wgmma", None), ("mma_sync", None), ("wgmma", dict(q_quant="kernel")),
    ("wgmma", dict(intra_wg_overlap=True, pingpong=False, kv_stages=3, q_quant="prepare")),
    ("wgmma", dict(p_source="smem", intra_wg_overlap=True, pingpong=False, kv_stages=4))]


@pytest.mark.parametrize("family_name, overrides, shape", tiered(
    [(f, o, s) for f, o in HEAD_DIM_64_CONFIGS for s in SHAPES_HEAD_DIM_64],
    _on_one_causal_and_one_full_shape(HEAD_DIM_64_CONFIGS, SHAPES_HEAD_DIM_64),
    ids=lambda case: f"{_config_id(*case[:2])}-{_shape_id(case[2])}"))
def test_the_gate_passes_head_dim_64_on_the_new_shapes(family_name, overrides, shape):
    _gate_passes(family_name, _problem(shape, 64), overrides)


def gpu_builds(name, params):
    """The kernels a test here builds (tests/conftest.py compiles them ahead, in parallel)."""
    if "shape" not in params:
        return []
    head_dim = 64 if name == "test_the_gate_passes_head_dim_64_on_the_new_shapes" else 128
    problem = _problem(params["shape"], head_dim)
    return [(params["family_name"], _config(params["family_name"], problem, params["overrides"]),
             problem)]


@pytest.mark.gpu
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
    # Against the reference with the transforms of the config that ran (the default smooths K).
    cfg = runtime.config_for_problem(Problem(2, 32, 700, 128, causal, seq_len_kv=900,
                                             kv_heads=8)).config
    metrics = validate(q, k, v, out, lse, causal=causal, k_smoothing=cfg.k_smoothing,
                       qk_rotation=cfg.qk_rotation)
    assert metrics.passed, metrics.reason
    # The fp8-in path on the gate's own codes gives the bits of the same config on bf16 inputs
    # with the transforms off (codes skip them: its for_q_dtype twin).
    from variants.reference import quantize_reference

    ref = quantize_reference(q, k, v)
    got = tuner.attention_fp8(ref.q, ref.k, ref.v, *ref.entry_descales(), causal=causal)
    plain = tuner.attention(q, k, v, causal=causal, config=cfg.for_q_dtype("float8_e4m3fn"))
    assert torch.equal(got, plain)
