"""The exact transforms prepare may apply to q and k before quantizing them: the one statement of
their arithmetic, which the GPU quantization (variants/block_quantize_kernel.py) reproduces bit for
bit and the gate (variants/reference.py) re-derives on its own. docs/accuracy.md has the why and
the measurements.

K smoothing (`k_smoothing="mean"`): m = the mean of a strided sample of the keys of each (batch,
KV head), k' = k - m for every key. Every score of a query row moves by the same q . m, so the
softmax and the output are unchanged; LSE moves by softmax_scale * q . m, which prepare computes
from the caller's q and the kernels' LSE gets back (`lse_shift`). Any vector keeps it exact; the
mean removes a per-channel bias shared by the tokens, which would otherwise take most of e4m3's
range in every 64-key block.

Q/K rotation (`qk_rotation="hadamard"`): q' = q R and k' = k R with R = diag(signs) H / sqrt(d),
H the Sylvester Hadamard matrix of size head_dim and `signs` a fixed random +-1 vector. R is
orthogonal, so q' k'^T = q k^T; an outlier channel is spread over all channels before rounding.
In fp32: x * signs (exact), then the butterflies with stride 1, 2, 4, ..., d/2 in that order,
(a, b) -> (a + b, a - b) for the pair (i, i + stride) with bit `stride` of i clear, then one
multiply by fl32(d^-0.5). Smoothing, when both are on, comes first: k' = (k - m) R.
"""

from __future__ import annotations

import functools

import torch

K_SMOOTHINGS = ("off", "mean")
QK_ROTATIONS = ("none", "hadamard")

# Keys the smoothing vector averages: a strided sample of at least this many (every key up to
# it). A shared bias is estimated to 1/16 of a token's spread from 256 keys, and the sample's
# read is a fraction of a percent of K's.
MEAN_SAMPLE_KEYS = 256

# The rotation's signs, bit i set: feature i negated. 128 bits from a fixed random draw; head_dim
# 64 uses the first 64.
HADAMARD_SIGN_BITS = 0x9E3779B97F4A7C15F39CC0605CEDC834
MAX_ROTATION_DIM = 128


def sample_stride(seq_len_kv: int, sample_keys: int | None = MEAN_SAMPLE_KEYS) -> int:
    """The stride of the keys the smoothing vector averages (1: all of them; sample_keys=None
    asks for the full mean)."""
    if sample_keys is None:
        return 1
    return max(1, seq_len_kv // sample_keys)


def smoothing_vector(k: torch.Tensor, sample_keys: int | None = MEAN_SAMPLE_KEYS) -> torch.Tensor:
    """m (batch, kv_heads, head_dim) fp32: the mean of keys 0, s, 2s, ... of k (batch, seq_len_kv,
    kv_heads, head_dim), s = sample_stride."""
    stride = sample_stride(k.shape[1], sample_keys)
    return k[:, ::stride].mean(dim=1, dtype=torch.float32)


@functools.lru_cache(maxsize=16)
def rotation_signs(head_dim: int, device=None) -> torch.Tensor:
    """The +-1 vector of the rotation (fp32, head_dim), made once per device: a host-to-device
    copy on every call would cost host time and is illegal inside a CUDA-graph capture."""
    if head_dim > MAX_ROTATION_DIM or head_dim & (head_dim - 1):
        raise ValueError(f"the Hadamard rotation needs a power-of-two head_dim <= "
                         f"{MAX_ROTATION_DIM}, got {head_dim}")
    bits = [(HADAMARD_SIGN_BITS >> i) & 1 for i in range(head_dim)]
    return torch.tensor([-1.0 if b else 1.0 for b in bits], dtype=torch.float32, device=device)


def rotation_norm(head_dim: int) -> float:
    """fl32(head_dim^-0.5), the one multiply after the butterflies."""
    return float(torch.tensor(head_dim**-0.5, dtype=torch.float32))


def rotate(x: torch.Tensor) -> torch.Tensor:
    """x (..., head_dim) rotated by R in fp32, in the order the module docstring states."""
    d = x.shape[-1]
    y = x.float() * rotation_signs(d, x.device)
    stride = 1
    while stride < d:
        pairs = y.unflatten(-1, (d // (2 * stride), 2, stride))
        a, b = pairs[..., 0, :], pairs[..., 1, :]
        y = torch.stack((a + b, a - b), dim=-2).flatten(-3)
        stride *= 2
    return y * rotation_norm(d)


def lse_shift(q: torch.Tensor, m: torch.Tensor, softmax_scale: float) -> torch.Tensor:
    """softmax_scale * q . m per query row: (batch, heads, seq_len) fp32 for q (batch, seq_len,
    heads, head_dim) and m (batch, kv_heads, head_dim); query head h uses KV head h // group."""
    group = q.shape[2] // m.shape[1]
    m_q = m.repeat_interleave(group, dim=1)  # (batch, heads, head_dim)
    return torch.einsum("bshd,bhd->bhs", q.float(), m_q) * softmax_scale


def check_knobs(k_smoothing: str, qk_rotation: str) -> str | None:
    """None when both values are known, else what is wrong."""
    if k_smoothing not in K_SMOOTHINGS:
        return f"k_smoothing={k_smoothing!r} unknown; one of {K_SMOOTHINGS}"
    if qk_rotation not in QK_ROTATIONS:
        return f"qk_rotation={qk_rotation!r} unknown; one of {QK_ROTATIONS}"
    return None

