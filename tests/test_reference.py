"""The gate's arithmetic: its own quantization, the fp32 reference against torch SDPA, the prepare
check, and each metric against the fault it exists for."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from variants.prepare import quantize_inputs
from variants.prepare_check import prepare_mismatch
from variants.reference import (
    accuracy,
    end_to_end_error,
    quantize_reference,
    reference_attention,
    validate,
)
from variants.reference_bounds import (
    HEAD_SLOPE_MAX,
    LSE_ABS_MAX,
    LSE_QK_REL,
    REL_RMS_MAX,
    ROW_REL_MAX,
    ROW_SCALE_NOISE,
)


def rand_qkv(seq, batch=2, heads=3, dim=128, seed=1):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(batch, seq, heads, dim, generator=g).bfloat16() for _ in range(3))


@pytest.mark.parametrize("seq", [1, 77, 130])
def test_reference_matches_sdpa_in_fp32(seq):
    ref_in = quantize_reference(*rand_qkv(seq))
    ref = reference_attention(ref_in, score_budget_bytes=8 * seq * 16)  # force chunking
    q, k, v = (x.transpose(1, 2) for x in ref_in.dequantized())
    expected = F.scaled_dot_product_attention(q, k, v).transpose(1, 2)
    torch.testing.assert_close(ref.out, expected, atol=2e-6, rtol=1e-5)
    scores = (q @ k.transpose(-1, -2)) * ref_in.softmax_scale
    torch.testing.assert_close(ref.lse, torch.logsumexp(scores, dim=-1), atol=2e-6, rtol=1e-6)
    # noise = sqrt(sum p^2 |v|^2); magnitude = sum_j p_j scale sum_d |q_d k_jd|.
    p = torch.softmax(scores, -1)
    torch.testing.assert_close(ref.noise, ((p * p) @ (v * v).sum(-1, keepdim=True))[..., 0]
                               .sqrt(), atol=1e-6, rtol=1e-5)
    abs_scores = (q.abs() @ k.abs().transpose(-1, -2)) * ref_in.softmax_scale
    torch.testing.assert_close(ref.score_magnitude, (p * abs_scores).sum(-1), atol=1e-5,
                               rtol=1e-5)


def test_reference_of_a_row_subset_is_those_rows():
    ref_in = quantize_reference(*rand_qkv(200))
    rows = torch.tensor([0, 5, 199])
    whole, part = reference_attention(ref_in), reference_attention(ref_in, rows)
    torch.testing.assert_close(part.out, whole.out[:, rows])
    torch.testing.assert_close(part.lse, whole.lse[..., rows])


@pytest.mark.parametrize("layout", [dict(pad_to=1), dict(pad_to=64, permute_keys=True),
                                    dict(pad_to=64, v_feature_major=False)],
                         ids=["feature-major", "permuted", "natural"])
def test_prepare_decodes_to_the_gates_own_codes(layout):
    q, k, v = rand_qkv(77)
    assert prepare_mismatch(quantize_inputs(q, k, v, **layout), quantize_reference(q, k, v)) is None


def test_a_prepare_bug_is_named():
    q, k, v = rand_qkv(77)
    ref_in = quantize_reference(q, k, v)
    prepared = quantize_inputs(q, k, v, pad_to=64, permute_keys=True)
    # Keys stored in natural order while the inputs claim the register-P order.
    mislabeled = dataclasses.replace(prepared, key_permuted=False)
    assert "prepare: v differs" in prepare_mismatch(mislabeled, ref_in)
    # One block's V descale 1% off.
    off = dataclasses.replace(prepared, packed=prepared.packed.clone())
    off.scales.v[1, 2, 1] *= 1.01
    bad = prepare_mismatch(off, ref_in)
    assert "v descale" in bad and "batch 1, head 2, block 1" in bad
    # Garbage in the padding.
    padded = dataclasses.replace(prepared, k=prepared.k.clone())
    padded.k[:, 100] = torch.tensor(1.0).to(torch.float8_e4m3fn)
    assert "k's padding" in prepare_mismatch(padded, ref_in)
    scaled = dataclasses.replace(prepared, softmax_scale=0.1)
    assert "softmax_scale" in prepare_mismatch(scaled, ref_in)


def test_a_q_left_for_the_kernel_decodes_by_the_formula_and_a_changed_one_is_named():
    """q_quant=kernel: prepare passes the bf16 q on, and the gate decodes it with the formula
    the kernel applies, so the unchanged q passes and a q that is not the caller's fails (the
    kernel's own codes are checked through its output)."""
    q, k, v = rand_qkv(77)
    ref_in = quantize_reference(q, k, v)
    prepared = quantize_inputs(q, k, v, pad_to=128, q_in_kernel=True)
    assert prepared.q_in_kernel and prepared.padded_len == 128
    assert prepare_mismatch(prepared, ref_in) is None
    changed = dataclasses.replace(prepared, q=q.clone())
    changed.q[1, 5, 2, 7] *= 2
    bad = prepare_mismatch(changed, ref_in)
    assert bad is not None and "q differs" in bad and "token 5, head 2" in bad, bad


