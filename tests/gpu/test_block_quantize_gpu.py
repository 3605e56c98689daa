"""The one-pass quantization with K smoothing and the Q/K rotation on a GPU against the torch
statement of variants/transforms.py: codes and packed scales bit for bit those of
block_scales.quantize(rotate(q), rotate(k - m), v), the shift q . m within the fp32 dot's error
bound, padding rows zero, and nothing written outside what the launch owns; with int8 q and k
codes (qk_dtype="int8") the same, the codes those of block_scales.quantize(..., "int8")."""

import math
import secrets

import pytest
import torch

from tuner.activations import activations
from tuner.problem import Problem
from variants import block_quantize_kernel, block_scales, transforms
from variants.block_scales import PackedLayout
from variants.input_layout import row_strides
from variants.key_order import register_p_key_order
from variants.launch import current_stream_handle

pytestmark = pytest.mark.gpu

KINDS = ("randn", "k_bias_8", "outliers", "realistic")
FLAGS = {"smooth": (True, False), "rotate": (False, True), "both": (True, True)}
V_LAYOUTS = {"v-feature-major-permuted": (True, True), "v-feature-major": (True, False),
             "v-token-major": (False, False)}
PAD = 128  # prepare's pad_to of the wgmma tiles: S=77 -> 128, S_kv=300 -> 384 (a padding block)
POISON = 0x5A  # an e4m3 code no padding row may keep


