"""Calls too large for one launch, run as several over slices of the batch or of the heads.

The kernels index q, k, v and the output through CuTe DSL layouts over 32-bit shapes, so their
offsets are 32-bit (prepare's quantization checks its own: variants/input_layout.row_strides).
A call whose q or k (at the padded lengths a kernel may give them) holds MAX_ELEMENTS or more
runs as several calls, each under the bound: over slices of the batch, or, where one batch
element is already that large, over slices of the KV heads with their query heads. Attention is
independent across both, so the pieces' outputs and LSEs are the whole call's.
"""

from __future__ import annotations

import torch

from tuner.errors import TunerError

MAX_ELEMENTS = 2**31
# More than any config pads a sequence by: lcm(block_m, block_n) is at most 768.
PAD_SLACK = 1024


def pieces(q_shape, k_shape) -> list[tuple[slice, slice, slice]] | None:
    """None where one launch takes the call; else the (batch, query heads, KV heads) slices of
    launches that each stay under MAX_ELEMENTS, covering every (batch, head) once."""
    batch, seq_len, heads, head_dim = q_shape
    _, seq_len_kv, kv_heads, _ = k_shape
    group = heads // kv_heads
    # Elements per (batch element, KV head) of the larger of q (its group of query heads) and k.
    unit = max(group * (seq_len + PAD_SLACK), seq_len_kv + PAD_SLACK) * head_dim
    if batch * kv_heads * unit < MAX_ELEMENTS:
        return None
    every_head = slice(None)
    if kv_heads * unit < MAX_ELEMENTS:
        step = (MAX_ELEMENTS - 1) // (kv_heads * unit)
        return [(slice(b, min(b + step, batch)), every_head, every_head)
                for b in range(0, batch, step)]
    step = (MAX_ELEMENTS - 1) // unit
    if step == 0:
        raise TunerError(
            f"one KV head's sequence is too long for the kernels' 32-bit offsets: seq_len "
            f"{seq_len} x {group} query heads per KV head, seq_len_kv {seq_len_kv}, head_dim "
            f"{head_dim} make {unit} elements of at most {MAX_ELEMENTS - 1}; split the sequence "
            "into chunks and merge them by their LSEs (return_lse=True)")
    return [(slice(b, b + 1), slice(h * group, min(h + step, kv_heads) * group),
             slice(h, min(h + step, kv_heads)))
            for b in range(batch) for h in range(0, kv_heads, step)]


def run_in_pieces(parts, call, q, k, v, return_lse: bool):
    """The whole call's (out, lse) or out from call(part, q, k, v, want_lse) -> (out, lse or
    None) on each part's slices of q, k and v, written into outputs of the whole call's
    shapes. The slices are contiguous: a KV-head slice spans the whole tensor, past what
    prepare reads in place, and attention_fp8 takes contiguous codes only."""
    batch, seq_len, heads, _ = q.shape
    out = torch.empty(q.shape, dtype=torch.bfloat16, device=q.device)
    lse = (torch.empty((batch, heads, seq_len), dtype=torch.float32, device=q.device)
           if return_lse else None)
    for part in parts:
        rows, q_heads, kv_heads = part
        piece_out, piece_lse = call(part, q[rows, :, q_heads].contiguous(),
                                    k[rows, :, kv_heads].contiguous(),
                                    v[rows, :, kv_heads].contiguous(), return_lse)
        out[rows, :, q_heads] = piece_out
        if lse is not None:
            lse[rows, q_heads] = piece_lse
    return (out, lse) if return_lse else out


def descale_piece(descale, rows: slice, heads: slice):
    """A descale of tuner.attention_fp8 (per head, broadcastable to (batch, heads), or fine,
    (batch, blocks, heads)) for one piece's rows and heads; a broadcast dimension stays."""
    if descale.dim() == 3:
        return descale[rows, :, heads].contiguous()
    index = [rows, heads][2 - descale.dim():]
    return descale[tuple(s if n > 1 else slice(None)
                         for s, n in zip(index, descale.shape, strict=True))].contiguous()