_OFF = 1.001  # a value 0.1% off


@pytest.mark.parametrize(("part", "index", "new", "words"), [
    (0, (1, 2, 5), _OFF, "q descale differs"),  # a row's scale as the kernel reads it
    (1, (0, 1, 0), _OFF, "k descale differs"),
    (2, (1, 0, 1), _OFF, "log2 of v's descale"),  # V's log2 in the exponent
    (3, (0, 2, 0), _OFF, "1 / v descale differs"),  # V's inverse in the row sum
    (2, (0, 0, 2), "0.5", "past the real length"),  # block 2 holds no key: its log2 must be 0
])
def test_a_wrong_value_in_the_kernels_packed_scales_is_named(part, index, new, words):
    """The kernels read the packed buffer, not BlockScales: a value wrong only there fails."""
    from variants.block_scales import PackedLayout

    q, k, v = rand_qkv(77)
    prepared = quantize_inputs(q, k, v, pad_to=192)  # 77 keys: blocks 0, 1 real, 2 padding
    packed = prepared.packed.clone()
    target = PackedLayout(2, 3, 192, 3, 192).views(packed)[part]
    target[index] = target[index] * new if new == _OFF else float(new)
    ref_in = quantize_reference(q, k, v)
    bad = prepare_mismatch(dataclasses.replace(prepared, packed=packed), ref_in)
    assert bad is not None and words in bad, bad


def test_seq_len_one_attends_to_itself():
    ref_in = quantize_reference(*rand_qkv(1))
    torch.testing.assert_close(reference_attention(ref_in).out, ref_in.dequantized()[2])


def _p_rounded_output(ref_in):
    """What a correct FP8 kernel computes: P * 256 rounded to e4m3 before P @ V."""
    q, k, v = (x.transpose(1, 2) for x in ref_in.dequantized())
    s = (q @ k.transpose(-1, -2)) * ref_in.softmax_scale
    m = s.amax(-1, keepdim=True)
    p = torch.exp(s - m)
    p8 = (p * 256).to(torch.float8_e4m3fn).float() / 256
    return ((p8 @ v) / p.sum(-1, keepdim=True)).transpose(1, 2), torch.logsumexp(s, -1)


@pytest.mark.parametrize("seq", [77, 300])
def test_an_fp8_p_kernel_passes_and_its_error_is_as_derived(seq):
    q, k, v = rand_qkv(seq)
    out, lse = _p_rounded_output(quantize_reference(q, k, v))
    metrics = validate(q, k, v, out.bfloat16(), lse)
    assert metrics.passed, metrics.reason
    assert 0.005 < metrics.rel_rms < REL_RMS_MAX  # P rounding is visible, and within the bound
    assert 0.005 < metrics.worst_row < ROW_REL_MAX / 2
    assert metrics.head_slope_error < HEAD_SLOPE_MAX / 4


def _reference_and_outputs(seq=77):
    ref_in = quantize_reference(*rand_qkv(seq))
    ref = reference_attention(ref_in)
    return ref, ref.out.clone(), ref.lse.clone()


