"""The public entry points `tuner.attention(q, k, v)` and `tuner.attention_fp8(...)`: input checks
where the error reaches the caller's line, then the body (tuner.runtime): directly in eager code,
or through the custom op fp8_attn_tuner::attention (tuner/ops.py) wherever torch traces
(torch.compile, export, fake or meta tensors), where the op is one opaque node. Kept apart from
runtime so that the op (which runs runtime's code) and the lookup never import each other in a
circle."""

from __future__ import annotations

import functools
import math
import numbers

import torch

from tuner.plans import CALLS

# The active tuner.capture recorder (tuner/capturing.py sets it): None unless capturing, so a call
# pays one global check for the hook.
_CAPTURE = None
_Tensor = torch.Tensor
_is_compiling = torch.compiler.is_compiling
_grad_enabled = torch.is_grad_enabled


def _eager(*tensors) -> bool:
    """Plain CUDA tensors outside any tracing and without autograd: the op's dispatch (~tens of
    microseconds of host time a call) buys nothing there. Anything else goes through the op,
    which answers fake and meta tensors and autograd the way torch expects of an op."""
    if torch.compiler.is_compiling():
        return False
    grad = torch.is_grad_enabled()
    return all(type(t) is torch.Tensor and t.is_cuda and not (grad and t.requires_grad)
               for t in tensors)


def attention(
    q,
    k,
    v,
    *,
    causal: bool = False,
    softmax_scale: float | None = None,
    return_lse: bool = False,
    config=None,
    gpu: str = "auto",
    db: str | None = None,
    check_finite: bool = False,
    max_error: float | None = None,
):
    """FP8 attention forward with the tuned kernel: q (batch, seq_len, heads, head_dim) and k, v
    (batch, seq_len_kv, kv_heads, head_dim) bf16/fp16 on CUDA -> bf16 output of q's shape (and
    fp32 LSE (batch, heads, seq_len) with return_lse).

    k and v may be shorter or longer than q (cross-attention) and have fewer heads, a divisor
    of q's (grouped-query attention: query head h reads KV head h // (heads // kv_heads)).
    causal=True masks aligned to the bottom right as FlashAttention does: query i sees keys
    j <= i + seq_len_kv - seq_len; a query that sees no key (seq_len > seq_len_kv) gets output
    0 and LSE -inf, and so does every query when seq_len_kv is 0 (an empty q gets an empty
    output; neither runs an attention kernel). A shape or mask no kernel implements on this GPU
    raises a TunerError naming it (tuner.runtime: every candidate passes its family's
    can_implement first). softmax_scale is a finite number > 0 (None: head_dim ** -0.5);
    anything else is a TunerError.

    q, k and v are quantized to e4m3 with block scales (amax / 448): one per token and head of
    q, one per 64 keys of a KV head of k and v (variants/block_scales.py), in one launch.
    The first call for a shape compiles (or loads the disk cache) and looks the config up; later
    calls reuse that plan and only quantize and launch, without a device sync, which also makes
    them capturable in a CUDA graph. A NaN or Inf in an input makes NaN the outputs that read it
    (the scales propagate it); check_finite=True raises a TunerError naming the input instead,
    at the cost of a scan and a device sync per call. max_error passes over tuned winners whose
    stored end-to-end error is above it (tuner.runtime). Inside `tuner.capture(path)` the call's
    q, k, v are recorded (eager calls only).
    """
    # A repeated eager call: its signature finds the plan an earlier call made after passing
    # every check below (tuner/plans.py), so it skips them. Not while tracing, capturing or
    # scanning; and only for plain tensors outside autograd (what _eager sends to the body).
    if not _is_compiling() and _CAPTURE is None and not check_finite:
        try:
            plan = CALLS.get(signature(q, k, v, causal, config, gpu, db, max_error))
        except (AttributeError, TypeError):  # not tensors, an unhashable config: checked below
            plan = None
        if (plan is not None and (return_lse is True or return_lse is False)
                and plain_call(q, k, v, causal, softmax_scale)):
            result = plan(q, k, v, softmax_scale, return_lse, return_lse)
            if result is not None:
                return result if return_lse else result[0]
    from variants.input_checks import check_qkv, no_work

    # Shapes, dtypes and devices are checked here, where the error reaches the caller's line
    # (also while tracing); the NaN/Inf scan reads the data, so it runs inside the body.
    check_qkv(q, k, v, require_cuda=True, check_finite=False, allow_empty=True)
    causal = _flag("causal", causal)
    softmax_scale = _scale(softmax_scale)
    return_lse = _flag("return_lse", return_lse)
    if no_work(q, k):
        return _without_keys(q, return_lse)
    from tuner.pieces import pieces, run_in_pieces

    # Traced with symbolic sizes, the op's own body splits the call (tuner/ops.py).
    parts = None if _symbolic(q, k) else pieces(q.shape, k.shape)
    if parts is not None:  # past the kernels' 32-bit offsets: a call per piece

        def piece(_part, q, k, v, want_lse):
            got = attention(q, k, v, causal=causal, softmax_scale=softmax_scale,
                            return_lse=want_lse, config=config, gpu=gpu, db=db,
                            check_finite=check_finite, max_error=max_error)
            return got if want_lse else (got, None)

        return run_in_pieces(parts, piece, q, k, v, return_lse)
    if _CAPTURE is not None:
        _CAPTURE.record(q, k, v, softmax_scale, causal)
    if _eager(q, k, v):
        from tuner.runtime import checked_plan

        key = "" if config is None else _eager_config_key(config)
        plan = checked_plan(q, k, v, key, gpu, db, check_finite, causal, max_error)
        out, lse = plan.run(q, k, v, softmax_scale, return_lse, return_lse)
        CALLS[signature(q, k, v, causal, config, gpu, db, max_error)] = plan
    else:
        from tuner.ops import ForwardOnly, attention_op, config_key

        key = "" if config is None else config_key(config)
        # Where autograd records the call, its backward must raise, not pass no gradient.
        if _records_grad(q, k, v):
            op = ForwardOnly.apply
            # Dynamo traces an autograd.Function only with distinct tensors (self-attention
            # tests pass q as k and v): a view is one.
            k = k.view_as(k) if k is q else k
            v = v.view_as(v) if v is q or v is k else v
        else:
            op = attention_op
        out, lse = op(q, k, v, softmax_scale, key, gpu, db, check_finite, causal, max_error,
                      return_lse)
    # Without return_lse the LSE may lack K smoothing's shift (not added where nobody reads it).
    return (out, lse) if return_lse else out


