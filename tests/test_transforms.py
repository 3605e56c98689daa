"""The transforms prepare may apply keep attention exact: a rotation that is orthogonal, a smoothing
that shifts a row's scores by one constant."""

import pytest
import torch

from variants import transforms


@pytest.mark.parametrize("head_dim", [64, 128])
def test_rotation_is_orthogonal_and_keeps_scores(head_dim):
    eye = torch.eye(head_dim)
    r = transforms.rotate(eye)
    assert torch.allclose(r @ r.t(), eye, atol=1e-5)
    q, k = torch.randn(3, head_dim), torch.randn(5, head_dim)
    assert torch.allclose(transforms.rotate(q) @ transforms.rotate(k).t(), q @ k.t(), atol=1e-4)
    # R = diag(signs) H / sqrt(d), H built here by Sylvester's doubling; the signs are mixed.
    h = torch.ones(1, 1)
    while h.shape[0] < head_dim:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    signs = transforms.rotation_signs(head_dim)
    assert torch.allclose(r, torch.diag(signs) @ h * head_dim**-0.5, atol=1e-6)
    assert 0.25 < float((signs < 0).float().mean()) < 0.75


def test_rotation_spreads_an_outlier_channel():
    x = torch.zeros(128)
    x[7] = 30.0
    y = transforms.rotate(x)
    assert torch.allclose(y.abs(), torch.full_like(y, 30.0 / 128**0.5))


def test_smoothing_shift_is_the_score_offset():
    q = torch.randn(1, 6, 4, 64)
    k = torch.randn(1, 9, 2, 64) + 5 * torch.randn(1, 1, 2, 64)
    m = transforms.smoothing_vector(k, sample_keys=None)
    assert torch.allclose(m, k.mean(dim=1))
    scale = 0.3
    full = torch.einsum("bshd,bthd->bhst", q, k.repeat_interleave(2, 2)) * scale
    smoothed = torch.einsum("bshd,bthd->bhst", q, (k - m[:, None]).repeat_interleave(2, 2)) * scale
    shift = transforms.lse_shift(q, m, scale)
    assert torch.allclose(full - smoothed, shift[..., None].expand_as(full), atol=1e-4)
    assert torch.allclose(full.logsumexp(-1), smoothed.logsumexp(-1) + shift, atol=1e-4)


def test_sample_stride_covers_at_least_the_sample():
    for n in (1, 255, 256, 511, 512, 30272):
        stride = transforms.sample_stride(n)
        assert len(range(0, n, stride)) >= min(n, transforms.MEAN_SAMPLE_KEYS)
    assert transforms.sample_stride(30272, None) == 1


@pytest.mark.parametrize("seq_len_kv", [1, 255, 256, 511, 512, 513, 1000, 4097, 75600])
def test_the_mean_kernel_averages_the_keys_of_smoothing_vectors_slice(seq_len_kv):
    """variants/key_mean_kernel.py's launch: keys j * stride for j < count, each (batch, KV
    head) its own CTA; the same keys as smoothing_vector's slice k[:, ::stride]."""
    from variants.input_layout import contiguous_row_strides
    from variants.key_mean_kernel import launch_scalars

    shape = (2, seq_len_kv, 3, 64)
    ctas, length, kv_heads, stride, count = launch_scalars(shape)
    assert (ctas, length, kv_heads) == (6, seq_len_kv, 3)
    # What a launch appends for a contiguous k.
    assert list(contiguous_row_strides(shape)) == [
        seq_len_kv * 3 * 64 if seq_len_kv > 1 else 3 * 64, 3 * 64 if seq_len_kv > 1 else 0, 64]
    assert [j * stride for j in range(count)] == \
        list(range(seq_len_kv))[::transforms.sample_stride(seq_len_kv)]


def test_bad_head_dim_and_knobs_are_named():
    with pytest.raises(ValueError, match="power-of-two"):
        transforms.rotation_signs(96)
    assert "k_smoothing" in transforms.check_knobs("median", "none")
    assert "qk_rotation" in transforms.check_knobs("mean", "random")
    assert transforms.check_knobs("mean", "hadamard") is None
