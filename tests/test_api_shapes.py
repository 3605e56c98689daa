"""tuner.attention / attention_fp8 inputs with their own key/value length and head count: the
shape checks (variants/prepare.py) accept them and name what is wrong otherwise; the Problem
built from them; the op's shapes without a GPU (meta tensors)."""

import pytest
import torch

import tuner
from tuner.errors import TunerError
from tuner.problem import Problem
from tuner.runtime import problem_of
from variants.prepare import check_fp8_qkv, check_qkv, quantize_inputs


def tensors(q_shape, kv_shape, dtype=torch.bfloat16, device="meta"):
    q = torch.empty(q_shape, dtype=dtype, device=device)
    k, v = (torch.empty(kv_shape, dtype=dtype, device=device) for _ in range(2))
    return q, k, v


@pytest.mark.parametrize("q_shape, kv_shape", [
    ((1, 100, 32, 128), (1, 100, 8, 128)),  # GQA 4
    ((2, 4608, 24, 128), (2, 512, 24, 128)),  # cross-attention
    ((1, 37, 8, 64), (1, 1000, 1, 64)),  # multi-query, longer keys
    ((1, 1, 4, 128), (1, 1, 4, 128)),
])
def test_own_key_value_shapes_are_accepted_and_make_the_problem(q_shape, kv_shape):
    q, k, v = tensors(q_shape, kv_shape)
    check_qkv(q, k, v, require_cuda=True, check_finite=False)
    p = problem_of(q, k, causal=True)
    assert p == Problem(q_shape[0], q_shape[2], q_shape[1], q_shape[3], True, kv_shape[1],
                        kv_shape[2])
    out, lse = tuner.attention(q, k, v, causal=True, return_lse=True)
    assert out.shape == q_shape and out.dtype == torch.bfloat16
    assert lse.shape == (q_shape[0], q_shape[2], q_shape[1]) and lse.dtype == torch.float32


@pytest.mark.parametrize("q_shape, k_shape, v_shape, message", [
    ((1, 100, 32, 128), (1, 100, 8, 128), (1, 90, 8, 128),
     r"k and v shapes differ: \(1, 100, 8, 128\), \(1, 90, 8, 128\); each key has its value"),
    ((1, 100, 32, 128), (2, 100, 8, 128), (2, 100, 8, 128),
     "q has batch 1, k and v 2: each sequence attends to its own keys"),
    ((1, 100, 32, 128), (1, 100, 8, 64), (1, 100, 8, 64),
     "q has head_dim 128, k and v 64: q . k needs one head_dim"),
    ((1, 100, 32, 128), (1, 100, 12, 128), (1, 100, 12, 128),
     "q has 32 heads, k and v 12: the query heads must be a multiple of the key/value heads"),
    ((1, 100, 8, 128), (1, 100, 16, 128), (1, 100, 16, 128),
     "q has 8 heads, k and v 16: the query heads must be a multiple"),
    ((1, 100, 8, 128), (1, 50, 0, 128), (1, 50, 0, 128), "kv_heads=0"),
], ids=["k-vs-v", "batch", "head-dim", "not-a-multiple", "more-kv-heads", "no-kv-heads"])
def test_bad_key_value_shapes_are_named(q_shape, k_shape, v_shape, message):
    q = torch.empty(q_shape, dtype=torch.bfloat16, device="meta")
    k = torch.empty(k_shape, dtype=torch.bfloat16, device="meta")
    v = torch.empty(v_shape, dtype=torch.bfloat16, device="meta")
    with pytest.raises(TunerError, match=message):
        check_qkv(q, k, v, require_cuda=True, check_finite=False)
    with pytest.raises(TunerError, match=message):
        tuner.attention(q, k, v)


