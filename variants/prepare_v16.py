"""V for a kernel with P.V in 16 bits (wgmma's pv_dtype="bf16"): not quantized. The kernel
TMA-loads the caller's V in its natural layout (batch, seq_len_kv, kv_heads, head_dim) as the
MN-major B operand of a bf16 wgmma, at its real length: TMA fills the keys past it with zeros,
so no padding is written and a masked P of 0 never meets a NaN. V's block scales in the packed
buffer are neutral (1: log2 0, 1 / 1), so the kernels' softmax fold stays as it is.

fp16 callers get their V rounded to bf16 here (one cast): the P.V wgmma's operands share one
type, and bf16 P keeps one build per config; the cast's 2^-9 relative error is far below e4m3
Q and K's (docs/family-wgmma.md, "P.V in 16 bits").
"""

from __future__ import annotations

import torch

# The kernels read a caller's rows (TMA, 16-byte vector loads) from a 16-byte aligned base.
ROW_ALIGN = 16


def kernel_rows(x: torch.Tensor) -> torch.Tensor:
    """x contiguous and ROW_ALIGN-byte aligned, as a kernel reads a caller's tensor: x itself
    where it is both, else a copy (a contiguous x off alignment is its own .contiguous())."""
    if x.is_contiguous() and x.data_ptr() % ROW_ALIGN == 0:
        return x
    return x.clone(memory_format=torch.contiguous_format)


def unquantized_v(v: torch.Tensor) -> torch.Tensor:
    """v (batch, seq_len_kv, kv_heads, head_dim) as the kernel reads it: bf16, contiguous,
    16-byte aligned; the caller's tensor itself where it is all three."""
    if v.dtype != torch.bfloat16:
        v = v.to(torch.bfloat16)
    return kernel_rows(v)
