"""Which of prepare's paths a set of inputs takes: whether its GPU kernels (the one-pass
quantization, K smoothing's mean) take their shapes and layouts, and the (batch, token, head)
element strides they read a view through. Stored times depend on these answers, so the code
version counts this module (variants/input_checks.py, the boundary's checks, times nothing).
"""

from __future__ import annotations

import torch


def capturing() -> bool:
    # is_initialized, not is_available: no capture runs before CUDA is initialized, and
    # is_available asks NVML (~10 us of host time per call on the H200's host).
    return torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()


def gpu_kernels_apply(q, k, v, padded: int, padded_kv: int, v_feature_major: bool) -> bool:
    """Whether prepare's GPU kernels take these inputs: contiguous, 16-byte aligned CUDA tensors
    (gpu_kernels_take the shapes)."""
    if not q.is_cuda or not gpu_kernels_take(q.shape, k.shape, padded, padded_kv,
                                             v_feature_major):
        return False
    return all(x.is_contiguous() and x.data_ptr() % 16 == 0 for x in (q, k, v))


def row_strides(x) -> tuple[int, int, int] | None:
    """The (batch, token, head) element strides of a (batch, seq_len, heads, head_dim) input as
    the one-pass quantization reads it, or None where it cannot: head_dim contiguous, every row
    16-byte aligned (the base and each stride), every offset within 32 bits. A dimension of size
    1 gets stride 0 (its stride is never used). SDPA's layout viewed back, (batch, heads,
    seq_len, head_dim) contiguous, is such an input: no copy is needed to quantize it."""
    if x.stride(-1) != 1 or x.data_ptr() % 16:
        return None
    piece = 16 // x.element_size()
    last, found = x.shape[-1] - 1, []
    for size, stride in zip(x.shape[:3], x.stride()[:3], strict=True):
        if size == 1:
            found.append(0)
            continue
        if stride % piece:
            return None
        found.append(stride)
        last += (size - 1) * stride
    return tuple(found) if last < 2**31 else None


def contiguous_row_strides(shape) -> tuple[int, int, int]:
    """row_strides of a contiguous tensor of this shape."""
    _, seq_len, heads, head_dim = shape
    strides = (seq_len * heads * head_dim, heads * head_dim, head_dim)
    return tuple(0 if size == 1 else stride
                 for size, stride in zip(shape[:3], strides, strict=True))


def gpu_quantization_applies(q, k, v, padded: int, padded_kv: int,
                             v_feature_major: bool) -> bool:
    """Whether the one-pass quantization takes these inputs: CUDA tensors of shapes
    gpu_kernels_take takes, each with row_strides (contiguous or not)."""
    return q.is_cuda and gpu_kernels_take(q.shape, k.shape, padded, padded_kv,
                                          v_feature_major) \
        and all(row_strides(x) is not None for x in (q, k, v))


def gpu_kernels_take(q_shape, k_shape, padded: int, padded_kv: int,
                     v_feature_major: bool) -> bool:
    """Whether prepare's GPU kernels take inputs of these shapes (v has k's): padded outputs with
    32-bit offsets, and, for feature-major V, padded_kv % 8 == 0 (8 keys a store)."""
    for shape, rows in ((q_shape, padded), (k_shape, padded_kv)):
        if shape[0] * shape[2] * shape[3] * rows >= 2**31:
            return False
    return not (v_feature_major and padded_kv % 8)