def test_the_quantize_path_takes_kv_at_its_own_length_and_heads():
    """quantize_inputs pads q and k/v each to its own length and keeps k's and v's heads; K's
    and V's descales are per KV head (and 64 keys)."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 64, 4, 64, generator=g).bfloat16()
    k, v = (torch.randn(1, 33, 2, 64, generator=g).bfloat16() for _ in range(2))
    prepared = quantize_inputs(q, k, v, pad_to=16)
    assert prepared.q.shape == (1, 64, 4, 64) and prepared.k.shape == (1, 48, 2, 64)
    assert prepared.v.shape == (1, 2, 64, 48) and prepared.seq_len_kv == 33
    assert prepared.scales.k.shape == prepared.scales.v.shape == (1, 2, 1)
    amax_k = k.float().abs().amax(dim=(1, 3))  # (1, kv_heads): 33 keys, one block
    assert torch.equal(prepared.scales.k[..., 0], (amax_k * (1.0 / 448.0)).float())
    _, k_back, v_back = prepared.dequantized()
    assert k_back.shape == k.shape and v_back.shape == v.shape
    assert torch.allclose(k_back, k.float(), rtol=2**-3, atol=1e-2)


def test_causal_must_be_a_bool():
    q, k, v = tensors((1, 64, 4, 128), (1, 64, 4, 128))
    with pytest.raises(TunerError, match="causal must be True or False, got 'yes'"):
        tuner.attention(q, k, v, causal="yes")


@pytest.mark.parametrize("scale", [float("nan"), float("inf"), -float("inf"), "0.1",
                                   torch.tensor(0.1), True, 0, 0.0, -0.5, -1e-30])
def test_softmax_scale_must_be_a_finite_positive_number(scale):
    q, k, v = tensors((1, 64, 4, 128), (1, 64, 4, 128))
    with pytest.raises(TunerError, match="softmax_scale must be a finite number > 0 or None"):
        tuner.attention(q, k, v, softmax_scale=scale)
    d = torch.ones(1, 4, device="meta")
    with pytest.raises(TunerError, match="softmax_scale must be a finite number > 0 or None"):
        tuner.attention_fp8(*(_fp8((1, 64, 4, 128)) for _ in range(3)), d, d, d,
                            softmax_scale=scale)


def test_a_repeated_calls_plan_never_sees_a_scale_the_checks_refuse(monkeypatch):
    """The plan a repeated call finds (tuner.plans.CALLS) takes the scale unchecked: a NaN or
    a scale <= 0 goes to the checks instead, while a finite positive float or int reaches the
    plan."""
    from tuner import api

    q, k, v = tensors((1, 64, 4, 128), (1, 64, 4, 128))
    seen = []

    def plan(q, k, v, scale, want_lse, keep_lse):
        seen.append(scale)
        return q, None

    monkeypatch.setitem(api.CALLS, api.signature(q, k, v, False, None, "auto", None, None), plan)
    for scale in (None, 0.1, 2):
        assert tuner.attention(q, k, v, softmax_scale=scale) is q
    assert seen == [None, 0.1, 2]
    for scale in (float("nan"), -0.5, 0):
        with pytest.raises(TunerError, match="softmax_scale must be a finite number > 0"):
            tuner.attention(q, k, v, softmax_scale=scale)
    assert len(seen) == 3


def _fp8(shape):
    return torch.empty(shape, dtype=torch.float8_e4m3fn, device="meta")


def test_fp8_descales_follow_each_tensors_own_heads():
    q, k, v = _fp8((2, 64, 32, 128)), _fp8((2, 50, 8, 128)), _fp8((2, 50, 8, 128))
    one = torch.ones(1, dtype=torch.float32, device="meta")
    per_q, per_kv = (torch.ones(2, n, dtype=torch.float32, device="meta") for n in (32, 8))
    check_fp8_qkv(q, k, v, (per_q, per_kv, per_kv))
    check_fp8_qkv(q, k, v, (one, one, one))
    with pytest.raises(TunerError, match=r"k_descale has shape \(2, 32\); it must broadcast to "
                       r"\(batch, kv_heads\) = \(2, 8\)"):
        check_fp8_qkv(q, k, v, (per_q, per_q, per_kv))
    with pytest.raises(TunerError, match=r"q_descale has shape \(2, 8\); it must broadcast to "
                       r"\(batch, heads\) = \(2, 32\)"):
        check_fp8_qkv(q, k, v, (per_kv, per_kv, per_kv))
    with pytest.raises(TunerError, match="q has 32 heads, k and v 12"):
        check_fp8_qkv(q, _fp8((2, 50, 12, 128)), _fp8((2, 50, 12, 128)), (one, one, one))


def test_fp8_descales_may_be_per_token_and_per_64_keys():
    """The fine granularity (prepare's own): q's (batch, seq_len, heads), k's and v's (batch,
    ceil(seq_len_kv / 64), kv_heads), each tensor free to choose; a 3-dim descale of another
    shape is named with both forms."""
    q, k, v = _fp8((2, 64, 32, 128)), _fp8((2, 130, 8, 128)), _fp8((2, 130, 8, 128))
    per_token = torch.ones(2, 64, 32, dtype=torch.float32, device="meta")
    per_block = torch.ones(2, 3, 8, dtype=torch.float32, device="meta")  # 130 keys: 3 blocks
    per_kv = torch.ones(2, 8, dtype=torch.float32, device="meta")
    check_fp8_qkv(q, k, v, (per_token, per_block, per_block))
    check_fp8_qkv(q, k, v, (per_token, per_kv, per_block))
    with pytest.raises(TunerError, match=r"k_descale has shape \(2, 2, 8\); a 3-dim descale is "
                       r"\(batch, ceil\(seq_len_kv / 64\), kv_heads\) one per 64 keys = "
                       r"\(2, 3, 8\)"):
        check_fp8_qkv(q, k, v, (per_token, per_block[:, :2], per_block))
    with pytest.raises(TunerError, match=r"q_descale has shape \(2, 32, 64\); a 3-dim"):
        check_fp8_qkv(q, k, v, (per_token.transpose(1, 2), per_block, per_block))
    four = torch.ones(1, 1, 1, 1, dtype=torch.float32, device="meta")  # broadcasts, but how?
    with pytest.raises(TunerError, match=r"v_descale has 4 dims \(shape \(1, 1, 1, 1\)\)"):
        check_fp8_qkv(q, k, v, (per_token, per_block, four))


def test_fp8_inputs_take_each_granularity_as_its_block_scales():
    """On the CPU (the torch path): per-token q, per-head k, per-block v become the block
    scales they state, padding neutral."""
    from variants.prepare import fp8_inputs

    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 70, 4, 64, generator=g).to(torch.float8_e4m3fn)
    k, v = (torch.randn(1, 100, 2, 64, generator=g).to(torch.float8_e4m3fn) for _ in range(2))
    dq = torch.rand(1, 70, 4, generator=g) + 0.1
    dk = torch.rand(1, 2, generator=g) + 0.1
    dv = torch.rand(1, 2, 2, generator=g) + 0.1  # 100 keys: 2 blocks
    prepared = fp8_inputs(q, k, v, (dq, dk, dv), pad_to=64)
    assert torch.equal(prepared.scales.q, dq.permute(0, 2, 1))
    assert torch.equal(prepared.scales.k, dk[..., None].expand(1, 2, 2))
    assert torch.equal(prepared.scales.v, dv.permute(0, 2, 1))
    _, _, v_back = prepared.dequantized()
    assert torch.equal(v_back, v.float() * dv.repeat_interleave(64, dim=1)[:, :100, :, None])


@pytest.mark.parametrize("peer", ["sdpa-cudnn", "sdpa-flash", "cudnn-fp8"])
def test_peers_refuse_a_causal_mask_they_would_align_otherwise(peer):
    """These peers' causal masks are top-left aligned: at different lengths it is another
    computation, refused by name before the peer is built; at equal lengths SDPA runs it (FA3's
    is bottom-right aligned, as ours: tests/test_peers_fa3.py)."""
    from tuner.errors import PeerUnavailable
    from tuner.peers import make_peer
    from tuner.problem import Problem

    with pytest.raises(PeerUnavailable, match=f"{peer}: its causal mask is aligned to the top"):
        make_peer(peer, Problem(1, 8, 100, 64, True, 37))
    if peer.startswith("sdpa"):
        sdpa = make_peer(peer, Problem(1, 8, 100, 64, True, kv_heads=2))
        assert sdpa._causal and sdpa._gqa


def test_a_zero_descale_is_an_all_zero_blocks_not_a_nan():
    """A caller's descale of 0 (an all-zero tensor or block) becomes the quantization's own
    all-zero scale (1e-12 / 448): 1 / sv and log2 sv stay finite, the kernels' softmax too."""
    from variants.prepare import fp8_inputs

    q = torch.zeros(1, 64, 2, 64).to(torch.float8_e4m3fn)
    k = v = torch.zeros(1, 64, 2, 64).to(torch.float8_e4m3fn)
    zero = torch.zeros(1, 2)
    prepared = fp8_inputs(q, k, v, (zero, zero, torch.zeros(1, 1, 2)), pad_to=64)
    assert bool(torch.isfinite(prepared.packed).all())
    assert float(prepared.scales.v.min()) == pytest.approx(1e-12 / 448)


@pytest.mark.parametrize("q_shape, kv_shape", [
    ((0, 64, 4, 128), (0, 64, 4, 128)),  # an empty batch
    ((2, 0, 4, 64), (2, 64, 4, 64)),  # no queries
    ((1, 64, 0, 128), (1, 64, 0, 128)),  # no heads
    ((1, 37, 8, 128), (1, 0, 2, 128)),  # no keys
])
def test_a_call_with_nothing_to_compute_answers_as_sdpa_does_without_a_launch(q_shape, kv_shape):
    """Empty q: an empty output; no keys: output 0 and LSE -inf (a row that sees no key). The
    same shapes through the FP8 entry and the SDPA drop-in; prepare's own check still refuses
    them (it has nothing to quantize)."""
    q, k, v = tensors(q_shape, kv_shape)
    out, lse = tuner.attention(q, k, v, causal=True, return_lse=True)
    assert out.shape == q.shape and out.dtype == torch.bfloat16
    assert lse.shape == (q_shape[0], q_shape[2], q_shape[1]) and lse.dtype == torch.float32
    d = torch.ones(1, device="meta")
    fp8 = tuner.attention_fp8(_fp8(q_shape), _fp8(kv_shape), _fp8(kv_shape), d, d, d)
    assert fp8.shape == q.shape and fp8.dtype == torch.bfloat16
    sdpa = tuner.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (q, k, v)),
                                              enable_gqa=True)
    assert sdpa.shape == q.transpose(1, 2).shape
    with pytest.raises(TunerError, match="empty input"):
        check_qkv(q, k, v, require_cuda=True, check_finite=False)

    from tuner.api import _without_keys

    g = torch.Generator().manual_seed(3)
    q_cpu = torch.randn(q_shape, generator=g).bfloat16()
    k_cpu, v_cpu = (torch.randn(kv_shape, generator=g).bfloat16() for _ in range(2))
    want = torch.nn.functional.scaled_dot_product_attention(
        *(x.transpose(1, 2).float() for x in (q_cpu, k_cpu, v_cpu))).transpose(1, 2)
    got, lse = _without_keys(q_cpu, True)
    assert torch.equal(got.float(), want) and bool((lse == -float("inf")).all())


def test_query_heads_without_key_value_heads_are_refused_by_name():
    q, k, v = tensors((1, 64, 4, 128), (1, 64, 0, 128))
    with pytest.raises(TunerError, match="query heads need key/value heads"):
        tuner.attention(q, k, v)