def _round_up(n: int) -> int:
    return -(-n // PAD) * PAD


def _launch(name, q, k, v, m, smooth, rotate, v_feature_major, permute_keys, qk_int8=False,
            write_shift=True):
    """(q codes, k codes, v codes, packed scales, shift buffer with a NaN guard after it) from one
    launch into poisoned outputs."""
    batch, seq, heads, dim = q.shape
    _, seq_kv, kv_heads, _ = k.shape
    padded, padded_kv = _round_up(seq), _round_up(seq_kv)
    launch = block_quantize_kernel.compiled(name, q.dtype, dim, q.device,
                                            v_feature_major=v_feature_major,
                                            permute_keys=permute_keys, smooth_k=smooth,
                                            rotate_qk=rotate, qk_int8=qk_int8,
                                            write_shift=write_shift)
    assert launch is not None, "the launcher did not compile (see the log)"
    dev = q.device
    q8 = torch.full((batch, padded, heads, dim), POISON, dtype=torch.uint8, device=dev)
    k8 = torch.full((batch, padded_kv, kv_heads, dim), POISON, dtype=torch.uint8, device=dev)
    v_shape = (batch, kv_heads, dim, padded_kv) if v_feature_major else k8.shape
    v8 = torch.full(v_shape, POISON, dtype=torch.uint8, device=dev)
    layout = PackedLayout(batch, heads, padded, kv_heads, padded_kv)
    packed = torch.full((layout.size,), math.nan, device=dev)
    shift = torch.full((batch * heads * seq + 1024,), math.nan, device=dev)  # + a guard
    launch(q.data_ptr(), k.data_ptr(), v.data_ptr(), q8.data_ptr(), k8.data_ptr(), v8.data_ptr(),
           packed.data_ptr(), m.data_ptr() if smooth else 0, shift.data_ptr() if smooth else 0,
           batch, heads, kv_heads, seq, padded, seq_kv, padded_kv,
           *(x for t in (q, k, v) for x in row_strides(t)), current_stream_handle(dev))
    torch.cuda.synchronize()
    return q8, k8, v8, packed, shift, layout


def _expected(q, k, v, m, smooth, rotate, v_feature_major, permute_keys, qk_int8=False):
    """The torch statement: codes in the kernels' layouts (padding rows zero) and packed scales."""
    q_t = transforms.rotate(q) if rotate else q.float()
    k_t = k.float() - m[:, None] if smooth else k.float()
    if rotate:
        k_t = transforms.rotate(k_t)
    (q8, k8, v8), scales = block_scales.quantize(q_t, k_t, v, "int8" if qk_int8 else "e4m3")
    seq, seq_kv = q.shape[1], k.shape[1]
    padded, padded_kv = _round_up(seq), _round_up(seq_kv)

    def padded_codes(codes, length, rows):
        out = torch.zeros((codes.shape[0], rows, *codes.shape[2:]), dtype=torch.uint8,
                          device=codes.device)
        out[:, :length] = codes.view(torch.uint8)
        return out

    v_codes = padded_codes(v8, seq_kv, padded_kv)
    if v_feature_major:
        v_codes = v_codes.permute(0, 2, 3, 1)
        if permute_keys:
            v_codes = v_codes[..., register_p_key_order(padded_kv).to(v.device)]
    return (padded_codes(q8, seq, padded), padded_codes(k8, seq_kv, padded_kv),
            v_codes.contiguous(), scales.packed(padded, padded_kv))


def _assert_packed_equal(got, want, layout, with_q, msg):
    """Every part exactly, V's log2 within an ulp (torch's log2f and the DSL's may round
    differently; V is never transformed); q's part unwritten (NaN) without q's CTAs."""
    got_q, *got_kv = layout.views(got)
    want_q, *want_kv = layout.views(want)
    if with_q:
        assert torch.equal(got_q, want_q), f"{msg}: q's descales"
    else:
        assert bool(got_q.isnan().all()), f"{msg}: quant_kv wrote q's descales"
    for part, (g, w) in zip(("k", "log2 v", "1 / v", "v"), zip(got_kv, want_kv, strict=True),
                            strict=True):
        if part == "log2 v":
            torch.testing.assert_close(g, w, rtol=2e-7, atol=1e-6, msg=f"{msg}: {part}")
        else:
            assert torch.equal(g, w), f"{msg}: {part} descales"


def _assert_shift(shift, q, m, msg):
    """shift[b, h, s] = q[b, s, h] . m[b, h // group] in fp32. Both sums (the kernel's FMA chain
    and lane tree, torch's products and reduction) are within gamma_d * sum |q_i m_i| of the
    exact dot (gamma_d = d u / (1 - d u), u = 2^-24), so they differ by at most twice that."""
    batch, seq, heads, dim = q.shape
    group = heads // m.shape[1]
    m_q = m.repeat_interleave(group, dim=1)[:, None]  # (batch, 1, heads, dim)
    want = (q.float() * m_q).sum(-1).permute(0, 2, 1)
    terms = (q.double() * m_q.double()).abs().sum(-1).permute(0, 2, 1)
    u = 2.0**-24
    bound = 2 * dim * u / (1 - dim * u) * terms
    n = batch * heads * seq
    got = shift[:n].view(batch, heads, seq)
    err = (got.double() - want.double()).abs()
    assert bool((err <= bound).all()), f"{msg}: shift off by {float((err - bound).max())}"
    assert bool(shift[n:].isnan().all()), f"{msg}: a row at or past seq_len was written"


@pytest.mark.parametrize("v_layout", list(V_LAYOUTS))
@pytest.mark.parametrize("flags", list(FLAGS))
@pytest.mark.parametrize("head_dim", [128, 64])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize(("batch", "seq", "seq_kv"), [(2, 77, 300), (1, 1, 1)],
                         ids=["S77-Skv300", "S1-Skv1"])
def test_transformed_codes_scales_and_shift_are_the_torch_statement(batch, seq, seq_kv, dtype,
                                                                    head_dim, flags, v_layout):
    smooth, rotate = FLAGS[flags]
    v_feature_major, permute_keys = V_LAYOUTS[v_layout]
    problem = Problem(batch, 8, seq, head_dim, seq_len_kv=seq_kv, kv_heads=2)
    for kind in KINDS:
        seed = secrets.randbits(31)
        msg = f"{kind} seed {seed}"
        q, k, v = activations(kind, problem, "cuda", seed, dtype)
        m = transforms.smoothing_vector(k)
        got = _launch("quant", q, k, v, m, smooth, rotate, v_feature_major, permute_keys)
        want = _expected(q, k, v, m, smooth, rotate, v_feature_major, permute_keys)
        for name, g, w in zip("qkv", got[:3], want[:3], strict=True):
            assert torch.equal(g, w), f"{msg}: {name} codes differ"
        _assert_packed_equal(got[3], want[3], got[5], True, msg)
        if smooth:
            _assert_shift(got[4], q, m, msg)


@pytest.mark.parametrize("head_dim", [128, 64])
def test_quant_kv_smooths_k_and_writes_no_shift(head_dim):
    """Without q's CTAs k is smoothed all the same, and neither the shift buffer nor q's
    descales are touched."""
    problem = Problem(2, 8, 77, head_dim, seq_len_kv=300, kv_heads=2)
    seed = secrets.randbits(31)
    q, k, v = activations("realistic", problem, "cuda", seed)
    m = transforms.smoothing_vector(k)
    got = _launch("quant_kv", q, k, v, m, True, False, True, True)
    want = _expected(q, k, v, m, True, False, True, True)
    assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2]), f"seed {seed}"
    assert bool((got[0] == POISON).all()), f"seed {seed}: q's codes written"
    assert bool(got[4].isnan().all()), f"seed {seed}: quant_kv wrote a shift"
    _assert_packed_equal(got[3], want[3], got[5], False, f"seed {seed}")


