"""FP8 preparation: scales, round-trip error, layouts, padding, the register-P key order."""

import pytest
import torch

from tuner.errors import TunerError
from variants.block_scales import E4M3_MAX, PackedLayout
from variants.prepare import (
    check_qkv,
    inverse_key_order,
    key_slot,
    quantize_inputs,
    register_p_key_order,
)


def rand_qkv(batch=2, seq=77, heads=3, dim=128, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, seq, heads, dim, generator=g).to(dtype) for _ in range(3)]


def quantization_error_bound(x: torch.Tensor, descale: torch.Tensor) -> torch.Tensor:
    """|x - dequant(x)| allowed per element: half an ulp of e4m3. Normal codes (|code| >= 2^-6)
    have 3 mantissa bits, relative error <= 2^-4; subnormal codes have absolute spacing 2^-9.
    descale broadcasts to x: (batch, seq, heads, 1)."""
    return torch.maximum(x.abs() * 2.0**-4, descale * 2.0**-10) * (1 + 1e-6)


def per_element_descales(prepared):
    """q's, k's and v's descales broadcastable to q, k, v (batch, seq, heads, 1)."""
    s = prepared.scales
    return (s.q.permute(0, 2, 1)[..., None], s.per_key("k")[:, :prepared.seq_len_kv],
            s.per_key("v")[:, :prepared.seq_len_kv])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_round_trip_error_is_within_half_an_e4m3_ulp_per_head(dtype):
    q, k, v = rand_qkv(dtype=dtype)
    prepared = quantize_inputs(q, k, v)
    for x, x_deq, d in zip((q, k, v), prepared.dequantized(), per_element_descales(prepared),
                           strict=True):
        err = (x.float() - x_deq).abs()
        assert bool((err <= quantization_error_bound(x.float(), d)).all())
        # Per head, the typical error is far below the bound (3 mantissa bits: ~2^-4/sqrt(3)).
        rel_rms = err.pow(2).mean(dim=(1, 3)).sqrt() / x.float().pow(2).mean(dim=(1, 3)).sqrt()
        assert float(rel_rms.max()) < 0.045


def test_scales_come_from_each_rows_and_blocks_amax():
    q, k, v = rand_qkv(seq=150)
    prepared = quantize_inputs(q, k, v)
    torch.testing.assert_close(prepared.scales.q,
                               q.float().abs().amax(dim=3).permute(0, 2, 1) / E4M3_MAX)
    for name, x in (("k", k), ("v", v)):
        padded = torch.zeros(2, 192, 3, 128)
        padded[:, :150] = x.float().abs()
        amax = padded.view(2, 3, 64, 3, 128).amax(dim=(2, 4)).permute(0, 2, 1)
        torch.testing.assert_close(getattr(prepared.scales, name), amax / E4M3_MAX)
    # The largest element of every row maps to the largest e4m3 code.
    assert float(prepared.q.float().abs().amax(dim=3).min()) == E4M3_MAX


def test_outlier_head_does_not_crush_the_others():
    q, k, v = rand_qkv(heads=4)
    q[:, :, 0] *= 300.0
    prepared = quantize_inputs(q, k, v)
    dq = prepared.dequantized()[0]
    assert float(prepared.scales.q[0, 0].mean()) > 200 * float(prepared.scales.q[0, 1].mean())
    for head in range(4):
        x, y = q[:, :, head].float(), dq[:, :, head]
        rel_rms = float((x - y).pow(2).mean().sqrt() / x.pow(2).mean().sqrt())
        assert rel_rms < 0.045, f"head {head}: {rel_rms}"


def test_all_zero_head_is_exact_and_finite():
    q, k, v = rand_qkv()
    v[:, :, 1] = 0
    prepared = quantize_inputs(q, k, v)
    assert all(torch.isfinite(d).all() for d in (prepared.scales.v, prepared.packed))
    assert float(prepared.dequantized()[2][:, :, 1].abs().max()) == 0.0


