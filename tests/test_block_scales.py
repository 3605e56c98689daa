"""Block scales (variants/block_scales.py): the one-pass quantization formula and the folded
softmax arithmetic the kernels would run, against plain fp32 attention (CPU)."""

import math

import pytest
import torch

from variants.block_scales import (
    E4M3_MAX,
    KV_BLOCK,
    dequantize,
    folded_attention,
    quantize_key_blocks,
    quantize_rows,
)


def attention(q, k, v, *, causal=False):
    """fp32 softmax attention, (batch, seq, heads, dim) in and out, LSE (batch, heads, seq);
    grouped KV heads by repetition, causal aligned to the bottom right, empty rows 0 / -inf."""
    heads, kv_heads = q.shape[2], k.shape[2]
    q, k, v = (x.float().permute(0, 2, 1, 3) for x in (q, k, v))
    k, v = (x.repeat_interleave(heads // kv_heads, dim=1) for x in (k, v))
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        seq, seq_kv = s.shape[-2:]
        hidden = torch.arange(seq_kv)[None, :] > torch.arange(seq)[:, None] + (seq_kv - seq)
        s = s.masked_fill(hidden, -math.inf)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.where(torch.isinf(lse)[..., None], torch.zeros_like(s),
                    torch.exp(s - lse[..., None]))
    return (p @ v).permute(0, 2, 1, 3), lse


def rel_rms(a, b):
    return float((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt())


def quantize(q, k, v):
    (q8, dq), (k8, dk), (v8, dv) = quantize_rows(q), quantize_key_blocks(k), quantize_key_blocks(v)
    return q8, dq, k8, dk, v8, dv


def test_every_row_and_block_reaches_the_top_of_e4m3():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 77, 3, 64, generator=g) * torch.rand(2, 77, 3, 1, generator=g) * 10
    q8, dq = quantize_rows(q)
    assert dq.shape == (2, 77, 3)
    assert torch.equal(q8.float().abs().amax(dim=-1), torch.full((2, 77, 3), E4M3_MAX))
    k8, dk = quantize_key_blocks(q)
    assert dk.shape == (2, -(-77 // KV_BLOCK), 3)
    blocks = torch.zeros(2, 128, 3, 64)
    blocks[:, :77] = k8.float().abs()
    assert torch.equal(blocks.view(2, 2, 64, 3, 64).amax(dim=(2, 4)), torch.full((2, 2, 3),
                                                                                 E4M3_MAX))
    # Each code decodes to within e4m3's half ulp of its input: 2^-4 relative, or half the
    # subnormal spacing 2^-9 of its block's scale.
    _, deq_k, _ = dequantize(q8, dq, k8, dk, k8, dk)
    per_key = dk.repeat_interleave(KV_BLOCK, dim=1)[:, :77, :, None]
    assert bool(((deq_k - q).abs() <= q.abs() * 2**-4 + per_key * 2**-10 + 1e-7).all())


SHAPES = [  # (batch, seq, heads, seq_kv, kv_heads, causal, block_n)
    (1, 200, 4, 200, 4, False, 128),
    (2, 77, 4, 300, 2, True, 64),    # bottom-right diagonal, grouped heads, ragged blocks
    (1, 300, 2, 77, 1, True, 192),   # 223 rows see no key
    (1, 129, 2, 1, 2, False, 128),   # one key
    (1, 90, 2, 150, 2, True, 32),    # strips inside one scale block (mma_sync's default)
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "b{}-s{}-h{}-kv{}-kvh{}-{}-n{}".format(
    *s[:5], "causal" if s[5] else "full", s[6]))
def test_the_folded_softmax_is_attention_on_the_dequantized_inputs(shape):
    batch, seq, heads, seq_kv, kv_heads, causal, block_n = shape
    g = torch.Generator().manual_seed(seq + seq_kv)
    q = torch.randn(batch, seq, heads, 64, generator=g)
    # V blocks of very different magnitudes: a fold that mixes their scales up is far off.
    k = torch.randn(batch, seq_kv, kv_heads, 64, generator=g)
    v = torch.randn(batch, seq_kv, kv_heads, 64, generator=g) * torch.logspace(
        -2, 1, seq_kv)[None, :, None, None]
    codes = quantize(q, k, v)
    out, lse = folded_attention(*codes, softmax_scale=64**-0.5, block_n=block_n, causal=causal)
    ref_out, ref_lse = attention(*dequantize(*codes), causal=causal)
    seen = ~torch.isinf(ref_lse)
    # P' rounded to e4m3 is the only rounding beyond the reference's: 2^-4 relative at most.
    assert rel_rms(out, ref_out) < 2**-4
    assert torch.equal(torch.isinf(lse), ~seen)
    assert float((lse[seen] - ref_lse[seen]).abs().max()) < 1e-4
    blind = ~seen.permute(0, 2, 1)  # (batch, seq, heads): rows that see no key
    assert torch.equal(out[blind], torch.zeros_like(out[blind]))


def per_head_error(q, k, v, causal):
    """End-to-end error (relative RMS, worst row) of today's per-head scales (amax per (batch,
    head), the same formula), emulated with the same folded arithmetic: one scale a head is a
    block scale repeated."""
    def per_head(x):
        amax = x.abs().amax(dim=(1, 3), keepdim=True).clamp_min(1e-12)
        return (x * (E4M3_MAX / amax)).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn), \
            amax / E4M3_MAX

    (q8, dq), (k8, dk), (v8, dv) = (per_head(x) for x in (q, k, v))
    blocks = -(-k.shape[1] // KV_BLOCK)
    out, _ = folded_attention(q8, dq[:, 0, :, 0][:, None].expand(-1, q.shape[1], -1),
                              k8, dk[:, 0, :, 0][:, None].expand(-1, blocks, -1),
                              v8, dv[:, 0, :, 0][:, None].expand(-1, blocks, -1),
                              softmax_scale=q.shape[-1] ** -0.5, causal=causal)
    ref = attention(q, k, v, causal=causal)[0]
    return rel_rms(out, ref), float(((out - ref).norm(dim=-1) / ref.norm(dim=-1)).max())


def test_block_scales_are_as_accurate_as_per_head_on_random_inputs():
    """End to end against fp32 attention on the original inputs: the e4m3 rounding of P (2^-4)
    dominates both, and e4m3's normal range (2^-6 .. 448, four decades) keeps the bits of
    tokens a head's amax would otherwise squeeze, so finer scales change little here."""
    ours, theirs = [], []
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        q, k, v = (torch.randn(1, 512, 2, 128, generator=g) for _ in range(3))
        out, _ = folded_attention(*quantize(q, k, v), softmax_scale=128**-0.5)
        ours.append(rel_rms(out, attention(q, k, v)[0]))
        theirs.append(per_head_error(q, k, v, causal=False)[0])
    assert sum(ours) <= sum(theirs) * 1.02, (ours, theirs)


def test_a_quiet_block_keeps_its_bits_where_a_head_scale_loses_them():
    """Causal, the first 64 values a million times smaller than the rest: rows 0-63 see only
    them. A head's scale puts them below e4m3's smallest subnormal (their output is lost, row
    error 1); their block's own scale keeps them at the usual few percent."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 256, 2, 128, generator=g) for _ in range(3))
    v[:, :KV_BLOCK] *= 1e-6
    out, _ = folded_attention(*quantize(q, k, v), softmax_scale=128**-0.5, causal=True)
    ref = attention(q, k, v, causal=True)[0]
    worst = float(((out - ref).norm(dim=-1) / ref.norm(dim=-1)).max())
    _, head_worst = per_head_error(q, k, v, causal=True)
    assert head_worst > 0.5 and worst < 0.15, (worst, head_worst)
