"""The fp32 reference and the gate's metrics for causal masks, other key/value lengths and grouped
KV heads, against a dense torch implementation built independently: SDPA with an explicit boolean
mask (tril of a ones matrix) and K/V repeated per query head with repeat_interleave."""

import math

import pytest
import torch
import torch.nn.functional as F

from tests.doubles.dense import dense_attention
from variants.reference import (
    accuracy,
    end_to_end_error,
    quantize_reference,
    reference_attention,
    validate,
)
from variants.reference_bounds import (
    HEAD_SLOPE_MAX,
    REL_RMS_MAX,
    ROW_FLOOR_PER_SQRT_KEY,
    ROW_REL_MAX,
)

# (seq_len, seq_len_kv, heads, kv_heads, causal): lengths off every multiple of 16, the queries
# longer than the keys (causal: leading rows that see nothing) and shorter, group sizes 1-8.
SHAPES = [
    (77, 77, 4, 4, True),
    (100, 37, 8, 2, True),  # 63 rows see no key
    (37, 100, 8, 4, True),
    (50, 130, 8, 1, False),
    (130, 50, 8, 8, False),
    (1, 300, 2, 1, True),  # one query, sees every key
    (300, 1, 2, 2, True),  # only the last query sees the one key
    (33, 33, 8, 1, True),
]
IDS = [f"sq{s}-skv{kv}-h{h}/{hk}-{'causal' if c else 'full'}" for s, kv, h, hk, c in SHAPES]


def qkv(seq, seq_kv, heads, kv_heads, batch=2, dim=64, seed=3):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, seq, heads, dim, generator=g)
    k, v = (torch.randn(batch, seq_kv, kv_heads, dim, generator=g) for _ in range(2))
    return q.bfloat16(), k.bfloat16(), v.bfloat16()


def dense(ref_in, causal):
    """(out, lse, p, visible) of fp32 attention on the dequantized codes, (batch, heads, ...)."""
    q, k, v = (x.transpose(1, 2) for x in ref_in.dequantized())  # (batch, heads, seq, dim)
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    sq, skv = q.shape[2], k.shape[2]
    visible = torch.ones(sq, skv, dtype=torch.bool)
    if causal:
        visible = visible.tril(diagonal=skv - sq)  # key j visible to query i iff j - i <= skv - sq
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=visible, scale=ref_in.softmax_scale)
    scores = (q @ k.transpose(-1, -2) * ref_in.softmax_scale).masked_fill(~visible, -math.inf)
    p = torch.softmax(scores, -1).nan_to_num(0.0)
    return out, torch.logsumexp(scores, -1), p, visible, k, v, q


@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
def test_reference_matches_dense_masked_attention(shape):
    sq, skv, heads, kv_heads, causal = shape
    ref_in = quantize_reference(*qkv(sq, skv, heads, kv_heads))
    # A small budget: several query chunks per head, each with its slice of the mask.
    ref = reference_attention(ref_in, causal=causal, score_budget_bytes=9 * skv * 16)
    out, lse, p, visible, k, v, q = dense(ref_in, causal)
    empty = int((~visible.any(-1)).sum())
    assert empty == (max(0, sq - skv) if causal else 0) == ref.empty_rows
    sees = slice(empty, None)
    torch.testing.assert_close(ref.out.transpose(1, 2)[:, :, sees], out[:, :, sees], atol=2e-6,
                               rtol=1e-5)
    torch.testing.assert_close(ref.lse[..., sees], lse[..., sees], atol=2e-6, rtol=1e-6)
    # Rows that see no key: exactly 0 and -inf (SDPA leaves them NaN).
    assert bool((ref.out[:, :empty] == 0).all()) and bool((ref.lse[..., :empty] == -math.inf).all())
    # The metrics' statistics run over the visible keys only.
    torch.testing.assert_close(ref.noise, ((p * p) @ (v * v).sum(-1, keepdim=True))[..., 0].sqrt(),
                               atol=1e-6, rtol=1e-5)
    abs_scores = (q.abs() @ k.abs().transpose(-1, -2)) * ref_in.softmax_scale
    torch.testing.assert_close(ref.score_magnitude, (p * abs_scores).sum(-1), atol=1e-5,
                               rtol=1e-5)
    torch.testing.assert_close(ref.visible_v_norm,
                               ((v * v).sum(-1)[..., None, :] * visible).sum(-1).sqrt(),
                               atol=1e-5, rtol=1e-5)


