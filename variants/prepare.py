"""FP8 input preparation shared by every family: transform, quantize, lay out V, pad, permute keys.

q, k, v arrive as bf16/fp16 (batch, seq_len, heads, head_dim). They get block scales
(variants/block_scales.py): q one per token and head, k and v one per 64 keys of a KV head, each
decided by the block it scales, so every input is read once and one outlier token or block does
not crush the resolution of the rest: x_fp8 = round_e4m3(x * 448 / amax), descale = amax / 448.
The kernels fold them into the softmax (Q's and K's into the exponent's factor, V's as log2 sv
in the exponent and 1 / sv in the row sum), so the epilogue has no descale left. The scales
travel packed in one fp32 buffer (block_scales.PackedLayout), the kernels' one pointer.

Before quantizing, the config's exact transforms (variants/transforms.py, docs/accuracy.md):
k_smoothing="mean" quantizes k - m (m per batch and KV head) and keeps q . m per row for the
LSE; qk_rotation="hadamard" quantizes q R and k R. The kernels compute on those codes unchanged.

V is stored feature-major, (batch, heads, head_dim, padded_len), so the P @ V GEMM reads it with
keys contiguous (K-major B operand) without a transpose in the kernel. For the register-P trick,
the key order inside every 16-key group is permuted once here, so that the accumulator fragment
of S can be reused as the A fragment of P @ V without crossing lanes. On a GPU one launch
(variants/block_quantize_kernel.py) transforms and quantizes all three inputs and writes that
layout and order itself. A kernel that transposes V itself (wgmma with v_layout=kernel) asks for
the natural layout instead, (batch, padded_len, heads, head_dim) like K, and applies any key
order in shared memory. A kernel with P.V in 16 bits (v_unquantized) reads V unquantized:
prepare passes the caller's V on in bf16 (variants/prepare_v16.py) with neutral V scales. A
kernel with QK^T in int8 (qk_dtype="int8") gets q's and k's codes as int8 with amax / 127 scales,
the same granularities and layouts. Codes the caller quantized go through
variants/prepare_fp8.py.
"""

from __future__ import annotations

import torch

from variants import block_scales, transforms
from variants.block_scales import PackedLayout
from variants.fp8_inputs import Fp8Inputs, lay_out, q_dot, round_up
from variants.input_checks import check_finite_inputs, check_fp8_qkv, check_qkv
from variants.input_layout import (
    capturing,
    gpu_kernels_take,
    gpu_quantization_applies,
    row_strides,
)
from variants.key_order import inverse_key_order, key_slot, register_p_key_order
from variants.prepare_fp8 import fp8_inputs
from variants.prepare_v16 import kernel_rows, unquantized_v

__all__ = ["Fp8Inputs", "check_finite_inputs", "check_fp8_qkv", "check_qkv", "fp8_inputs",
           "inverse_key_order", "key_slot", "quantize_inputs", "register_p_key_order",
           "round_up"]


def quant_launcher(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, padded: int,
                   padded_kv: int, *, v_feature_major: bool, permute_keys: bool, with_q: bool,
                   smooth_k: bool, rotate_qk: bool, with_v: bool = True,
                   check_inputs: bool = True, qk_int8: bool = False,
                   write_shift: bool = True):
    """The one-pass launcher of variants/block_quantize_kernel.py for these inputs, or None
    where it does not apply (gpu_quantization_applies; check_inputs=False: the shapes alone,
    gpu_kernels_take, for a caller that checks each call's layout itself). write_shift=False:
    with smooth_k, no q . m, for a call that drops the LSE. Inside a CUDA-graph
    capture only if compiled already (compiling loads a module, which a capture must not see);
    the torch formula gives the same codes."""
    if not (gpu_quantization_applies(q, k, v, padded, padded_kv, v_feature_major)
            if check_inputs else
            q.is_cuda and gpu_kernels_take(q.shape, k.shape, padded, padded_kv, v_feature_major)):
        return None
    try:
        from variants import block_quantize_kernel
    except ImportError:  # no CuTe DSL in this environment: torch ops
        return None
    return block_quantize_kernel.compiled("quant" if with_q else "quant_kv", k.dtype,
                                          q.shape[-1], q.device,
                                          v_feature_major=v_feature_major,
                                          permute_keys=permute_keys, smooth_k=smooth_k,
                                          rotate_qk=rotate_qk, quantize_v=with_v,
                                          qk_int8=qk_int8, write_shift=write_shift,
                                          compile_now=not capturing())


