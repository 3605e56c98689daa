"""Peer attention implementations timed beside ours by `tuner bench`, behind the same
prepare/run protocol as a compiled Kernel so one timer (tuner.measure.time_kernel) serves all.

- sdpa-cudnn, sdpa-flash: torch SDPA in bf16 with one backend forced (no silent fallback).
- cudnn-fp8: cuDNN's FP8 SDPA through cudnn-frontend (optional dependency): FP8 e4m3 q, k, v
  with per-tensor descales, FP8 output (the only form cuDNN offers on sm_90).
- fa3-fp8: FlashAttention-3's FP8 forward where its interface module is installed (a measured
  peer only, never a dependency: tuner/peers_fa3.py); its causal mask is bottom-right aligned.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner.errors import PeerUnavailable

__all__ = ["PEERS", "PeerUnavailable", "SdpaPeer", "make_peer"]

PEERS = ("sdpa-cudnn", "sdpa-flash", "cudnn-fp8", "fa3-fp8")
# Peers whose causal mask is aligned to the top left (torch's is_causal, cuDNN's): at unequal
# lengths it is another mask than ours.
_TOP_LEFT_CAUSAL = ("sdpa-cudnn", "sdpa-flash", "cudnn-fp8")


@dataclass
class _SdpaInputs:
    q: object
    k: object
    v: object
    scale: float


class SdpaPeer:
    """torch.nn.functional.scaled_dot_product_attention with one backend, bf16: the problem's
    own key/value length and heads (enable_gqa), and its causal mask where SDPA's is_causal is
    the same mask (equal lengths: is_causal aligns to the top left, ours to the bottom right)."""

    def __init__(self, backend: str, *, causal: bool = False, gqa: bool = False) -> None:
        from torch.nn.attention import SDPBackend

        self.name = f"sdpa-{backend}"
        self._backend = {"cudnn": SDPBackend.CUDNN_ATTENTION,
                         "flash": SDPBackend.FLASH_ATTENTION}[backend]
        self._causal = causal
        self._gqa = gqa

    def prepare(self, q, k, v, softmax_scale: float | None = None, *,
                validate: bool = True) -> _SdpaInputs:
        # validate: the Kernel protocol's; a peer makes no input checks of its own.
        # SDPA wants (batch, heads, seq, dim); the layout change is prepare's cost, not the peer's.
        scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
        return _SdpaInputs(*(x.transpose(1, 2).contiguous() for x in (q, k, v)), scale=scale)

    def run(self, prepared: _SdpaInputs, out=None, lse=None, *, want_lse=True):
        import torch.nn.functional as F
        from torch.nn.attention import sdpa_kernel

        with sdpa_kernel([self._backend]):
            o = F.scaled_dot_product_attention(prepared.q, prepared.k, prepared.v,
                                               scale=prepared.scale, is_causal=self._causal,
                                               enable_gqa=self._gqa)
        return o.transpose(1, 2), lse


def make_peer(name: str, problem=None):
    """The peer `name` for `problem` (None: self-attention over all heads, no mask); a peer
    that cannot time the problem as it is raises PeerUnavailable saying why."""
    causal = bool(problem is not None and problem.causal)
    if name in _TOP_LEFT_CAUSAL and causal and not problem.self_attention:
        # Both libraries align their causal mask to the top left, ours to the bottom right:
        # at different lengths an explicit mask would time another kernel.
        raise PeerUnavailable(f"{name}: its causal mask is aligned to the top left, this "
                              "problem's to the bottom right (seq_len != seq_len_kv)")
    gqa = bool(problem is not None and problem.group != 1)
    if name == "sdpa-cudnn":
        return SdpaPeer("cudnn", causal=causal, gqa=gqa)
    if name == "sdpa-flash":
        return SdpaPeer("flash", causal=causal, gqa=gqa)
    if name == "cudnn-fp8":
        from tuner.peers_cudnn import CudnnFp8Peer

        return CudnnFp8Peer(causal=causal)
    if name == "fa3-fp8":
        from tuner.peers_fa3 import Fa3Fp8Peer

        return Fa3Fp8Peer(causal=causal)
    raise PeerUnavailable(f"unknown peer {name!r}; known: {', '.join(PEERS)}")