@pytest.mark.parametrize("flags", ["smooth", "both"])
@pytest.mark.parametrize("head_dim", [128, 64])
def test_the_build_without_the_shift_writes_the_same_codes_and_no_shift(head_dim, flags):
    """write_shift=False (a call that drops the LSE): every code and scale bit for bit the
    build's that writes q . m, and the shift buffer untouched."""
    smooth, rotate = FLAGS[flags]
    problem = Problem(2, 8, 77, head_dim, seq_len_kv=300, kv_heads=2)
    for kind in KINDS:
        seed = secrets.randbits(31)
        q, k, v = activations(kind, problem, "cuda", seed)
        m = transforms.smoothing_vector(k)
        want = _launch("quant", q, k, v, m, smooth, rotate, True, True)
        got = _launch("quant", q, k, v, m, smooth, rotate, True, True, write_shift=False)
        for name, a, b in zip(("q", "k", "v", "scales"), got[:4], want[:4], strict=True):
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), \
                f"{kind} seed {seed}: {name} differ"
        assert bool(got[4].isnan().all()), f"{kind} seed {seed}: a shift was written"
        assert not bool(want[4][:2 * 8 * 77].isnan().any()), f"{kind} seed {seed}: no shift"


@pytest.mark.parametrize("v_layout", ["v-feature-major-permuted", "v-token-major"])
@pytest.mark.parametrize("flags", ["plain", "smooth", "both"])
@pytest.mark.parametrize("head_dim", [128, 64])
def test_int8_q_and_k_codes_are_the_torch_statement(head_dim, flags, v_layout):
    """qk_int8: q's and k's codes round half to even at 127 / amax (the DSL's f32 -> int8
    conversion alone truncates), their descales amax / 127; v's stay e4m3."""
    smooth, rotate = FLAGS.get(flags, (False, False))
    v_feature_major, permute_keys = V_LAYOUTS[v_layout]
    problem = Problem(2, 8, 77, head_dim, seq_len_kv=300, kv_heads=2)
    for kind in KINDS:
        seed = secrets.randbits(31)
        msg = f"{kind} seed {seed}"
        q, k, v = activations(kind, problem, "cuda", seed)
        m = transforms.smoothing_vector(k)
        got = _launch("quant", q, k, v, m, smooth, rotate, v_feature_major, permute_keys, True)
        want = _expected(q, k, v, m, smooth, rotate, v_feature_major, permute_keys, True)
        for name, g, w in zip("qkv", got[:3], want[:3], strict=True):
            assert torch.equal(g, w), f"{msg}: {name} codes differ"
        _assert_packed_equal(got[3], want[3], got[5], True, msg)


@pytest.mark.parametrize("flags", list(FLAGS))
@pytest.mark.parametrize("head_dim", [128, 64])
def test_views_in_sdpa_layout_quantize_as_their_contiguous_copies(head_dim, flags):
    """q, k, v as (batch, seq, heads, head_dim) views of (batch, heads, seq, head_dim) tensors
    (the SDPA drop-in's RoPE layout), read through their strides: every code, scale and shift
    bit for bit those of the same values laid out contiguously."""
    smooth, rotate = FLAGS[flags]
    problem = Problem(2, 4, 77, head_dim, seq_len_kv=300, kv_heads=2)
    seed = secrets.randbits(31)
    q, k, v = activations("realistic", problem, torch.device("cuda"), seed)
    views = [x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v)]
    assert not any(x.is_contiguous() for x in views) and all(map(row_strides, views))
    m = transforms.smoothing_vector(k).contiguous()
    want = _launch("quant", q, k, v, m, smooth, rotate, True, True)
    got = _launch("quant", *views, m, smooth, rotate, True, True)
    for name, a, b in zip(("q", "k", "v", "scales", "shift"), got[:5], want[:5], strict=True):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)) if a.dtype != torch.float32 \
            else torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0)), f"{name} (seed {seed})"