def test_layouts_and_zero_padding():
    q, k, v = rand_qkv(batch=2, seq=77, heads=3)
    prepared = quantize_inputs(q, k, v, pad_to=64)
    assert prepared.q.shape == prepared.k.shape == (2, 128, 3, 128)
    assert prepared.v.shape == (2, 3, 128, 128)  # feature-major: (batch, heads, dim, keys)
    assert prepared.v.is_contiguous() and prepared.q.dtype == torch.float8_e4m3fn
    assert prepared.seq_len == 77 and prepared.padded_len == 128
    for t in (prepared.q[:, 77:], prepared.k[:, 77:], prepared.v[..., 77:]):
        assert float(t.float().abs().max()) == 0.0
    # V[b, h, d, s] is v[b, s, h, d] quantized.
    plain = quantize_inputs(q, k, v)
    torch.testing.assert_close(plain.v.float(), plain.v.float().contiguous())
    natural = quantize_inputs(q, k, v, v_feature_major=False)
    assert torch.equal(plain.v.view(torch.uint8),
                       natural.v.view(torch.uint8).permute(0, 2, 3, 1))


def test_key_order_matches_the_mma_fragments():
    order = register_p_key_order(32)
    assert sorted(order.tolist()) == list(range(32))
    # Lane t of a quad holds keys 2t, 2t+1 of each 8-key tile; its A slots are 4t..4t+3.
    assert order[0:4].tolist() == [0, 1, 8, 9]
    assert order[4:8].tolist() == [2, 3, 10, 11]
    assert order[16:20].tolist() == [16, 17, 24, 25]
    inverse = inverse_key_order(32)
    assert torch.equal(order[inverse], torch.arange(32))
    assert torch.equal(inverse[order], torch.arange(32))
    with pytest.raises(ValueError, match="multiple of 16"):
        register_p_key_order(40)


def test_key_slot_is_the_inverse_of_the_register_p_key_order():
    # key_slot is also what the fused cast computes per key on the GPU (Python ints here).
    order = register_p_key_order(256)
    assert [key_slot(int(key)) for key in order] == list(range(256))


def test_permuted_v_dequantizes_to_the_same_values():
    q, k, v = rand_qkv(seq=50)
    plain = quantize_inputs(q, k, v, pad_to=32)
    permuted = quantize_inputs(q, k, v, pad_to=32, permute_keys=True)
    assert not torch.equal(plain.v.float(), permuted.v.float())
    torch.testing.assert_close(permuted.v.float()[..., inverse_key_order(64)], plain.v.float())
    torch.testing.assert_close(permuted.dequantized()[2], plain.dequantized()[2])
    with pytest.raises(ValueError, match="pad_to to be a multiple of 16"):
        quantize_inputs(q, k, v, pad_to=8, permute_keys=True)


def test_natural_v_layout_holds_the_same_codes():
    # v_layout=kernel kernels read V as (batch, padded, heads, head_dim), like K.
    q, k, v = rand_qkv(seq=50)
    feature_major = quantize_inputs(q, k, v, pad_to=32, permute_keys=True)
    natural = quantize_inputs(q, k, v, pad_to=32, v_feature_major=False)
    assert natural.v.shape == natural.k.shape == (2, 64, 3, 128)
    assert not natural.v_feature_major and not natural.key_permuted
    assert bool((natural.v[:, 50:].float() == 0).all())  # zero padding, as for k
    torch.testing.assert_close(natural.dequantized()[2], feature_major.dequantized()[2])
    for b, h in ((0, 0), (1, 2)):
        torch.testing.assert_close(natural.v_codes(b, h).float(),
                                   feature_major.v_codes(b, h).float())
    with pytest.raises(ValueError, match="feature-major V only"):
        quantize_inputs(q, k, v, pad_to=32, permute_keys=True, v_feature_major=False)


def test_default_softmax_scale():
    q, k, v = rand_qkv(dim=64)
    assert quantize_inputs(q, k, v).softmax_scale == pytest.approx(64**-0.5)
    assert quantize_inputs(q, k, v, softmax_scale=0.5).softmax_scale == 0.5


# ---- bad input at the public boundary ----------------------------------------------------------