def mean_launcher(k: torch.Tensor):
    """The launcher of K smoothing's mean kernel (variants/key_mean_kernel.py) for a k the
    quantization's launch reads (input_layout.row_strides), or None (compiled only outside
    a CUDA-graph capture, as quant_launcher's)."""
    from variants import block_quantize_kernel

    return block_quantize_kernel.compiled("mean", k.dtype, k.shape[-1], k.device,
                                          compile_now=not capturing())


def smoothing_vector_on_gpu(launch, k: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """transforms.smoothing_vector of k into `out` (fp32 (batch, kv_heads, head_dim), 16-byte
    aligned), by `launch` (mean_launcher's)."""
    from variants.key_mean_kernel import launch_scalars
    from variants.launch import current_stream_handle

    launch(k.data_ptr(), out.data_ptr(), *launch_scalars(k.shape), *row_strides(k),
           current_stream_handle(k.device))
    return out


def _block_quantize_on_gpu(launch, q, k, v, layout: PackedLayout, v_feature_major: bool,
                           with_q: bool, k_mean: torch.Tensor | None, with_v: bool = True,
                           qk_codes: torch.dtype = torch.float8_e4m3fn, write_shift: bool = True):
    """(codes of q, k, v in the kernel's layouts, packed scales, q . m or None): one launch,
    the outputs and one scale buffer allocated (each allocation costs host time). with_q=False
    (a launcher without q's CTAs): q is returned as it came, q's part of the scales is not
    written, and q . m is not computed. k_mean (fp32 contiguous (batch, kv_heads, head_dim)):
    the launch subtracts it from the real keys, and its q CTAs write q . m. with_v=False (a
    launcher without v's CTAs, whose k CTAs write V's neutral scales): v is returned as it
    came. qk_codes: q's and k's codes' dtype (the launcher's)."""
    from variants.launch import current_stream_handle

    batch, seq_len, heads, head_dim = q.shape
    kv_heads = k.shape[2]
    device = q.device
    natural = (batch, layout.padded_len, heads, head_dim)
    natural_kv = (batch, layout.padded_len_kv, kv_heads, head_dim)
    v_shape = (batch, kv_heads, head_dim, layout.padded_len_kv) if v_feature_major \
        else natural_kv
    if not with_q:
        q8, k8 = q, torch.empty(natural_kv, dtype=qk_codes, device=device)
    elif natural == natural_kv:
        q8, k8 = torch.empty((2, *natural), dtype=qk_codes, device=device).unbind(0)
    else:
        q8, k8 = (torch.empty(shape, dtype=qk_codes, device=device)
                  for shape in (natural, natural_kv))
    v8 = torch.empty(v_shape, dtype=torch.float8_e4m3fn, device=device) if with_v else v
    packed = torch.empty(layout.size, dtype=torch.float32, device=device)
    shift = None
    if k_mean is not None and with_q and write_shift:
        shift = torch.empty((batch, heads, seq_len), dtype=torch.float32, device=device)
    launch(q.data_ptr(), k.data_ptr(), v.data_ptr(), q8.data_ptr(), k8.data_ptr(),
           v8.data_ptr() if with_v else 0,
           packed.data_ptr(), 0 if k_mean is None else k_mean.data_ptr(),
           0 if shift is None else shift.data_ptr(),
           *quant_scalars(q.shape, k.shape, layout), *row_strides(q), *row_strides(k),
           *row_strides(v), current_stream_handle(device))
    return q8, k8, v8, packed, shift


def quant_scalars(q_shape, k_shape, layout: PackedLayout) -> tuple[int, ...]:
    """The scalars of a quantization launch that the shapes decide, after its pointers: batch,
    heads, kv_heads, seq_len, padded, seq_len_kv, padded_kv. The caller appends q's, k's and v's
    (batch, token, head) strides (input_layout.row_strides), which each call's inputs decide."""
    batch, seq_len, heads, _ = q_shape
    return (batch, heads, k_shape[2], seq_len, layout.padded_len, k_shape[1],
            layout.padded_len_kv)


def _transformed(q: torch.Tensor, k: torch.Tensor, k_mean: torch.Tensor | None, rotate: bool):
    """q and k as the torch path quantizes them: k - m (fp32) with k_mean, then q R and k R."""
    if k_mean is not None:
        k = k.float() - k_mean[:, None]
    if rotate:
        q, k = transforms.rotate(q), transforms.rotate(k)
    return q, k


def quantize_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    pad_to: int = 1,
    permute_keys: bool = False,
    softmax_scale: float | None = None,
    validate: bool = True,
    v_feature_major: bool = True,
    q_in_kernel: bool = False,
    k_smoothing: str = "off",
    qk_rotation: str = "none",
    v_unquantized: bool = False,
    qk_dtype: str = "e4m3",
    want_lse: bool = True,
    kv_scales: str = "block",
) -> Fp8Inputs:
    """Transform, quantize and lay out q, k, v for the FP8 kernels, on the device the inputs
    live on.

    q is (batch, seq_len, heads, head_dim); k and v (batch, seq_len_kv, kv_heads, head_dim), with
    heads a multiple of kv_heads (grouped-query attention; equal shapes for self-attention).
    pad_to: zero-pad both lengths up to a multiple of this (the kernel's tile), so that every
    tile load is in bounds; kernels still mask keys and skip stores past the lengths.
    permute_keys: store V's keys in register_p_key_order (pad_to must then be a multiple of 16).
    v_feature_major: V as (batch, kv_heads, head_dim, padded_kv); False keeps (batch, padded_kv,
    kv_heads, head_dim) for a kernel that transposes V itself (no key permutation then).
    q_in_kernel: for a kernel that quantizes Q itself: q (bf16) is passed on as it is
    (contiguous), and only k and v are quantized (q . m, if smoothing, on first use).
    k_smoothing, qk_rotation: the exact transforms of variants/transforms.py ("off" / "mean",
    "none" / "hadamard"); the rotation needs q quantized here (not q_in_kernel).
    v_unquantized: for a kernel with P.V in 16 bits: v is passed on in bf16, natural layout,
    unpadded (prepare_v16.unquantized_v), its packed scales neutral; only q and k are quantized.
    want_lse=False: for a caller that drops the LSE, K smoothing's q . m is not computed (the
    quantization's build without the dot, as a repeated call's), and the inputs refuse to
    restore an LSE (Fp8Inputs.lse_dropped).
    kv_scales="head": k's and v's scales one per (batch, KV head) (block_scales.quantize_heads),
    for a kernel that folds them per head; the torch formula computes them (an amax pass over
    each head before its first code), in the same packed layout.
    """
    if validate:
        check_qkv(q, k, v)
    batch, seq_len, heads, head_dim = q.shape
    seq_len_kv = k.shape[1]
    if softmax_scale is None:
        softmax_scale = head_dim**-0.5
    if permute_keys and not v_feature_major:
        raise ValueError("permute_keys applies to feature-major V only: a kernel that reads V in "
                         "its natural layout orders the keys itself")
    if v_unquantized and (permute_keys or v_feature_major):
        raise ValueError("v_unquantized: the kernel reads V in its natural layout and order; "
                         "use v_feature_major=False, permute_keys=False")
    if permute_keys and pad_to % 16:
        raise ValueError(f"permute_keys needs pad_to to be a multiple of 16, got {pad_to}")
    unknown = transforms.check_knobs(k_smoothing, qk_rotation)
    if unknown:
        raise ValueError(unknown)
    smooth, rotate = k_smoothing == "mean", qk_rotation == "hadamard"
    if qk_dtype not in block_scales.QK_CODE_DTYPES:
        raise ValueError(f"qk_dtype={qk_dtype!r}: one of {tuple(block_scales.QK_CODE_DTYPES)}")
    qk_int8, codes_dtype = qk_dtype == "int8", block_scales.QK_CODE_DTYPES[qk_dtype]
    if qk_int8 and q_in_kernel:
        raise ValueError("qk_dtype='int8' quantizes q to int8 here, and a kernel that quantizes "
                         "Q itself writes e4m3 codes: use q_in_kernel=False")
    if rotate and q_in_kernel:
        raise ValueError("qk_rotation='hadamard' rotates q before it is quantized, and a kernel "
                         "that quantizes Q itself reads the caller's q: use q_in_kernel=False")
    if kv_scales not in block_scales.KV_SCALES:
        raise ValueError(f"kv_scales={kv_scales!r}: one of {block_scales.KV_SCALES}")
    padded, padded_kv = round_up(seq_len, pad_to), round_up(seq_len_kv, pad_to)

    layout = PackedLayout(batch, heads, padded, k.shape[2], padded_kv)
    q_padded_len = None
    if q_in_kernel:
        if q.dtype != torch.bfloat16:
            raise ValueError(f"q_in_kernel: the kernel reads bf16 q, got {q.dtype}; run the "
                             "config's for_q_dtype() twin, which quantizes q here")
        q = kernel_rows(q)  # the kernel reads (batch, seq_len, heads, head_dim) rows
        q_padded_len = padded
    v16 = unquantized_v(v) if v_unquantized else None
    v_in = v if v16 is None else v16
    # The one-pass launch computes block scales; per-head ones take the torch formula.
    launch = None if kv_scales == "head" else quant_launcher(
        q, k, v_in, padded, padded_kv, v_feature_major=v_feature_major,
        permute_keys=permute_keys, with_q=not q_in_kernel, smooth_k=smooth, rotate_qk=rotate,
        with_v=v16 is None, qk_int8=qk_int8, write_shift=want_lse)
    # The mean of a strided sample of the keys: with the quantization's launch, the mean
    # kernel's (as the launch plans compute it), else one torch reduction.
    k_mean = None
    if smooth:
        mean = mean_launcher(k) if launch is not None else None
        k_mean = smoothing_vector_on_gpu(mean, k, torch.empty(
            k.shape[0], k.shape[2], head_dim, dtype=torch.float32, device=k.device)) \
            if mean is not None else transforms.smoothing_vector(k).contiguous()
    common = dict(seq_len=seq_len, key_permuted=permute_keys, softmax_scale=float(softmax_scale),
                  v_feature_major=v_feature_major, seq_len_kv=seq_len_kv,
                  q_padded_len=q_padded_len, k_mean=k_mean, qk_rotated=rotate,
                  lse_dropped=smooth and not want_lse, kv_head_scales=kv_scales == "head")
    if launch is not None:
        q8, k8, v8, packed, shift = _block_quantize_on_gpu(launch, q, k, v_in, layout,
                                                           v_feature_major, not q_in_kernel,
                                                           k_mean, with_v=v16 is None,
                                                           qk_codes=codes_dtype,
                                                           write_shift=want_lse)
        return Fp8Inputs(q=q8, k=k8, v=v8, packed=packed, q_dot_mean=shift, **common)
    # Elsewhere (no GPU, no CuTe DSL, a strided input, per-head scales): the torch formula.
    # (q_in_kernel: q's codes are computed too, and dropped; only its descales' place in the
    # packed buffer is used, with q's, which the kernel does not read.)
    shift = q_dot(q, k_mean) if smooth and not q_in_kernel and want_lse else None
    q_t, k_t = _transformed(q, k, k_mean, rotate)
    codes, scales = block_scales.quantize(q_t, k_t, v, qk_dtype, kv_scales)
    out = []
    for index, x8 in enumerate(codes):
        is_v = index == 2
        length, rows = (seq_len, padded) if index == 0 else (seq_len_kv, padded_kv)
        natural = torch.empty((batch, rows, x8.shape[2], head_dim), dtype=x8.dtype,
                              device=q.device)
        natural[:, :length].view(torch.uint8).copy_(x8.view(torch.uint8))
        out.append(lay_out(natural, length, feature_major=is_v and v_feature_major,
                           permute_keys=is_v and permute_keys))
    q8, k8, v8 = out
    if q_in_kernel:
        q8 = q
    if v16 is not None:  # V's codes are dropped, its scales neutral
        v8, scales.v = v16, torch.ones_like(scales.v)
    return Fp8Inputs(q=q8, k=k8, v=v8, packed=scales.packed(padded, padded_kv),
                     q_dot_mean=shift, **common)
