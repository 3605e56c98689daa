"""`scaled_dot_product_attention`: the tuned FP8 kernel behind the signature and layout of
`torch.nn.functional.scaled_dot_product_attention`, so a model swaps one call.

What the kernels cannot honour is refused in one place, `unsupported()`, with the argument named
and the way out (torch's own SDPA). Causal masks and grouped-query attention belong there until
a family implements them; then only that function changes.
"""

from __future__ import annotations

SDPA = "torch.nn.functional.scaled_dot_product_attention"


def unsupported(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa) -> str | None:
    """Why these SDPA arguments cannot run on the FP8 kernels, or None when they can."""
    if attn_mask is not None:
        return (f"attn_mask is not supported (the FP8 kernels run unmasked attention); "
                f"call {SDPA} for masked attention")
    if dropout_p != 0.0:
        return (f"dropout_p={dropout_p} is not supported (the kernels are inference forward "
                f"only); pass dropout_p=0.0 (as in model.eval()) or call {SDPA} for training")
    if is_causal:
        return (f"is_causal=True is not supported yet (non-causal prefill only); call {SDPA} "
                "for causal attention")
    for name, t in (("query", query), ("key", key), ("value", value)):
        if t.dim() != 4:
            return (f"{name} has shape {tuple(t.shape)}; expected 4 dims (batch, heads, seq_len, "
                    f"head_dim): add a batch dim with unsqueeze(0), or call {SDPA}")
    if key.shape[1] != query.shape[1] or value.shape[1] != query.shape[1]:
        gqa = " (enable_gqa=True)" if enable_gqa else ""
        return (f"query has {query.shape[1]} heads, key/value {key.shape[1]}/{value.shape[1]}: "
                f"grouped-query attention{gqa} is not supported yet; repeat the key/value heads "
                f"(repeat_interleave on dim 1) or call {SDPA}")
    if key.shape[2] != query.shape[2] or value.shape[2] != query.shape[2]:
        return (f"query has {query.shape[2]} tokens, key/value {key.shape[2]}/{value.shape[2]}: "
                f"different query and key/value lengths are not supported yet; call {SDPA}")
    return None


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False):
    """F.scaled_dot_product_attention with the tuned FP8 kernel: query, key, value (batch, heads,
    seq_len, head_dim) bf16/fp16 on CUDA -> (batch, heads, seq_len, head_dim) in query's dtype.
    Arguments the kernels cannot honour raise TunerError naming them (see unsupported())."""
    from tuner.api import attention
    from tuner.errors import TunerError

    why = unsupported(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)
    if why is not None:
        raise TunerError(why)
    # The kernels read (batch, seq_len, heads, head_dim). One contiguous copy costs less than
    # quantizing a strided view: the fused e4m3 cast reads contiguous tensors only, a strided
    # one takes the torch ops (about 3x the prepare time on the H200, README).
    q, k, v = (t.transpose(1, 2).contiguous() for t in (query, key, value))
    out = attention(q, k, v, softmax_scale=scale)
    return out.transpose(1, 2).to(query.dtype)