def _symbolic(q, k) -> bool:
    """Sizes torch traces symbolically (torch.export, dynamic shapes): a decision on them would
    be a guard on the graph's inputs."""
    return any(isinstance(n, torch.SymInt) for n in (*q.shape, *k.shape))


def _records_grad(*tensors) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def signature(q, k, v, causal, config, gpu, db, max_error) -> tuple:
    """What decides a call's plan, as tuner.attention's key into tuner.plans.CALLS: every
    argument a check or the lookup reads, so that a call with another shape, dtype, device,
    mask, config, GPU, database argument or error budget never finds another's plan."""
    return (q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, q.device, k.device, v.device,
            causal, config, gpu, db, max_error)


def _without_keys(q, return_lse: bool):
    """The result of a call with nothing to compute (variants.input_checks.no_work), as
    F.scaled_dot_product_attention gives it: an empty output for an empty q; for a q whose
    keys are empty, output 0 and LSE -inf, what a row that sees no key gets."""
    batch, seq_len, heads, _ = q.shape
    out = torch.zeros(q.shape, dtype=torch.bfloat16, device=q.device)
    if not return_lse:
        return out
    return out, torch.full((batch, heads, seq_len), -math.inf, dtype=torch.float32,
                           device=q.device)


def plain_call(q, k, v, causal, softmax_scale) -> bool:
    """What a repeated call's plan takes unchecked (here and in the SDPA drop-in): plain tensors
    outside autograd, a bool mask flag, and a softmax_scale of None or a finite positive Python
    float or int (not a bool); anything else takes the checked path (_flag, _scale)."""
    return ((causal is True or causal is False)
            and (softmax_scale is None
                 or type(softmax_scale) in (float, int) and 0 < softmax_scale < math.inf)
            and type(q) is _Tensor and type(k) is _Tensor and type(v) is _Tensor
            and not (_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)))


