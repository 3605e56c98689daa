"""`fp8_attn_tuner::attention`: the tuned kernel as a torch.library custom op.

torch.compile (and torch.export) treat a custom op as one opaque node: Dynamo never steps into
the launch (whose raw CUDA stream handle it cannot trace), the config lookup (database reads, an
lru_cache) or the finite-input scan (a device sync). The fake implementation gives the output
shapes from the input shapes, which is all tracing needs; it also answers meta tensors, so a
model built on the meta device propagates shapes through attention without a GPU.

The op's schema holds only tensors and plain values: the config travels as `config_key(cfg)`
text ("" = look up the tuned winner at run time, inside the op). It is defined with
torch.library.Library rather than torch.library.custom_op: the latter's Python wrappers (autograd,
aliasing checks) cost about 13 us more per call, paid by every call of a compiled graph; the op is
inference-only and returns fresh tensors. Where autograd records a call (an input requires grad
under grad mode), tuner.attention runs the op through ForwardOnly, whose backward raises.
"""

from __future__ import annotations

import json

import torch
from torch import Tensor

from tuner.pieces import pieces, run_in_pieces
from tuner.runtime import run_attention

_LIB = torch.library.Library("fp8_attn_tuner", "DEF")
_LIB.define("attention(Tensor q, Tensor k, Tensor v, float? softmax_scale, str config, str gpu, "
            "str? db, bool check_finite, bool causal=False, float? max_error=None, "
            "bool want_lse=True) -> (Tensor, Tensor)")


def _attention(q: Tensor, k: Tensor, v: Tensor, softmax_scale: float | None, config: str,
               gpu: str, db: str | None, check_finite: bool, causal: bool = False,
               max_error: float | None = None, want_lse: bool = True) -> tuple[Tensor, Tensor]:
    """(out bf16 (batch, seq_len, heads, head_dim), lse fp32 (batch, heads, seq_len)) of q
    (batch, seq_len, heads, head_dim) and k, v (batch, seq_len_kv, kv_heads, head_dim) on CUDA;
    checked by tuner.attention before the call. want_lse=False: the caller drops the LSE (it
    may then lack K smoothing's shift)."""
    # A call traced with symbolic sizes is split here, where its sizes are known.
    parts = pieces(q.shape, k.shape)
    if parts is None:
        return run_attention(q, k, v, softmax_scale, config, gpu, db, check_finite, causal,
                             max_error, want_lse)

    def piece(_part, q, k, v, want):
        return run_attention(q, k, v, softmax_scale, config, gpu, db, check_finite, causal,
                             max_error, want)

    return run_in_pieces(parts, piece, q, k, v, True)


_LIB.impl("attention", _attention, "CompositeExplicitAutograd")
attention_op = torch.ops.fp8_attn_tuner.attention.default


@torch.library.register_fake("fp8_attn_tuner::attention")
def _attention_fake(q, k, v, softmax_scale, config, gpu, db, check_finite, causal=False,
                    max_error=None, want_lse=True):
    # The output and LSE follow the queries, whatever the key/value length and head count.
    batch, seq_len, heads, head_dim = q.shape
    out = q.new_empty((batch, seq_len, heads, head_dim), dtype=torch.bfloat16)
    lse = q.new_empty((batch, heads, seq_len), dtype=torch.float32)
    return out, lse


# It reads the output's gradient, so that a partitioner cannot move it into the forward.
_LIB.define("no_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v) "
            "-> (Tensor, Tensor, Tensor)")


def _no_backward(grad_out: Tensor, q: Tensor, k: Tensor,
                 v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    from tuner.errors import TunerError

    raise TunerError(
        "tuner.attention has no backward: its FP8 kernels compute the forward only. Run it "
        "under torch.no_grad() or torch.inference_mode(), or train with "
        "torch.nn.functional.scaled_dot_product_attention")


_LIB.impl("no_backward", _no_backward, "CompositeExplicitAutograd")


@torch.library.register_fake("fp8_attn_tuner::no_backward")
def _no_backward_fake(grad_out, q, k, v):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


class ForwardOnly(torch.autograd.Function):
    """The op where an input requires grad: the forward is the op's, the backward raises a
    TunerError (no_backward) when it runs. Without it the op's missing autograd kernel hands
    the inputs no gradient, with only a warning. The raise is an op of its own, so that a
    compiled graph (AOTAutograd traces the backward with fake tensors) still builds and serves
    its forward."""

    @staticmethod
    def forward(ctx, q, k, v, *rest):
        ctx.save_for_backward(q, k, v)
        ctx.plain_args = len(rest)
        return attention_op(q, k, v, *rest)

    @staticmethod
    def backward(ctx, grad_out, _grad_lse):
        return (*torch.ops.fp8_attn_tuner.no_backward(grad_out, *ctx.saved_tensors),
                *(None,) * ctx.plain_args)


# A pinned config is a Python object the op schema cannot hold. Computed under torch.compile,
# its text would be traced through json (which Dynamo cannot follow); as a constant result it is
# evaluated once at trace time and baked into the graph (a config is frozen, so it cannot change).
@torch.compiler.assume_constant_result
def config_key(config) -> str:
    """The text a Config travels as through the op: its family and knobs as sorted JSON."""
    from tuner.runtime import family_of

    return json.dumps({"family": family_of(config), "config": config.to_dict()}, sort_keys=True)
