"""The fp32 reference against torch SDPA, and the acceptance metrics against planted faults."""

import pytest
import torch
import torch.nn.functional as F

from variants.prepare import quantize_inputs
from variants.reference import (
    LSE_ABS_MAX,
    REL_RMS_MAX,
    accuracy,
    dequantized_v_absmax,
    end_to_end_error,
    reference_attention,
    validate,
)


def prepared_inputs(seq, batch=2, heads=3, dim=128, seed=1, **kw):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(batch, seq, heads, dim, generator=g).bfloat16() for _ in range(3))
    return (q, k, v), quantize_inputs(q, k, v, **kw)


@pytest.mark.parametrize("seq", [1, 77, 130])
@pytest.mark.parametrize("layout", ["feature-major", "permuted", "natural"])
def test_reference_matches_sdpa_in_fp32(seq, layout):
    _, prepared = prepared_inputs(seq, pad_to=1 if layout == "feature-major" else 64,
                                  permute_keys=layout == "permuted",
                                  v_feature_major=layout != "natural")
    out, lse = reference_attention(prepared, score_budget_bytes=8 * seq * 16)  # force chunking
    q, k, v = (x.transpose(1, 2) for x in prepared.dequantized())
    expected = F.scaled_dot_product_attention(q, k, v).transpose(1, 2)
    torch.testing.assert_close(out, expected, atol=2e-6, rtol=1e-5)
    scores = (q @ k.transpose(-1, -2)) * prepared.softmax_scale
    torch.testing.assert_close(lse, torch.logsumexp(scores, dim=-1), atol=2e-6, rtol=1e-6)


def test_seq_len_one_attends_to_itself():
    _, prepared = prepared_inputs(1)
    out, _ = reference_attention(prepared)
    torch.testing.assert_close(out, prepared.dequantized()[2])


def _p_rounded_output(prepared):
    """What a correct FP8 kernel computes: P * 256 rounded to e4m3 before P @ V."""
    q, k, v = (x.transpose(1, 2) for x in prepared.dequantized())
    s = (q @ k.transpose(-1, -2)) * prepared.softmax_scale
    m = s.amax(-1, keepdim=True)
    p = torch.exp(s - m)
    p8 = (p * 256).to(torch.float8_e4m3fn).float() / 256
    return ((p8 @ v) / p.sum(-1, keepdim=True)).transpose(1, 2), torch.logsumexp(s, -1)


def test_an_fp8_p_kernel_passes_and_its_error_is_as_derived():
    _, prepared = prepared_inputs(300)
    out, lse = _p_rounded_output(prepared)
    metrics = validate(prepared, out.bfloat16(), lse)
    assert metrics.passed, metrics.reason
    assert 0.005 < metrics.rel_rms < REL_RMS_MAX  # P rounding is visible, and within the bound


def test_planted_faults_fail():
    (q, k, v), prepared = prepared_inputs(77, pad_to=64)
    ref_out, ref_lse = reference_attention(prepared)
    vmax = dequantized_v_absmax(prepared)

    unwritten = ref_out.clone()
    unwritten[0, 5] = float("nan")
    m = accuracy(unwritten, ref_lse, ref_out, ref_lse, vmax)
    assert not m.passed and m.nonfinite == 3 * 128 and m.written_share < 1

    # A masking bug: padded (zero) keys join the softmax.
    qd, kd, vd = prepared.dequantized()
    pad = torch.zeros(2, 128 - 77, 3, 128)
    wrong = F.scaled_dot_product_attention(
        qd.transpose(1, 2),
        torch.cat([kd, pad], 1).transpose(1, 2),
        torch.cat([vd, pad], 1).transpose(1, 2),
    ).transpose(1, 2)
    m = accuracy(wrong, ref_lse, ref_out, ref_lse, vmax)
    assert not m.passed and m.rel_rms > REL_RMS_MAX

    m = accuracy(ref_out, ref_lse + 2 * LSE_ABS_MAX, ref_out, ref_lse, vmax)
    assert not m.passed and "LSE" in m.reason

    # A layout bug: two heads swapped.
    swapped = ref_out[:, :, [1, 0, 2]]
    assert not accuracy(swapped, ref_lse, ref_out, ref_lse, vmax).passed


def test_end_to_end_error_includes_quantization():
    (q, k, v), prepared = prepared_inputs(64)
    out, _ = reference_attention(prepared)
    e2e = end_to_end_error(out, q, k, v)
    assert 0.005 < e2e < 0.15  # FP8 quantization of q, k, v: a few percent, not zero
