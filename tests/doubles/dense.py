"""Dense fp32 attention on an input set's dequantized codes, with an optional mask or head-mapping
bug: the CPU stand-in for a kernel with that bug (tests/test_reference_shapes.py feeds it to the
metrics, tests/test_gate_shapes.py to the gate)."""

from __future__ import annotations

import math

import torch


def dense_attention(inputs, causal: bool, *, diagonal_shift: int = 0, top_left: bool = False,
                    kv_head=None):
    """(out (batch, seq_len, heads, head_dim), lse (batch, heads, seq_len)) of `inputs` (anything
    with dequantized() and softmax_scale). Bugs: the causal diagonal moved by diagonal_shift keys,
    aligned to the top left instead of the bottom right, or query head h reading KV head
    kv_head(h, group, kv_heads) instead of h // group."""
    q, k, v = (x.transpose(1, 2) for x in inputs.dequantized())
    heads, kv_heads = q.shape[1], k.shape[1]
    group = heads // kv_heads
    index = torch.tensor([kv_head(h, group, kv_heads) if kv_head else h // group
                          for h in range(heads)])
    k, v = k[:, index], v[:, index]
    sq, skv = q.shape[2], k.shape[2]
    offset = 0 if top_left else skv - sq
    visible = torch.ones(sq, skv, dtype=torch.bool)
    if causal:
        visible = visible.tril(diagonal=offset + diagonal_shift)
    s = (q @ k.transpose(-1, -2) * inputs.softmax_scale).masked_fill(~visible, -math.inf)
    out = (torch.softmax(s, -1).nan_to_num(0.0) @ v).transpose(1, 2)
    return out, torch.logsumexp(s, -1)
