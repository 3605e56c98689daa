"""The gate's own statement of prepare's transforms (CPU): its rotation and key mean, written from
the spec's constants, agree with variants/transforms.py (the rotation to the bit, the mean to
fp32 summation order); its quantization of transformed inputs equals prepare's; a smoothing
vector of another head or batch, a missing one, a wrong rotation flag or a wrong LSE shift is
named as prepare's; the reference LSE carries softmax_scale * q . m."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from variants import transforms
from variants.prepare import quantize_inputs
from variants.prepare_check import declared_transforms, prepare_mismatch
from variants.reference import (
    accuracy,
    quantize_reference,
    reference_attention,
    reference_key_mean,
    reference_rotate,
)
from variants.reference_bounds import LSE_ABS_MAX, LSE_QK_REL, LSE_SHIFT_REL, MEAN_SUM_REL


def _inputs(batch=2, seq=77, seq_kv=150, heads=4, kv_heads=2, head_dim=128, seed=0,
            dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, seq, heads, head_dim, generator=g)
    k = torch.randn(batch, seq_kv, kv_heads, head_dim, generator=g)
    k += 5 * torch.randn(batch, 1, kv_heads, head_dim, generator=g)  # a channel bias
    v = torch.randn(batch, seq_kv, kv_heads, head_dim, generator=g)
    return q.to(dtype), k.to(dtype), v.to(dtype)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_the_gates_rotation_is_the_spec_to_the_bit(head_dim, dtype):
    x = (torch.randn(3, 50, 2, head_dim) * torch.logspace(-3, 3, head_dim)).to(dtype)
    assert torch.equal(reference_rotate(x), transforms.rotate(x))


@pytest.mark.parametrize("seq_kv", [1, 77, 255, 256, 511, 600, 5000])
def test_the_gates_key_mean_takes_the_spec_sample_to_summation_order(seq_kv):
    _, k, _ = _inputs(seq_kv=seq_kv, seed=seq_kv)
    own, spread = reference_key_mean(k)
    stride = max(1, seq_kv // transforms.MEAN_SAMPLE_KEYS)
    keys = list(range(0, seq_kv, stride))
    exact = k[:, keys].double().mean(dim=1)
    assert bool(((own.double() - exact).abs() <= MEAN_SUM_REL / 4 * spread).all())
    theirs = transforms.smoothing_vector(k)
    assert bool(((theirs - own).abs() <= MEAN_SUM_REL * spread).all())
    torch.testing.assert_close(spread, k[:, keys].float().abs().mean(dim=1))


KNOBS = [("off", "none"), ("mean", "none"), ("off", "hadamard"), ("mean", "hadamard")]


@pytest.mark.parametrize(("k_smoothing", "qk_rotation"), KNOBS)
@pytest.mark.parametrize("layout", [dict(pad_to=64, permute_keys=True),
                                    dict(pad_to=128, v_feature_major=False)],
                         ids=["permuted", "natural"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_gates_own_quantization_of_transformed_inputs_is_prepares(k_smoothing, qk_rotation,
                                                                      layout, dtype):
    q, k, v = _inputs(dtype=dtype)
    prepared = quantize_inputs(q, k, v, softmax_scale=0.07, k_smoothing=k_smoothing,
                               qk_rotation=qk_rotation, **layout)
    k_mean, problem = declared_transforms(prepared, k, k_smoothing, qk_rotation)
    assert problem is None
    assert (k_mean is None) == (k_smoothing == "off")
    ref = quantize_reference(q, k, v, 0.07, k_mean=k_mean, rotate=qk_rotation == "hadamard")
    assert prepare_mismatch(prepared, ref) is None
    # The other transforms' codes are not these: the check is not blind to them.
    other = quantize_reference(q, k, v, 0.07, k_mean=None if k_mean is not None
                               else transforms.smoothing_vector(k), rotate=qk_rotation == "none")
    assert "prepare: " in prepare_mismatch(prepared, other)


def test_a_wrong_or_missing_smoothing_vector_or_rotation_is_named_as_prepares():
    q, k, v = _inputs()
    prepared = quantize_inputs(q, k, v, pad_to=64, k_smoothing="mean")
    m = prepared.k_mean
    for wrong, where in ((m.roll(1, dims=1), "KV head"), (m.roll(1, dims=0), "batch 0")):
        _, bad = declared_transforms(dataclasses.replace(prepared, k_mean=wrong), k, "mean",
                                     "none")
        assert bad.startswith("prepare: the smoothing vector") and where in bad, bad
    # One value off by 2^-10 of the keys' mean |k| (8x the tolerance) is enough.
    assert MEAN_SUM_REL <= 2.0**-13
    nudged = m.clone()
    own, spread = reference_key_mean(k)
    nudged[1, 0, 5] += 2.0**-10 * spread[1, 0, 5]
    _, bad = declared_transforms(dataclasses.replace(prepared, k_mean=nudged), k, "mean", "none")
    assert "batch 1 KV head 0" in bad and "feature 5" in bad, bad
    _, bad = declared_transforms(dataclasses.replace(prepared, k_mean=None), k, "mean", "none")
    assert "declare no smoothing vector" in bad
    _, bad = declared_transforms(prepared, k, "off", "none")
    assert "k_smoothing is 'off'" in bad
    _, bad = declared_transforms(prepared, k, "mean", "hadamard")
    assert "not declared rotated" in bad


def test_a_prepare_that_smooths_k_with_another_heads_mean_fails_on_its_codes():
    """Subtracting another head's mean while declaring the right one: the gate quantizes
    k - m_declared itself, so k's codes differ."""
    from tests.doubles.planted import _requantize_k

    q, k, v = _inputs()
    prepared = quantize_inputs(q, k, v, pad_to=64, k_smoothing="mean")
    _requantize_k(prepared, k.float() - prepared.k_mean.roll(1, dims=1)[:, None])
    k_mean, problem = declared_transforms(prepared, k, "mean", "none")
    assert problem is None
    bad = prepare_mismatch(prepared, quantize_reference(q, k, v, k_mean=k_mean))
    assert bad is not None and bad.startswith("prepare: k") and "differ" in bad, bad


