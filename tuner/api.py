"""The public entry point `tuner.attention(q, k, v)`: input checks where the error reaches the
caller's line, then the custom op fp8_attn_tuner::attention (tuner/ops.py), whose body is
tuner.runtime.run_attention. Kept apart from runtime so that the op (which runs runtime's code)
and the lookup never import each other in a circle."""

from __future__ import annotations


def attention(
    q,
    k,
    v,
    *,
    softmax_scale: float | None = None,
    return_lse: bool = False,
    config=None,
    gpu: str = "auto",
    db: str | None = None,
    check_finite: bool = True,
):
    """FP8 attention forward with the tuned kernel: q, k, v (batch, seq_len, heads, head_dim)
    bf16/fp16 on CUDA -> bf16 output (and fp32 LSE (batch, heads, seq_len) with return_lse).

    The first call for a (config, problem) compiles (or loads the disk cache); later calls only
    quantize and launch, which also makes them capturable in a CUDA graph. The work runs in the
    custom op fp8_attn_tuner::attention (tuner.ops), so torch.compile(fullgraph=True) traces a
    model through this call as one opaque node.
    """
    from tuner.ops import attention_op, config_key
    from variants.prepare import check_qkv

    # Shapes, dtypes and devices are checked here, where the error reaches the caller's line
    # (also while tracing); the NaN/Inf scan reads the data, so it runs inside the op.
    # check_finite=False drops it (and its sync) from a hot loop whose inputs are known finite.
    check_qkv(q, k, v, require_cuda=True, check_finite=False)
    key = "" if config is None else config_key(config)
    out, lse = attention_op(q, k, v, softmax_scale, key, gpu, db, check_finite)
    return (out, lse) if return_lse else out
