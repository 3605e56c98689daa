"""The peers a caller would run instead of tuner.attention, each as `call(q, k, v) -> out (batch,
seq, heads, dim)` on inputs in the form that peer's callers hold them (`native`: converted once
from our bf16 (batch, seq, heads, dim), outside any timing):

  FA3 bf16   fa3_fwd_interface.flash_attn_func (FlashAttention-3, where installed), bf16 (batch,
             seq, heads, dim); causal aligned to the bottom right as ours, grouped KV heads native
  SDPA bf16  torch scaled_dot_product_attention with the cuDNN backend forced, bf16 (batch, heads,
             seq, dim) contiguous, its layout; causal only at equal lengths (torch aligns its mask
             to the top left)
  Sage       SageAttention 1 (`from sageattention import sageattn`, INT8 QK), fp16 (batch, seq,
             heads, dim) with tensor_layout="NHD", where installed

A system that cannot run a problem here is a str saying why, in place of its call.
"""

from __future__ import annotations

from collections.abc import Callable

BF16_PEERS = ("FA3 bf16", "SDPA bf16", "Sage")


def top_left_refusal(problem) -> str | None:
    """Why a system whose is_causal aligns to the top left (torch's SDPA, SageAttention, our SDPA
    drop-in) cannot run the problem with our bottom-right mask: causal at unequal lengths."""
    if problem.causal and not problem.self_attention:
        return "its causal mask is aligned to the top left (Sq != Skv)"
    return None


def _fa3_bf16(problem):
    from tuner.errors import peer_module

    fa3 = peer_module("fa3_fwd_interface", "FA3 not installed (fa3_fwd_interface)")
    causal = problem.causal

    def call(q, k, v):
        out = fa3.flash_attn_func(q, k, v, causal=causal)
        return out[0] if isinstance(out, tuple) else out

    return call


def _sdpa_cudnn(problem):
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from tuner.errors import PeerUnavailable

    why = top_left_refusal(problem)
    if why is not None:
        raise PeerUnavailable(why)
    causal, gqa = problem.causal, problem.group != 1

    def call(q, k, v):
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
        return out.transpose(1, 2)

    return call


def _sage(problem):
    from tuner.errors import PeerUnavailable, peer_module

    sage = peer_module("sageattention", "SageAttention not installed (pip install "
                       "sageattention)")
    why = top_left_refusal(problem)
    if why is not None:
        raise PeerUnavailable(why)
    causal = problem.causal

    def call(q, k, v):
        return sage.sageattn(q, k, v, tensor_layout="NHD", is_causal=causal)

    return call


_MAKERS = {"FA3 bf16": _fa3_bf16, "SDPA bf16": _sdpa_cudnn, "Sage": _sage}


def native(name: str, qkv: tuple) -> tuple:
    """Our bf16 (batch, seq, heads, dim) q, k, v in the form the system takes."""
    if name == "SDPA bf16":
        return tuple(x.transpose(1, 2).contiguous() for x in qkv)
    if name == "Sage":
        return tuple(x.half() for x in qkv)
    return qkv


def bf16_peers(problem, names=BF16_PEERS) -> dict[str, Callable | str]:
    """name -> call(q, k, v), or why the system cannot run the problem here."""
    from tuner.errors import PeerUnavailable

    found: dict[str, Callable | str] = {}
    for name in names:
        try:
            found[name] = _MAKERS[name](problem)
        except PeerUnavailable as exc:
            found[name] = str(exc)
    return found


def fa3_fp8(problem):
    """FA3's FP8 forward with its per-(batch, KV head) descales, as tuner bench runs it:
    call(q, k, v) quantizes (tuner/peers_fa3.py) and runs; PeerUnavailable where missing."""
    from tuner.peers import make_peer

    peer = make_peer("fa3-fp8", problem)
    return lambda q, k, v: peer.run(peer.prepare(q, k, v))[0]
