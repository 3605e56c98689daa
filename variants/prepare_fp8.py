"""The FP8 entry point's path of prepare (tuner.attention_fp8): e4m3 codes the caller quantized,
with their descales per head or per token / 64-key block (variants/input_checks.check_fp8_qkv),
put in the layouts a kernel reads without quantizing anything. The descales become the packed
block scales (one GPU launch, expand_scales_kernel.ExpandScales, or torch ops), and q, k, v are
used in place where they already have the kernel's layout, else copied once (layout_kernel).
prepare's exact transforms (K smoothing, the Q/K rotation) do not apply to codes: the caller
quantized them already.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from variants.block_scales import DESCALE_PER_AMAX, KV_BLOCK, TINY_AMAX, BlockScales, PackedLayout
from variants.fp8_inputs import Fp8Inputs, lay_out, round_up
from variants.input_layout import capturing, gpu_kernels_apply


@dataclass(frozen=True)
class _LayoutCopies:
    """The FP8 entry point's launchers of variants/layout_kernel.py: codes copied as they are
    into the layouts the kernel reads, q's and k's token-major, v's as asked."""

    qk: object
    v: object


def _layout_copies(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, padded: int,
                   padded_kv: int, *, v_feature_major: bool, permute_keys: bool):
    """_LayoutCopies for these e4m3 inputs, or None where they do not apply (gpu_kernels_apply).
    Inside a CUDA-graph capture they are used only if compiled already (compiling loads a module,
    which a capture must not see); the torch path gives the same codes."""
    if not gpu_kernels_apply(q, k, v, padded, padded_kv, v_feature_major):
        return None
    try:
        from variants import layout_kernel
    except ImportError:  # no CuTe DSL in this environment: torch ops
        return None
    now = not capturing()
    copy_v = layout_kernel.compiled(q.shape[-1], q.device, feature_major=v_feature_major,
                                    permute_keys=permute_keys, compile_now=now)
    copy_qk = layout_kernel.compiled(q.shape[-1], q.device, compile_now=now)
    if copy_qk is None or copy_v is None:
        return None
    return _LayoutCopies(copy_qk, copy_v)


def fp8_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    descales: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    *,
    pad_to: int = 1,
    permute_keys: bool = False,
    softmax_scale: float | None = None,
    v_feature_major: bool = True,
) -> Fp8Inputs:
    """Fp8Inputs from e4m3 codes the caller quantized (x ~= code * descale, per head or per
    token / 64-key block: check_fp8_qkv states both), checked by check_fp8_qkv: no
    quantization, only the layout the kernel reads. q and k are used as they are when contiguous
    and their length is a multiple of pad_to (else copied, zero-padded); V likewise for a kernel
    that reads it in the natural layout, else re-laid out feature-major (and key-permuted) in
    one pass over its codes. No transform applies: k_mean is None and qk_rotated False."""
    from variants.launch import current_stream_handle

    batch, seq_len, heads, head_dim = q.shape
    seq_len_kv, kv_heads = k.shape[1], k.shape[2]
    if softmax_scale is None:
        softmax_scale = head_dim**-0.5
    padded, padded_kv = round_up(seq_len, pad_to), round_up(seq_len_kv, pad_to)
    scale_layout = PackedLayout(batch, heads, padded, kv_heads, padded_kv)
    views = _descale_views(descales, batch, heads, kv_heads, seq_len, seq_len_kv)
    packed = _expand_scales(views, scale_layout, seq_len, seq_len_kv)
    if packed is None:  # no GPU kernel: the same values by torch ops
        tiny = TINY_AMAX * DESCALE_PER_AMAX  # as ExpandScales: a zero descale would give NaN
        packed = BlockScales(*(d.permute(0, 2, 1).clamp_min(tiny) for d in views)).packed(
            padded, padded_kv)
    as_is = padded == seq_len and padded_kv == seq_len_kv
    natural_v = as_is and not v_feature_major and v.is_contiguous()
    kernels = None
    if not (as_is and q.is_contiguous() and k.is_contiguous() and natural_v):
        kernels = _layout_copies(q, k, v, padded, padded_kv, v_feature_major=v_feature_major,
                                 permute_keys=permute_keys)
    out = []
    for index, x in enumerate((q, k, v)):
        is_v = index == 2
        feature_major = is_v and v_feature_major
        length, rows, x_heads = (seq_len, padded, heads) if index == 0 else \
            (seq_len_kv, padded_kv, kv_heads)
        if length == rows and x.is_contiguous() and not feature_major:
            out.append(x)
        elif kernels is not None:
            layout = torch.empty((batch, x_heads, head_dim, rows) if feature_major
                                 else (batch, rows, x_heads, head_dim),
                                 dtype=torch.float8_e4m3fn, device=x.device)
            copy = kernels.v if is_v else kernels.qk
            copy(x.data_ptr(), layout.data_ptr(), batch, length, rows, x_heads,
                 current_stream_handle(x.device))
            out.append(layout)
        else:
            natural = torch.empty((batch, rows, x_heads, head_dim), dtype=torch.float8_e4m3fn,
                                  device=x.device)
            natural[:, :length].view(torch.uint8).copy_(x.view(torch.uint8))
            out.append(lay_out(natural, length, feature_major=feature_major,
                                permute_keys=is_v and permute_keys))
    q8, k8, v8 = out
    return Fp8Inputs(q=q8, k=k8, v=v8, packed=packed, seq_len=seq_len,
                     key_permuted=permute_keys, softmax_scale=float(softmax_scale),
                     v_feature_major=v_feature_major, seq_len_kv=seq_len_kv,
                     kv_head_scales=all(d.dim() < 3 for d in descales[1:]))


def _descale_views(descales, batch: int, heads: int, kv_heads: int, seq_len: int,
                   seq_len_kv: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The caller's descales as q's (batch, seq_len, heads) and k's and v's (batch, blocks,
    kv_heads) views, a per-head descale broadcast (stride 0) over rows or blocks: no copy."""
    blocks = -(-seq_len_kv // KV_BLOCK)
    shapes = ((seq_len, heads), (blocks, kv_heads), (blocks, kv_heads))
    return tuple(d if d.dim() == 3 else d.expand(batch, h)[:, None, :].expand(batch, n, h)
                 for d, (n, h) in zip(descales, shapes, strict=True))


def _expand_scales(views, layout: PackedLayout, seq_len: int, seq_len_kv: int):
    """The packed block scales of the caller's descales by one GPU launch
    (expand_scales_kernel.ExpandScales: each read through its strides), or None where it does
    not apply (descales off the GPU, no CuTe DSL, inside a CUDA-graph capture before it
    compiled)."""
    if not all(d.is_cuda for d in views):
        return None
    try:
        from variants import block_quantize_kernel
        from variants.launch import current_stream_handle
    except ImportError:
        return None
    device = views[0].device
    launch = block_quantize_kernel.compiled("expand", torch.float32, 0, device,
                                            compile_now=not capturing())
    if launch is None:
        return None
    packed = torch.empty(layout.size, dtype=torch.float32, device=device)
    dq, dk, dv = views
    launch(dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), packed.data_ptr(), layout.batch,
           layout.heads, layout.kv_heads, seq_len, layout.padded_len, seq_len_kv,
           layout.padded_len_kv, *dq.stride(), *dk.stride(), *dv.stride(),
           current_stream_handle(device))
    return packed