def test_unmasked_floor_is_sqrt_s_times_the_v_rms():
    # The threshold block's floor, 2^-16 sqrt(S) RMS|v|, for an unmasked row.
    ref_in = quantize_reference(*qkv(20, 50, 4, 2))
    ref = reference_attention(ref_in)
    v = ref_in.dequantized()[2]
    rms = (v * v).sum(-1).mean(1).sqrt().repeat_interleave(2, dim=1)  # (batch, heads)
    want = (math.sqrt(50) * rms)[..., None].expand(-1, -1, 20)
    torch.testing.assert_close(ref.visible_v_norm, want)
    assert ROW_FLOOR_PER_SQRT_KEY == 2.0**-16


@pytest.mark.parametrize("group", [1, 2, 4, 8])
def test_kv_descales_are_per_kv_head_and_64_keys(group):
    q, k, v = qkv(40, 24, 8, 8 // group)
    k[1, :, -1] *= 50  # one KV head with its own range
    ref_in = quantize_reference(q, k, v)
    kv_heads = 8 // group
    assert ref_in.scales.q.shape == (2, 8, 40) and ref_in.k.shape == k.shape == ref_in.v.shape
    for name, x in (("k", k), ("v", v)):
        scales = getattr(ref_in.scales, name)
        assert scales.shape == (2, kv_heads, 1)  # 24 keys: one block of 64
        torch.testing.assert_close(scales[..., 0], x.float().abs().amax(dim=(1, 3)) / 448.0)
    kd = ref_in.dequantized()[1]
    assert kd.shape == k.shape
    torch.testing.assert_close(kd, k.float(), rtol=2**-3, atol=float(k.abs().max()) * 2**-9)


def test_a_row_subset_of_a_causal_reference_is_those_rows():
    ref_in = quantize_reference(*qkv(90, 40, 4, 2))
    rows = torch.tensor([0, 49, 50, 51, 89])  # empty, empty, the first that sees a key, ...
    whole = reference_attention(ref_in, causal=True)
    part = reference_attention(ref_in, rows, causal=True)
    torch.testing.assert_close(part.out, whole.out[:, rows])
    torch.testing.assert_close(part.lse, whole.lse[..., rows])
    torch.testing.assert_close(part.visible_v_norm, whole.visible_v_norm[..., rows])


def _p_rounded(ref_in, causal):
    """What a correct FP8 kernel computes, masked: P * 256 rounded to e4m3 before P @ V; rows
    that see no key written as 0 and -inf."""
    out, lse, p, visible, k, v, q = dense(ref_in, causal)
    s = (q @ k.transpose(-1, -2) * ref_in.softmax_scale).masked_fill(~visible, -math.inf)
    m = s.amax(-1, keepdim=True).nan_to_num(0.0, neginf=0.0)
    e = torch.exp(s - m)
    e8 = (e * 256).to(torch.float8_e4m3fn).float() / 256
    o = (e8 @ v) / e.sum(-1, keepdim=True).clamp_min(1e-30)
    return o.transpose(1, 2).bfloat16(), lse


@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
def test_an_fp8_p_kernel_passes_on_every_shape(shape):
    """The thresholds' derivations hold per row over the visible keys: the rounding a correct
    kernel makes stays within every bound, and its empty rows pass exactly."""
    sq, skv, heads, kv_heads, causal = shape
    q, k, v = qkv(sq, skv, heads, kv_heads, seed=11)
    out, lse = _p_rounded(quantize_reference(q, k, v), causal)
    m = validate(q, k, v, out, lse, causal=causal)
    assert m.passed, m.reason
    assert m.nonfinite == 0 and m.empty_row_errors == 0
    assert m.worst_row < ROW_REL_MAX / 2 and m.head_slope_error < HEAD_SLOPE_MAX / 2


def _ref_out(shape, seed=5):
    sq, skv, heads, kv_heads, causal = shape
    ref_in = quantize_reference(*qkv(sq, skv, heads, kv_heads, seed=seed))
    ref = reference_attention(ref_in, causal=causal)
    return ref_in, ref, ref.out.clone(), ref.lse.clone()


def test_rows_that_see_no_key_must_be_exactly_zero_and_minus_inf():
    _, ref, out, lse = _ref_out((100, 37, 8, 2, True))
    assert accuracy(out, lse, ref).passed
    written = out.clone()
    written[1, 10, 3, 5] = 1e-3  # a small value where nothing may be
    m = accuracy(written, lse, ref)
    assert not m.passed and m.empty_row_errors == 1
    assert "no visible key" in m.reason and "batch 1 head 3 row 10" in m.reason
    finite = lse.clone()
    finite[0, 2, 62] = 0.0  # the last empty row's LSE as if it saw a key
    m = accuracy(out, finite, ref)
    assert "no visible key" in m.reason and "batch 0 head 2 row 62: LSE 0" in m.reason
    unwritten = lse.clone()
    unwritten[0, 0, 0] = float("nan")
    assert "non-finite: 1" in accuracy(out, unwritten, ref).reason


def test_empty_rows_are_checked_even_where_the_reference_samples_rows():
    ref_in, _, out, lse = _ref_out((100, 37, 8, 2, True))
    rows = torch.tensor([70, 80, 99])  # none of the empty rows 0..62
    part = reference_attention(ref_in, rows, causal=True)
    assert accuracy(out, lse, part).passed
    out[0, 30, 0, 0] = 0.5
    assert "no visible key" in accuracy(out, lse, part).reason
    # A -inf LSE outside the empty rows is a non-finite value, not a right one.
    lse[0, 0, 63] = float("-inf")
    out[0, 30, 0, 0] = 0.0
    assert "non-finite" in accuracy(out, lse, part).reason


@pytest.mark.parametrize("bug, shape", [
    (dict(diagonal_shift=1), (77, 77, 4, 4, True)),  # each row also sees the next key
    (dict(diagonal_shift=-1), (77, 77, 4, 4, True)),  # ... or misses its own
    (dict(diagonal_shift=1), (37, 100, 8, 4, True)),
    (dict(top_left=True), (37, 100, 8, 4, True)),  # aligned to the top left (torch's is_causal)
    (dict(top_left=True), (100, 37, 8, 2, True)),
    (dict(kv_head=lambda h, group, kv: h % kv), (50, 130, 8, 2, False)),  # interleaved groups
    (dict(kv_head=lambda h, group, kv: 0), (33, 33, 8, 2, True)),  # one KV head for all
], ids=["causal+1", "causal-1", "cross-causal+1", "top-left", "top-left-long-q",
        "kv-head-interleaved", "kv-head-0"])
def test_mask_and_kv_head_bugs_fail(bug, shape):
    ref_in, ref, _, _ = _ref_out(shape)
    out, lse = dense_attention(ref_in, shape[-1], **bug)
    m = accuracy(out.bfloat16(), lse, ref)
    assert not m.passed, "a planted mask or KV-head bug passed the gate's metrics"
    # and the same dense computation without the bug passes
    good, good_lse = dense_attention(ref_in, shape[-1])
    ok = accuracy(good.bfloat16(), good_lse, ref)
    assert ok.passed, ok.reason
    assert m.rel_rms > REL_RMS_MAX or m.worst_row > ROW_REL_MAX or m.empty_row_errors \
        or m.nonfinite


def test_end_to_end_error_masks_and_groups_like_the_reference():
    q, k, v = qkv(100, 37, 8, 2)
    ref_in = quantize_reference(q, k, v)
    out = reference_attention(ref_in, causal=True).out
    e2e = end_to_end_error(out, q, k, v, causal=True)
    assert 0.005 < e2e < 0.15  # FP8 quantization of q, k, v: a few percent, not zero
    # Unmasked, the same output is far off: the mask is applied.
    assert end_to_end_error(out, q, k, v) > 0.3


def test_shapes_the_reference_cannot_pair_are_refused():
    q, k, v = qkv(10, 12, 6, 4)
    with pytest.raises(ValueError, match="6 query heads are not a multiple of 4 KV heads"):
        quantize_reference(q, k, v)
    q, k, v = qkv(10, 12, 8, 4)
    with pytest.raises(ValueError, match="k and v must match each other"):
        quantize_reference(q, k, v[:, :5])
