"""A model's torch SDPA calls, sent to tuner.attention: `SdpaRouter`, a TorchFunctionMode that
takes every torch.nn.functional.scaled_dot_product_attention call made inside it, and
`route_sdpa`, what runs instead.

A call runs on the FP8 kernels through the public `tuner.attention` (where tuner.capture records
its q, k, v; a repeated one launches the plan its first call made, tuner.sdpa.repeated, unless
tuner.attention is wrapped), unless one of these refuses it; then torch's SDPA runs it with the
caller's arguments unchanged:
  - tuner.sdpa.unsupported (the SDPA arguments): attn_mask (any: telling a trivial one needs a
    device sync), dropout_p > 0, is_causal with unequal lengths, a value head_dim other than
    the key's, heads that GQA cannot group, ...;
  - variants.prepare.check_qkv (the kernels' inputs): a dtype other than bf16/fp16, a head_dim
    outside variants.base.HEAD_DIMS, then a tensor off the GPU;
  - autograd: inputs that require grad under grad mode (the kernels have no backward);
  - the config lookup tuner.attention makes (tuner.runtime.config_for_problem): its TunerError,
    e.g. no GPU of a known profile, or no family that implements the problem on it;
  - in eager code, a TunerError raised by the call itself.
Each refusal is logged (a warning on logger "tuner.integrations") once per reason and shape.

The decision depends on the call's shapes, dtypes, device and flags only, and is made once per
such key (a dict lookup per call after the first). Under torch.compile it is made while tracing
(torch.compiler.assume_constant_result), so the graph holds either the custom op or torch's SDPA;
the attention shapes are specialized (a new shape retraces).
"""

from __future__ import annotations

import logging
import math
import operator
import threading
import types

import torch
from torch.overrides import TorchFunctionMode

import tuner
from tuner import runtime
from tuner.api import attention
from tuner.errors import TunerError
from tuner.problem import Problem
from tuner.sdpa import checked_call, repeated, unsupported
from variants.prepare import check_qkv

log = logging.getLogger("tuner.integrations")

TORCH_SDPA = torch.nn.functional.scaled_dot_product_attention
NEEDS_GRAD = ("query, key or value requires grad: the FP8 kernels have no backward; run "
              "inference under torch.no_grad() or torch.inference_mode() (diffusers pipelines "
              "do), or keep torch SDPA for training")

_UNSEEN = object()
_DECISIONS: dict[tuple, str | None] = {}
_LOGGED: set[tuple] = set()
_LOCK = threading.Lock()


def clear_cache() -> None:
    """Forget the decisions and which fall-backs were logged (say, after the lookup's answer
    changed: another GPU table, a database made for this GPU)."""
    with _LOCK:
        _DECISIONS.clear()
        _LOGGED.clear()


def routes(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
           enable_gqa=False) -> bool:
    """Whether an SdpaRouter is active on this thread and sends this torch SDPA call to
    tuner.attention, whose capture hook records it (tuner.capture's SDPA hook then does not)."""
    from torch.overrides import _get_current_function_mode_stack  # torch has no public query

    routers = [m for m in _get_current_function_mode_stack() if isinstance(m, SdpaRouter)]
    if not routers:
        return False
    return _decide(_call_key(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa,
                             routers[-1].max_error)) is None


class SdpaRouter(TorchFunctionMode):
    """Inside it, torch SDPA calls run through route_sdpa, with tuner.attention's `max_error`;
    `calls` counts them (in eager code: under torch.compile the count is not kept)."""

    def __init__(self, max_error: float | None = None) -> None:
        super().__init__()
        self.max_error = max_error
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        # Every torch call inside the mode comes here: the common case returns first.
        if func is not TORCH_SDPA:
            if torch.compiler.is_compiling() and _python_tensor_method(func):
                # Dynamo cannot inline such a method's body through a mode (its super() call
                # to the C method); called on the tensor, it is one graph op.
                return getattr(args[0], func.__name__)(*args[1:], **(kwargs or {}))
            return func(*args, **(kwargs or {}))
        if not torch.compiler.is_compiling():
            self.calls += 1
        return route_sdpa(*args, **(kwargs or {}), max_error=self.max_error)


def _python_tensor_method(func) -> bool:
    """A torch.Tensor method written in Python (torch/_tensor.py: unflatten, split, ...)."""
    return isinstance(func, types.FunctionType) and \
        getattr(torch.Tensor, func.__name__, None) is func