def _scale(value) -> float | None:
    """softmax_scale as a float, or None (head_dim ** -0.5); a NaN or Inf would make every
    output NaN, a tensor or a string would fail deep in prepare, and the kernels take each row's
    maximum before scaling, which only a positive scale preserves."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) \
            or not 0 < value < math.inf:
        from tuner.errors import TunerError

        raise TunerError(f"softmax_scale must be a finite number > 0 or None (head_dim ** -0.5),"
                         f" got {value!r}; to scale the logits by a negative factor, negate q")
    return float(value)


def _flag(name: str, value) -> bool:
    # A tensor or a string here is a caller's mistake that truthiness would hide.
    if not isinstance(value, bool):
        from tuner.errors import TunerError

        raise TunerError(f"{name} must be True or False, got {value!r}")
    return value


def attention_fp8(
    q,
    k,
    v,
    q_descale,
    k_descale,
    v_descale,
    *,
    causal: bool = False,
    softmax_scale: float | None = None,
    return_lse: bool = False,
    config=None,
    gpu: str = "auto",
    db: str | None = None,
):
    """Attention over inputs that are FP8 already: q float8_e4m3fn (batch, seq_len, heads,
    head_dim) and k, v (batch, seq_len_kv, kv_heads, head_dim) on CUDA, contiguous, with fp32
    descales in either of two granularities, chosen per tensor:
      per head: q_descale of shape (batch, heads), k_descale and v_descale (batch, kv_heads)
        (one per tensor broadcasts), x ~= x_code * x_descale[b, h] for each tensor's own head h;
      fine (what tuner.attention's own quantization uses): q_descale (batch, seq_len, heads),
        one per token, x ~= q_code[b, s, h] * q_descale[b, s, h]; k_descale and v_descale
        (batch, ceil(seq_len_kv / 64), kv_heads), one per 64 keys, x ~= code[b, s, h] *
        descale[b, s // 64, h].
    Descales are >= 0; one below an all-zero block's (2.2e-15, 0 included) is taken as that,
    as tuner.attention's own quantization does (a 0 would make the folded softmax NaN).
    causal and the shapes k and v may take as in tuner.attention. Nothing is quantized: q and k
    are read where they are when seq_len is a multiple of the config's tile, else copied once
    zero-padded; V too for a config that reads it in this layout (wgmma v_layout=kernel), else
    re-laid out feature-major in one pass over its codes.
    Returns bf16 (batch, seq_len, heads, head_dim) (and fp32 LSE (batch, heads, seq_len) with
    return_lse), with the same tuned config as tuner.attention for the shape. There is no
    max_error: a winner's stored error is measured from bf16 inputs through prepare, which
    these codes skip; the caller's quantization decides the accuracy.
    prepare's exact transforms (k_smoothing, qk_rotation: docs/accuracy.md) do not apply here:
    they act on q and k before quantizing, and these codes are quantized already. A looked-up
    config runs with them off (its for_q_dtype("float8_e4m3fn") twin); a pinned config that
    turns one on is refused with a TunerError naming it.
    """
    from tuner.runtime import run_attention_fp8
    from variants.input_checks import check_fp8_qkv, no_work

    descales = (q_descale, k_descale, v_descale)
    check_fp8_qkv(q, k, v, descales, allow_empty=True)
    causal = _flag("causal", causal)
    softmax_scale = _scale(softmax_scale)
    return_lse = _flag("return_lse", return_lse)
    if config is not None:
        _check_fp8_config(config)
    if no_work(q, k):
        return _without_keys(q, return_lse)
    from tuner.pieces import descale_piece, pieces, run_in_pieces

    parts = None if _symbolic(q, k) else pieces(q.shape, k.shape)
    if parts is not None:  # past the kernels' 32-bit offsets: a call per piece

        def piece(part, q, k, v, want_lse):
            rows, q_heads, kv_heads = part
            scales = [descale_piece(d, rows, h)
                      for d, h in zip(descales, (q_heads, kv_heads, kv_heads), strict=True)]
            got = attention_fp8(q, k, v, *scales,
                                causal=causal, softmax_scale=softmax_scale,
                                return_lse=want_lse, config=config, gpu=gpu, db=db)
            return got if want_lse else (got, None)

        return run_in_pieces(parts, piece, q, k, v, return_lse)
    key = "" if config is None else _eager_config_key(config)
    out, lse = run_attention_fp8(q, k, v, descales, softmax_scale, key, gpu, db, causal)
    return (out, lse) if return_lse else out


def _check_fp8_config(config) -> None:
    """A pinned config for codes: prepare's transforms cannot apply to them."""
    knobs = config.transforms_on() if hasattr(config, "transforms_on") else []
    if knobs:
        from tuner.errors import TunerError

        raise TunerError(
            f"config has {', '.join(knobs)}: attention_fp8 takes codes the caller quantized, "
            "and those transforms act on q and k before quantizing (docs/accuracy.md); pin "
            "config.for_q_dtype('float8_e4m3fn') (the same kernel with them off), or call "
            "tuner.attention with the bf16/fp16 inputs")


@functools.lru_cache(maxsize=256)
def _eager_config_key(config) -> str:
    """ops.config_key, once per pinned config (a Config is frozen, hence hashable)."""
    from tuner.ops import config_key

    return config_key(config)