def test_a_wrong_lse_shift_in_prepare_is_named():
    q, k, v = _inputs()
    prepared = quantize_inputs(q, k, v, pad_to=64, k_smoothing="mean")
    ref = quantize_reference(q, k, v, k_mean=prepared.k_mean)
    assert prepare_mismatch(prepared, ref) is None
    rolled = dataclasses.replace(prepared, q_dot_mean=prepared.q_dot_mean.roll(1, dims=1))
    bad = prepare_mismatch(rolled, ref)
    assert bad is not None and "LSE shift" in bad and bad.startswith("prepare:"), bad


def test_the_reference_lse_is_the_callers_with_the_gates_own_shift():
    """softmax_scale * q . m from the caller's q, added to the LSE of the smoothed codes: the
    LSE of the caller's inputs up to FP8 rounding (without it, off by the shift itself)."""
    q, k, v = _inputs(batch=1, seq=40, seq_kv=90)
    scale = 0.1
    m = transforms.smoothing_vector(k)
    smoothed = quantize_reference(q, k, v, scale, k_mean=m)
    ref = reference_attention(smoothed, causal=True)
    bare = reference_attention(dataclasses.replace(smoothed, lse_shift=None), causal=True)
    want_shift = scale * torch.einsum("bshd,bhd->bhs", q.float(), m.repeat_interleave(2, 1))
    torch.testing.assert_close(ref.lse - bare.lse, want_shift, rtol=1e-5, atol=1e-5)
    group_k = k.float().repeat_interleave(2, 2)
    scores = torch.einsum("bshd,bthd->bhst", q.float(), group_k) * scale
    keys = torch.arange(90)[None, :] > torch.arange(40)[:, None] + 50
    true_lse = scores.masked_fill(keys, float("-inf")).logsumexp(-1)
    assert float((ref.lse - true_lse).abs().max()) < 0.1
    assert float((bare.lse - true_lse).abs().max()) > 1.0
    # The shift's rounding enters the LSE bound: scale * sum_d |q_d m_d|.
    assert ref.shift_magnitude is not None and bare.shift_magnitude is None
    magnitude = scale * torch.einsum("bshd,bhd->bhs", q.float().abs(),
                                     m.abs().repeat_interleave(2, 1))
    torch.testing.assert_close(ref.shift_magnitude, magnitude, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("fraction", "passes"), [(0.9, True), (1.2, False)])
def test_the_lse_bound_grows_with_the_shift_magnitude(fraction, passes):
    """A bias of 1e4 in k: smoothing leaves small scores, and the shift's rounding term is
    most of the bound."""
    q, k, v = _inputs(batch=1, seq=30, seq_kv=30, dtype=torch.float32)
    k += 1e4 * torch.randn(1, 1, 2, 128, generator=torch.Generator().manual_seed(1))
    ref = reference_attention(quantize_reference(q, k, v, k_mean=transforms.smoothing_vector(k)))
    shift_term = LSE_SHIFT_REL * ref.shift_magnitude
    bound = LSE_ABS_MAX + LSE_QK_REL * ref.score_magnitude + shift_term
    assert bool((shift_term > 0.5 * bound).all())
    metrics = accuracy(ref.out.bfloat16(), ref.lse + fraction * bound, ref)
    assert metrics.passed == passes, metrics.reason


@pytest.mark.parametrize(("kind", "fraction", "passes"), [
    ("realistic", 0.9, True), ("realistic", 1.2, False), ("randn", 1.2, False)])
def test_the_row_bound_takes_the_accumulators_error_only_on_large_scores(kind, fraction, passes):
    """Scores of magnitude above ROW_QK_COVERED (the realistic kind without smoothing: ~250)
    widen a row's scale by (LSE_QK_REL / ROW_REL_MAX) x the excess x the V rows' spread; unit
    inputs (~7) keep the plain scale, so their rows are checked at the plain bound."""
    from tuner.activations import activations
    from tuner.problem import Problem
    from variants.reference_bounds import ROW_QK_COVERED, ROW_REL_MAX

    problem = Problem(1, 2, 60, 128)
    q, k, v = activations(kind, problem, "cpu", seed=2)
    ref = reference_attention(quantize_reference(q, k, v))
    excess = (ref.score_magnitude - ROW_QK_COVERED).clamp_min(0)
    assert bool((excess > 0).all()) == (kind == "realistic")
    plain = torch.maximum(ref.out.norm(dim=-1).transpose(1, 2), ref.noise)
    scale = plain + LSE_QK_REL / ROW_REL_MAX * excess * ref.v_spread
    # Every row moved along one direction by `fraction` of its allowed error.
    direction = torch.zeros_like(ref.out)
    direction[..., 0] = 1.0
    moved = ref.out + direction * (fraction * ROW_REL_MAX * scale).transpose(1, 2)[..., None]
    metrics = accuracy(moved, ref.lse, ref)
    assert (metrics.worst_row <= ROW_REL_MAX) == passes, metrics.worst_row