def route_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
               enable_gqa=False, *, max_error=None):
    """torch SDPA's signature and semantics (query, key, value (batch, heads, seq_len,
    head_dim)): on the FP8 kernels where they can run it (tuner.attention with max_error), else
    on torch's SDPA (logged)."""
    call = _call_key(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa, max_error)
    if _decide(call) is None:
        if torch.compiler.is_compiling():
            return _on_kernels(query, key, value, is_causal, scale, enable_gqa, max_error)
        try:
            return _on_kernels(query, key, value, is_causal, scale, enable_gqa, max_error)
        except TunerError as error:
            _refuse(call, f"tuner.attention refused it: {error}")
    return TORCH_SDPA(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                      is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)


def _on_kernels(query, key, value, is_causal, scale, enable_gqa, max_error):
    # A wrapped tuner.attention (the user's instrumentation, a test's spy) sees every call.
    if tuner.attention is attention:
        out = repeated(query, key, value, is_causal, scale, enable_gqa, max_error)
        if out is not None:
            return out
    # diffusers' native backend hands SDPA a permuted view of the kernels' layout, so the
    # transpose back is usually a view. tuner.attention is looked up on the package at call
    # time: what tuner.capture records.
    return checked_call(tuner.attention, query, key, value, is_causal, scale, enable_gqa,
                        max_error)


def _call_key(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa, max_error) -> tuple:
    # operator.index makes a symbolic size a constant under torch.compile (with a guard).
    shapes = tuple(tuple(operator.index(d) for d in t.shape) for t in (query, key, value))
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    # Under torch.compile(dynamic=True) a float argument is symbolic: only whether it is 0 is a
    # constant there (a nonzero one is then reported as dropout_p=nan).
    if torch.compiler.is_compiling():
        dropout = 0.0 if dropout_p == 0 else math.nan
    else:
        dropout = float(dropout_p)
    return (shapes, (query.dtype, key.dtype, value.dtype), str(query.device),
            attn_mask is not None, dropout, bool(is_causal), bool(enable_gqa), needs_grad,
            max_error)


@torch.compiler.assume_constant_result
def _decide(call: tuple) -> str | None:
    """None (run on the kernels) or why not; once per key, logged once per reason and shape."""
    why = _DECISIONS.get(call, _UNSEEN)
    if why is _UNSEEN:
        why = _reason(call)
        with _LOCK:
            _DECISIONS[call] = why
        if why is not None:
            _log(call, why)
    return why


def _reason(call: tuple) -> str | None:
    shapes, dtypes, device, masked, dropout_p, is_causal, enable_gqa, needs_grad, max_error = call
    # Stand-ins of one element each carry what the checks read: shape, dtype, device.
    q, k, v = (torch.empty((), dtype=dtype, device=device).expand(shape)
               for shape, dtype in zip(shapes, dtypes, strict=True))
    mask = torch.empty(()) if masked else None
    why = unsupported(q, k, v, mask, dropout_p, is_causal, enable_gqa)
    if why is not None:
        return why
    # The kernels' own input checks, in their layout: dtype and head_dim before the device, so
    # that a CPU model learns what else it needs on the GPU.
    for on_gpu in (False, True):
        try:
            check_qkv(*(t.transpose(1, 2) for t in (q, k, v)), require_cuda=on_gpu,
                      check_finite=False)
        except TunerError as error:
            return str(error)
    if needs_grad:
        return NEEDS_GRAD
    (batch, heads, seq_len, head_dim), (_, kv_heads, seq_len_kv, _) = shapes[0], shapes[1]
    try:
        problem = Problem(batch, heads, seq_len, head_dim, is_causal, seq_len_kv=seq_len_kv,
                          kv_heads=kv_heads)
        runtime.config_for_problem(problem, max_error=max_error)
    except TunerError as error:
        return f"no kernel to run it: {error}"
    return None


def _refuse(call: tuple, why: str) -> None:
    with _LOCK:
        _DECISIONS[call] = why
    _log(call, why)


def _log(call: tuple, why: str) -> None:
    shapes = call[0]
    log_once((why, shapes), "tuner: attention of query %s and key %s (batch, heads, seq_len, "
             "head_dim) runs on torch SDPA: %s", shapes[0], shapes[1], why)


def log_once(key, message: str, *args) -> None:
    """A warning on logger "tuner.integrations", the first time `key` comes (clear_cache
    forgets)."""
    with _LOCK:
        if key in _LOGGED:
            return
        _LOGGED.add(key)
    log.warning(message, *args)