@pytest.mark.parametrize(
    "mutate, fragment",
    [
        (lambda q, k, v: (q.float(), k, v), "q has dtype torch.float32; pass bfloat16 or float16"),
        (lambda q, k, v: (q[0], k, v), "q has rank 3"),
        (lambda q, k, v: (q, k[:, :10], v), "k and v shapes differ"),
        (lambda q, k, v: (q, k, v.half()), "dtypes differ"),
        (lambda q, k, v: (q[..., :96], k[..., :96], v[..., :96]), "head_dim 96 is not supported"),
        (lambda q, k, v: (q[:, :0], k[:, :0], v[:, :0]), "seq_len=0"),
        (lambda q, k, v: (q.float().numpy(), k, v), "q must be a torch.Tensor"),
    ],
)
def test_bad_input_is_named_with_its_fix(mutate, fragment):
    q, k, v = mutate(*rand_qkv())
    with pytest.raises(TunerError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        quantize_inputs(q, k, v)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_input_is_rejected(bad):
    q, k, v = rand_qkv()
    k[0, 5, 1, 7] = bad
    with pytest.raises(TunerError, match="k contains 1 NaN/Inf values"):
        quantize_inputs(q, k, v)


def test_cpu_tensors_rejected_where_the_gpu_is_required():
    q, k, v = rand_qkv()
    with pytest.raises(TunerError, match=r"q is on cpu; .* move it with .cuda\(\)"):
        check_qkv(q, k, v, require_cuda=True)


def _plain_codes(x: torch.Tensor, padded: int, rows: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The quantization written out in the plainest torch: amax per token and head (rows) or
    per 64 keys of a head, x in fp32 times 448 / amax, clamped, cast to e4m3, zero rows
    appended. (codes as uint8, descale (batch, heads, tokens or blocks))."""
    batch, seq, heads, dim = x.shape
    if rows:
        amax = x.float().abs().amax(dim=3, keepdim=True)
    else:
        blocks = -(-seq // 64)
        tiles = torch.zeros(batch, blocks * 64, heads, dim, device=x.device)
        tiles[:, :seq] = x.float().abs()
        amax = tiles.view(batch, blocks, 64, heads, dim).amax(dim=(2, 4), keepdim=True)
        amax = amax.repeat_interleave(64, dim=1).view(batch, blocks * 64, heads, 1)[:, :seq]
    amax = amax.clamp_min(1e-12)
    scale = amax.reciprocal() * E4M3_MAX  # what torch's 448 / amax computes
    codes = (x.float() * scale).clamp(-E4M3_MAX, E4M3_MAX)
    codes = codes.to(torch.float8_e4m3fn).view(torch.uint8)
    tail = torch.zeros(batch, padded - seq, heads, dim, dtype=torch.uint8, device=x.device)
    descale = (amax * (1.0 / E4M3_MAX))[..., 0]
    descale = descale if rows else descale[:, ::64]
    return torch.cat([codes, tail], dim=1), descale.permute(0, 2, 1)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("seq", "pad_to", "contiguous"),
                         [(77, 128, True), (1000, 64, True), (1, 1, True), (4096, 128, True),
                          (300, 128, False), (641, 128, True)])
@pytest.mark.parametrize("head_dim", [128, 64])
def test_codes_are_the_plain_formula_bit_for_bit(device, dtype, seq, pad_to, contiguous,
                                                 head_dim):
    """The fast paths (on a GPU the amax and cast kernels for contiguous inputs, torch ops for
    the rest and on the CPU) must give the very codes and descales of the plain formula, with
    heads of very different ranges and a head of zeros, at lengths inside one chunk of the GPU
    kernels and across several (128 rows at head_dim 128, 256 at 64) with a ragged tail."""
    g = torch.Generator().manual_seed(seq)
    ranges = torch.tensor([1e-3, 1.0, 40.0, 0.0])[None, None, :, None]
    qkv = [(torch.randn(2, seq, 4, head_dim, generator=g) * ranges).to(dtype).to(device)
           for _ in range(3)]
    if not contiguous:  # same values, strided: (batch, heads, seq, dim) storage
        qkv = [x.transpose(1, 2).contiguous().transpose(1, 2) for x in qkv]
    q, k, v = qkv
    prepared = quantize_inputs(q, k, v, pad_to=pad_to, v_feature_major=False)
    for i, (x, got, d) in enumerate(((q, prepared.q, prepared.scales.q),
                                     (k, prepared.k, prepared.scales.k),
                                     (v, prepared.v, prepared.scales.v))):
        codes, descale = _plain_codes(x, prepared.padded_len, rows=i == 0)
        assert torch.equal(got.view(torch.uint8), codes), f"tensor {i}: codes differ"
        assert torch.equal(d, descale), f"tensor {i}: descale differs"
    # V written feature-major (on a GPU by the cast itself), keys permuted or not.
    codes, _ = _plain_codes(v, prepared.padded_len, rows=False)
    codes = codes.permute(0, 2, 3, 1)
    for permute in ([False, True] if pad_to % 16 == 0 else [False]):
        fm = quantize_inputs(q, k, v, pad_to=pad_to, v_feature_major=True, permute_keys=permute)
        want = codes[..., register_p_key_order(fm.padded_len).to(codes.device)] if permute \
            else codes
        assert fm.v.is_contiguous() and fm.v.shape == want.shape
        assert torch.equal(fm.v.view(torch.uint8), want), f"feature-major V (permute={permute})"


def _assert_packed_matches(prepared):
    """The packed buffer the kernels read holds the prepared descales, V's log2 (within an ulp:
    torch's log2f and the DSL's may round differently) and exact inverse, and neutral padding
    (1; log2 0)."""
    layout = PackedLayout(prepared.q.shape[0], prepared.q.shape[2], prepared.padded_len,
                          prepared.k.shape[2], prepared.padded_len_kv)
    q, k, log2_v, inv_v, v = layout.views(prepared.packed)
    s, blocks = prepared.seq_len, prepared.scales.k.shape[-1]
    assert torch.equal(q[..., :s], prepared.scales.q) and bool((q[..., s:] == 1).all())
    assert torch.equal(k[..., :blocks], prepared.scales.k)
    assert torch.equal(v[..., :blocks], prepared.scales.v)
    assert torch.equal(inv_v[..., :blocks], prepared.scales.v.reciprocal())
    torch.testing.assert_close(log2_v[..., :blocks], prepared.scales.v.log2(), rtol=2e-7,
                               atol=1e-6)
    for part, neutral in ((k, 1.0), (log2_v, 0.0), (inv_v, 1.0), (v, 1.0)):
        assert bool((part[..., blocks:] == neutral).all())


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize(("batch", "seq", "seq_kv", "heads", "kv_heads", "head_dim", "pad_to"),
                         [(2, 77, 300, 8, 2, 128, 64), (1, 1000, 130, 6, 1, 64, 128),
                          (3, 129, 129, 4, 4, 128, 32)])
def test_grouped_and_cross_attention_codes_and_packed_scales(device, batch, seq, seq_kv, heads,
                                                             kv_heads, head_dim, pad_to):
    """Other lengths for k and v than for q, fewer KV heads than query heads: every code and
    scale is still the plain formula's, by the KV head's own blocks, and the packed buffer
    (what the kernels read) holds them with neutral padding."""
    g = torch.Generator().manual_seed(seq * seq_kv)
    q = (torch.randn(batch, seq, heads, head_dim, generator=g) * 3).bfloat16().to(device)
    k, v = ((torch.randn(batch, seq_kv, kv_heads, head_dim, generator=g)
             * torch.logspace(-2, 2, seq_kv)[None, :, None, None]).bfloat16().to(device)
            for _ in range(2))
    for feature_major, permute in ((False, False), (True, False), (True, pad_to % 16 == 0)):
        prepared = quantize_inputs(q, k, v, pad_to=pad_to, v_feature_major=feature_major,
                                   permute_keys=permute)
        for i, (x, d) in enumerate(((q, prepared.scales.q), (k, prepared.scales.k),
                                    (v, prepared.scales.v))):
            codes, descale = _plain_codes(x, prepared.padded_len if i == 0
                                          else prepared.padded_len_kv, rows=i == 0)
            assert torch.equal(d, descale), f"tensor {i}: descale differs"
            if i < 2:
                assert torch.equal((prepared.q, prepared.k)[i].view(torch.uint8), codes)
            else:  # V through the layout and key order it declares
                plain = codes[:, :seq_kv].view(torch.float8_e4m3fn).float()
                assert torch.equal(prepared.dequantized()[2],
                                   plain * prepared.scales.per_key("v")[:, :seq_kv])
        _assert_packed_matches(prepared)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_fp8_inputs_expand_per_head_descales_into_the_packed_scales(device):
    """The FP8 entry point's per-(batch, head) descales (a scalar, a (1, heads) row, a full
    (batch, kv_heads) tensor: each broadcast) become block scales equal to them everywhere:
    on a GPU one launch writes them through the broadcast strides."""
    from variants.prepare import fp8_inputs

    batch, seq, seq_kv, heads, kv_heads = 2, 100, 70, 4, 2
    g = torch.Generator().manual_seed(3)
    q = torch.randn(batch, seq, heads, 64, generator=g).to(torch.float8_e4m3fn).to(device)
    k, v = (torch.randn(batch, seq_kv, kv_heads, 64, generator=g).to(torch.float8_e4m3fn)
            .to(device) for _ in range(2))
    dq = torch.tensor(0.03, device=device)
    dk = torch.rand(1, kv_heads, generator=g).to(device) + 0.5
    dv = torch.rand(batch, kv_heads, generator=g).to(device) * 4
    prepared = fp8_inputs(q, k, v, (dq, dk, dv), pad_to=64)
    blocks = -(-seq_kv // 64)  # one value per head, repeated over its rows or 64-key blocks
    want = {"q": dq.expand(batch, heads)[..., None].expand(batch, heads, seq),
            "k": dk.expand(batch, kv_heads)[..., None].expand(batch, kv_heads, blocks),
            "v": dv[..., None].expand(batch, kv_heads, blocks)}
    for name in "qkv":
        assert torch.equal(getattr(prepared.scales, name), want[name]), name
    _assert_packed_matches(prepared)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("layout", ["contiguous", "strided", "misaligned"])
def test_q_in_kernel_leaves_q_as_it_is_and_quantizes_k_and_v_alike(device, layout):
    """q_quant=kernel: prepare hands q on as bf16 (contiguous, 16-byte aligned, unpadded) with
    the tile's padded length beside it; k's and v's codes and scales are those of the full
    prepare, and q decodes, by the formula the kernel applies, to the very values the full
    prepare's codes give. A contiguous q 2 bytes off alignment is copied, not passed on."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 300, 4, 128, generator=g).bfloat16().to(device) for _ in range(3))
    if layout == "strided":
        q = q.transpose(1, 2).contiguous().transpose(1, 2)
    elif layout == "misaligned":
        q = torch.cat((q.new_zeros(1), q.flatten()))[1:].view(q.shape)
        assert q.is_contiguous() and q.data_ptr() % 16 == 2
    full = quantize_inputs(q, k, v, pad_to=128, permute_keys=True)
    ours = quantize_inputs(q, k, v, pad_to=128, permute_keys=True, q_in_kernel=True)
    assert ours.q_in_kernel and not full.q_in_kernel
    assert ours.q.dtype == torch.bfloat16 and ours.q.is_contiguous() and torch.equal(ours.q, q)
    assert ours.q.data_ptr() % 16 == 0
    assert ours.padded_len == full.padded_len == 384 and ours.q.shape[1] == 300
    assert ours.padding()[0].numel() == 0
    for name in ("k", "v"):
        assert torch.equal(getattr(ours, name).view(torch.uint8),
                           getattr(full, name).view(torch.uint8)), name
    layout = full.scale_layout
    assert ours.scale_layout == layout
    q_part = layout.q_size  # q's scales lie first; the kernel reads none of ours
    assert torch.equal(ours.packed[q_part:], full.packed[q_part:])
    assert torch.equal(ours.scales.q, full.scales.q)
    for got, want in zip(ours.dequantized(), full.dequantized(), strict=True):
        assert torch.equal(got, want)


def test_q_in_kernel_takes_bf16_only():
    q, k, v = (torch.randn(1, 64, 2, 128).half() for _ in range(3))
    with pytest.raises(ValueError, match="bf16"):
        quantize_inputs(q, k, v, q_in_kernel=True)
