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


@pytest.mark.parametrize("rotate", [False, True], ids=["smooth", "both"])
def test_the_quantization_after_the_mean_launch_reads_the_new_m(rotate):
    """The quantization runs as the mean launch's programmatic dependent (sm_90 on): its q and v
    CTAs start beside the mean launch, its k CTAs wait for m. m's buffer holds NaN before each
    mean launch and the quantization is launched right after it (its outputs allocated before),
    so a k CTA that read m early would write NaN codes: every call's codes must be those of
    k - m with the m that launch wrote."""
    from tests.gpu.test_block_quantize_gpu import POISON, _expected
    from variants import block_quantize_kernel
    from variants.block_scales import PackedLayout
    from variants.input_layout import row_strides
    from variants.launch import current_stream_handle

    g = torch.Generator(device="cuda").manual_seed(7)
    # Many quantization CTAs behind few mean CTAs: 2 KV heads, 16384 keys.
    batch, seq, heads, seq_kv, kv_heads, dim = 1, 4096, 8, 16384, 2, 128
    q = torch.randn(batch, seq, heads, dim, device="cuda", generator=g).bfloat16()
    k = (torch.randn(batch, seq_kv, kv_heads, dim, device="cuda", generator=g)
         + 6 * torch.randn(1, 1, kv_heads, dim, device="cuda", generator=g)).bfloat16()
    v = torch.randn(batch, seq_kv, kv_heads, dim, device="cuda", generator=g).bfloat16()
    mean = mean_launcher(k)
    quant = block_quantize_kernel.compiled("quant", q.dtype, dim, q.device, smooth_k=True,
                                           rotate_qk=rotate, permute_keys=True,
                                           write_shift=False)
    assert mean is not None and quant is not None
    layout = PackedLayout(batch, heads, seq, kv_heads, seq_kv)
    m = torch.empty(batch, kv_heads, dim, device="cuda")
    q8 = torch.empty((batch, seq, heads, dim), dtype=torch.uint8, device="cuda")
    k8 = torch.empty((batch, seq_kv, kv_heads, dim), dtype=torch.uint8, device="cuda")
    v8 = torch.empty((batch, kv_heads, dim, seq_kv), dtype=torch.uint8, device="cuda")
    packed = torch.empty(layout.size, device="cuda")
    strides = [x for t in (q, k, v) for x in row_strides(t)]
    for _ in range(20):
        for out in (q8, k8, v8):
            out.fill_(POISON)
        m.fill_(math.nan)
        smoothing_vector_on_gpu(mean, k, m)
        quant(q.data_ptr(), k.data_ptr(), v.data_ptr(), q8.data_ptr(), k8.data_ptr(),
              v8.data_ptr(), packed.data_ptr(), m.data_ptr(), 0, batch, heads, kv_heads, seq,
              seq, seq_kv, seq_kv, *strides, current_stream_handle(q.device))
        torch.cuda.synchronize()
        assert not m.isnan().any()
        want = _expected(q, k, v, m, True, rotate, True, True)
        for name, a, b in zip("qkv", (q8, k8, v8), want[:3], strict=True):
            assert torch.equal(a, b), f"{name} codes differ"
