"""K smoothing's mean kernel (variants/key_mean_kernel.py) on a GPU: bit for bit a torch
emulation of its summation order, within the gate's bound of transforms.smoothing_vector (the
torch path's), a NaN key reaching its own features only, nothing written past m; and a call's
launch plan giving the bits of prepare + run with it."""

import math

import pytest
import torch

from variants import transforms
from variants.key_mean_kernel import THREADS, VEC, launch_scalars
from variants.prepare import mean_launcher, smoothing_vector_on_gpu

pytestmark = pytest.mark.gpu


def _emulated(k: torch.Tensor) -> torch.Tensor:
    """The kernel's arithmetic: `groups` fp32 partial sums per feature, group g adding keys
    g, g + groups, ... of the sample in order; then the partials in group order; / count."""
    _, _, _, stride, count = launch_scalars(k.shape)
    groups = THREADS // (k.shape[-1] // VEC)
    sample = k[:, ::stride].float()  # (batch, count, kv_heads, head_dim)
    partial = torch.zeros((groups, *sample[:, 0].shape), device=k.device)
    for first in range(0, count, groups):
        rows = sample[:, first:first + groups].transpose(0, 1)
        partial[:rows.shape[0]] = partial[:rows.shape[0]] + rows
    total = torch.zeros_like(partial[0])
    for g in range(groups):
        total = total + partial[g]
    return total / torch.tensor(float(count), device=k.device)


def _mean(k: torch.Tensor) -> torch.Tensor:
    """The kernel's m into a poisoned buffer with a NaN guard after it."""
    batch, _, kv_heads, head_dim = k.shape
    size = batch * kv_heads * head_dim
    out = torch.full((size + 256,), math.nan, device=k.device)
    launch = mean_launcher(k)
    assert launch is not None, "the mean kernel did not compile (see the log)"
    smoothing_vector_on_gpu(launch, k, out[:size].view(batch, kv_heads, head_dim))
    torch.cuda.synchronize()
    assert out[size:].isnan().all(), "written past m"
    return out[:size].view(batch, kv_heads, head_dim)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("seq_len_kv", [1, 100, 256, 513, 4097, 30272])
def test_the_mean_kernel_is_its_emulation_and_near_torchs(dtype, head_dim, seq_len_kv):
    g = torch.Generator(device="cuda").manual_seed(seq_len_kv * head_dim)
    # A per-channel bias as real keys carry, and a spread of magnitudes across heads.
    k = torch.randn(2, seq_len_kv, 3, head_dim, device="cuda", generator=g)
    k = (k * torch.tensor([0.5, 2.0, 8.0], device="cuda")[:, None]
         + 4 * torch.randn(1, 1, 3, head_dim, device="cuda", generator=g)).to(dtype)
    got = _mean(k)
    assert torch.equal(got, _emulated(k))
    want = transforms.smoothing_vector(k)
    sample = k[:, ::transforms.sample_stride(seq_len_kv)].float()
    bound = 2.0**-13 * sample.abs().mean(1)  # the gate's bound (docs/gate.md)
    assert ((got - want).abs() <= bound).all()


def test_a_nan_key_reaches_its_own_features_and_head_only():
    k = torch.randn(1, 1024, 2, 128, device="cuda", dtype=torch.bfloat16)
    stride = transforms.sample_stride(1024)
    k[0, 5 * stride, 1, 7] = math.nan
    k[0, 5 * stride + 1, 0, 9] = math.nan  # not a sampled key
    got = _mean(k)
    assert got[0, 1, 7].isnan() and got.isnan().sum() == 1
