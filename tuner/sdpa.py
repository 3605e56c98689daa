"""`scaled_dot_product_attention`: the tuned FP8 kernel behind the signature and layout of
`torch.nn.functional.scaled_dot_product_attention`, so a model swaps one call.

What the kernels cannot honour is refused in one place, `unsupported()`, with the argument named
and the way out (torch's own SDPA). is_causal, enable_gqa and key/value lengths of their own run
on the kernels, with torch's semantics: its is_causal aligns the diagonal to the top left, which
is ours (bottom right) only at equal lengths, so is_causal with different lengths is refused.

A repeated call (same shapes, dtypes, devices and flags as one that ran) skips the checks, the
transposes and tuner.attention's own lookup: repeated() launches the plan of the transposed call
on the SDPA-layout tensors themselves (tuner/plans.py, LaunchPlan.heads_first).
"""

from __future__ import annotations

import torch

from tuner import api
from tuner.api import attention, plain_call, signature
from tuner.errors import TunerError
from tuner.plans import CALLS, SDPA_CALLS

_is_compiling = torch.compiler.is_compiling

SDPA = "torch.nn.functional.scaled_dot_product_attention"


def unsupported(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa) -> str | None:
    """Why these SDPA arguments cannot run on the FP8 kernels, or None when they can."""
    if attn_mask is not None:
        return (f"attn_mask is not supported (the FP8 kernels run unmasked attention); "
                f"call {SDPA} for masked attention")
    if dropout_p != 0.0:
        return (f"dropout_p={dropout_p} is not supported (the kernels are inference forward "
                f"only); pass dropout_p=0.0 (as in model.eval()) or call {SDPA} for training")
    for name, t in (("query", query), ("key", key), ("value", value)):
        if t.dim() != 4:
            return (f"{name} has shape {tuple(t.shape)}; expected 4 dims (batch, heads, seq_len, "
                    f"head_dim): add a batch dim with unsqueeze(0), or call {SDPA}")
    if key.shape != value.shape:
        return (f"key has shape {tuple(key.shape)}, value {tuple(value.shape)}: they must match "
                f"(value head_dim other than key's is not supported); call {SDPA}")
    if key.shape[1] != query.shape[1]:
        if not enable_gqa:
            return (f"query has {query.shape[1]} heads, key/value {key.shape[1]}: pass "
                    "enable_gqa=True for grouped-query attention (as torch requires)")
        if query.shape[1] % key.shape[1]:
            return (f"query has {query.shape[1]} heads, key/value {key.shape[1]}: grouped-query "
                    "attention needs the query heads to be a multiple of the key/value heads")
    if is_causal and key.shape[2] != query.shape[2]:
        return (f"is_causal=True with {query.shape[2]} queries and {key.shape[2]} keys: torch's "
                "is_causal aligns the diagonal to the top left, the kernels to the bottom right "
                "(FlashAttention's); the two differ here. Call tuner.attention(..., causal=True) "
                f"for the bottom-right mask, or {SDPA}")
    return None


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False):
    """F.scaled_dot_product_attention with the tuned FP8 kernel: query, key, value (batch, heads,
    seq_len, head_dim) bf16/fp16 on CUDA -> (batch, heads, seq_len, head_dim) in query's dtype.
    Arguments the kernels cannot honour raise TunerError naming them (see unsupported())."""
    if attn_mask is None and dropout_p == 0.0:
        out = repeated(query, key, value, is_causal, scale, enable_gqa)
        if out is not None:
            return out
    why = unsupported(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)
    if why is not None:
        raise TunerError(why)
    return checked_call(attention, query, key, value, is_causal, scale, enable_gqa)


def checked_call(attend, query, key, value, is_causal, scale, enable_gqa, max_error=None):
    """A call whose SDPA arguments passed unsupported(), through `attend` (tuner.attention, or
    what the caller looked up as it) on the kernels' layout, its plan remembered for repeated()."""
    q, k, v = kernel_layouts(query, key, value)
    out = attend(q, k, v, softmax_scale=scale, causal=bool(is_causal), max_error=max_error)
    remember(query, key, value, (q, k, v), is_causal, enable_gqa, max_error)
    return sdpa_layout(out, query.dtype)


def _signature(query, key, value, is_causal, enable_gqa, max_error) -> tuple:
    """The drop-in's key into SDPA_CALLS: what its checks and tuner.attention's signature read,
    in SDPA's own arguments (dropout_p and attn_mask are checked before the lookup)."""
    return (query.shape, key.shape, value.shape, query.dtype, key.dtype, value.dtype,
            query.device, key.device, value.device, is_causal, enable_gqa, max_error)


def repeated(query, key, value, is_causal, scale, enable_gqa, max_error=None):
    """A drop-in call whose signature ran before on the kernels (remember): the output of its
    plan's launches on the SDPA-layout tensors themselves (CallPlan.heads_first), without the
    argument checks, the transposes or tuner.attention's own lookup; None where the call takes
    the checked path (first call, tracing, tuner.capture, autograd, a scale or flag that is not
    a plain value, inputs the plan does not take)."""
    if _is_compiling() or api._CAPTURE is not None:
        return None
    try:
        plan = SDPA_CALLS.get(_signature(query, key, value, is_causal, enable_gqa, max_error))
    except (AttributeError, TypeError):  # not tensors, an unhashable flag: checked later
        return None
    if plan is None or not plain_call(query, key, value, is_causal, scale):
        return None
    out = plan.heads_first(query, key, value, scale)
    if out is None or query.dtype is torch.bfloat16:
        return out
    return out.to(query.dtype)


def remember(query, key, value, views, is_causal, enable_gqa, max_error=None) -> None:
    """After a checked drop-in call: the plan tuner.attention keeps for its transposed call
    (`views`), under the drop-in's signature, for repeated() to find."""
    if _is_compiling() or not (is_causal is True or is_causal is False):
        return
    q, k, v = views
    plan = CALLS.get(signature(q, k, v, is_causal, None, "auto", None, max_error))
    if plan is not None:
        SDPA_CALLS[_signature(query, key, value, is_causal, enable_gqa, max_error)] = plan


def kernel_layouts(query, key, value) -> tuple:
    """(batch, seq_len, heads, head_dim) of SDPA-layout query, key and value, as views: a repeated
    call's quantization reads its rows in place where it can (variants.input_layout.row_strides:
    a model's projection viewed as heads, or a (batch, heads, seq_len, head_dim) tensor such as
    RoPE writes) and copies it contiguous where not (variants/launch_plan.py), so the view is
    checked once, there. Traced (torch.compile), a tensor has no address to check: the custom
    op gets a copy."""
    views = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
    if not torch.compiler.is_compiling():
        return views
    return tuple(x if x.is_contiguous() else x.contiguous() for x in views)


def sdpa_layout(out, dtype):
    """The kernels' bf16 (batch, seq_len, heads, head_dim) output as SDPA returns it: a
    (batch, heads, seq_len, head_dim) view, cast only where the caller's dtype differs (a
    same-dtype .to() still costs about 1 us of dispatch)."""
    out = out.transpose(1, 2)
    return out if out.dtype == dtype else out.to(dtype)