def test_each_metric_catches_its_fault():
    ref, out, lse = _reference_and_outputs(1024)
    assert accuracy(out, lse, ref).passed

    unwritten = out.clone()
    unwritten[0, 5, 1, 7] = float("nan")
    m = accuracy(unwritten, lse, ref)
    assert "non-finite" in m.reason and m.nonfinite == 1 and m.written_share < 1

    # One row holds another row's output: invisible in the global RMS, O(1) for that row.
    tail = out.clone()
    tail[:, -1] = out[:, -2]
    m = accuracy(tail, lse, ref)
    assert m.rel_rms < REL_RMS_MAX and "worst row" in m.reason and "row 1023" in m.worst_row_at

    # One head 3% too large: every row within bounds, the head's slope is not.
    scaled = out.clone()
    scaled[1, :, 2] *= 1.03
    m = accuracy(scaled, lse, ref)
    assert m.worst_row < ROW_REL_MAX and "head scale" in m.reason
    assert m.head_slope_at == "batch 1 head 2"

    m = accuracy(out, lse + 0.05, ref)
    assert "LSE" in m.reason

    # Two heads swapped.
    assert not accuracy(out[:, :, [1, 0, 2]], lse, ref).passed


@pytest.mark.parametrize("seq", [1, 4, 16])
def test_a_head_of_few_rows_may_carry_a_rows_p_rounding_as_its_scale(seq):
    # A row's scale is off by up to one key's P rounding (2^-4): a head of n rows by 2^-4 / sqrt(n),
    # and never by less than HEAD_SLOPE_MAX asks of a large head.
    ref, out, lse = _reference_and_outputs(seq)
    bound = max(HEAD_SLOPE_MAX, ROW_SCALE_NOISE / seq**0.5)
    assert accuracy(out, lse, ref).head_slope_max == bound
    within, beyond = out.clone(), out.clone()
    within[1, :, 2] *= 1 + 0.9 * bound
    beyond[1, :, 2] *= 1 + 1.1 * bound
    assert accuracy(within, lse, ref).passed
    m = accuracy(beyond, lse, ref)
    assert "head scale" in m.reason and m.head_slope_at == "batch 1 head 2"
    assert m.head_slope_excess > 1


def test_lse_bound_grows_with_the_score_magnitude():
    ref, out, lse = _reference_and_outputs()
    # An accumulator error proportional to the score magnitude, as the FP8 wgmma's, within
    # the derived slope, passes however large the scores; an offset of the same size does not.
    proportional = lse + 0.9 * (LSE_ABS_MAX + LSE_QK_REL * ref.score_magnitude)
    assert accuracy(out, proportional, ref).passed
    big = dataclasses.replace(ref, score_magnitude=ref.score_magnitude * 100)
    assert accuracy(out, lse + 0.9 * LSE_QK_REL * big.score_magnitude, big).passed
    assert not accuracy(out, lse + 1.2 * (LSE_ABS_MAX + LSE_QK_REL * ref.score_magnitude),
                        ref).passed


def test_a_masking_bug_fails():
    q, k, v = rand_qkv(77)
    ref_in = quantize_reference(q, k, v)
    ref = reference_attention(ref_in)
    # Padded (zero) keys join the softmax.
    qd, kd, vd = ref_in.dequantized()
    pad = torch.zeros(2, 128 - 77, 3, 128)
    wrong = F.scaled_dot_product_attention(
        qd.transpose(1, 2),
        torch.cat([kd, pad], 1).transpose(1, 2),
        torch.cat([vd, pad], 1).transpose(1, 2),
    ).transpose(1, 2)
    m = accuracy(wrong, ref.lse, ref)
    assert not m.passed and m.rel_rms > REL_RMS_MAX


def test_end_to_end_error_includes_quantization():
    q, k, v = rand_qkv(64)
    out = reference_attention(quantize_reference(q, k, v)).out
    e2e = end_to_end_error(out, q, k, v)
    assert 0.005 < e2e < 0.15  # FP8 quantization of q, k, v: a few percent, not zero
