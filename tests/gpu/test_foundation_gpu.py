"""Prepare + reference at the video-DiT shape on the GPU: memory bound and time (printed)."""

import time

import pytest
import torch

from variants.prepare import quantize_inputs
from variants.reference import accuracy, reference_attention

pytestmark = pytest.mark.gpu

# The reference holds fp32 copies of q, k, v and its fp32 output (4 x 0.87 GB here), and beyond
# those only a bounded score block: it works one head and one query chunk of at most
# score_budget_bytes / 2 of scores at a time. A full (seq, seq) block of one head alone would be
# 3.7 GB, so a reference that stopped chunking fails this.
SCRATCH_BYTES_MAX = 2**30


def _timed(fn):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    result = fn()
    torch.cuda.synchronize()
    return result, time.perf_counter() - t0


def test_prepare_and_reference_at_video_dit_shape():
    batch, seq, heads, dim = 1, 30272, 56, 128
    q, k, v = (
        torch.randn(batch, seq, heads, dim, device="cuda", dtype=torch.bfloat16) for _ in "qkv"
    )
    prepared, _ = _timed(lambda: quantize_inputs(q, k, v, pad_to=128, permute_keys=True))
    prepared, prepare_s = _timed(lambda: quantize_inputs(q, k, v, pad_to=128, permute_keys=True))
    assert prepared.v.shape == (1, 56, 128, 30336) and prepared.v.is_cuda

    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    ref, reference_s = _timed(lambda: reference_attention(prepared))
    ref_out, ref_lse = ref.out, ref.lse
    extra = torch.cuda.max_memory_allocated() - base
    print(
        f"\nB=1 H=56 S=30272 D=128 on {torch.cuda.get_device_name()}: "
        f"prepare {prepare_s * 1e3:.1f} ms,"
        f" fp32 reference {reference_s:.2f} s, reference peak extra memory {extra / 2**30:.2f} GiB"
    )
    fixed = 4 * batch * seq * heads * dim * 4  # fp32 q, k, v and the fp32 output
    assert extra < fixed + SCRATCH_BYTES_MAX, f"{extra - fixed} bytes of scratch"
    assert torch.isfinite(ref_out).all() and torch.isfinite(ref_lse).all()
    # Spot check two heads against SDPA in fp32 on the dequantized inputs.
    qd, kd, vd = prepared.dequantized()
    for h in (0, 55):
        expected = torch.nn.functional.scaled_dot_product_attention(
            qd[:, :, h : h + 1].transpose(1, 2),
            kd[:, :, h : h + 1].transpose(1, 2),
            vd[:, :, h : h + 1].transpose(1, 2),
        ).transpose(1, 2)
        torch.testing.assert_close(ref_out[:, :, h : h + 1], expected, atol=1e-4, rtol=1e-3)
    # The reference passes its own acceptance test (bf16 rounding of the output only).
    assert accuracy(ref_out.bfloat16(), ref_lse, ref).passed
