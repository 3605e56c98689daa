"""Peer attention implementations timed beside ours by `tuner bench`, behind the same
prepare/run protocol as a compiled Kernel so one timer (tuner.measure.time_kernel) serves all.

- sdpa-cudnn, sdpa-flash: torch SDPA in bf16 with one backend forced (no silent fallback).
- cudnn-fp8: cuDNN's FP8 SDPA through cudnn-frontend (optional dependency): FP8 e4m3 q, k, v
  with per-tensor descales, FP8 output (the only form cuDNN offers on sm_90).
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner.errors import PeerUnavailable

__all__ = ["PEERS", "PeerUnavailable", "SdpaPeer", "make_peer"]

PEERS = ("sdpa-cudnn", "sdpa-flash", "cudnn-fp8")


@dataclass
class _SdpaInputs:
    q: object
    k: object
    v: object
    scale: float


class SdpaPeer:
    """torch.nn.functional.scaled_dot_product_attention with one backend, bf16."""

    def __init__(self, backend: str) -> None:
        from torch.nn.attention import SDPBackend

        self.name = f"sdpa-{backend}"
        self._backend = {"cudnn": SDPBackend.CUDNN_ATTENTION,
                         "flash": SDPBackend.FLASH_ATTENTION}[backend]

    def prepare(self, q, k, v, softmax_scale: float | None = None) -> _SdpaInputs:
        # SDPA wants (batch, heads, seq, dim); the layout change is prepare's cost, not the peer's.
        scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
        return _SdpaInputs(*(x.transpose(1, 2).contiguous() for x in (q, k, v)), scale=scale)

    def run(self, prepared: _SdpaInputs, out=None, lse=None):
        import torch.nn.functional as F
        from torch.nn.attention import sdpa_kernel

        with sdpa_kernel([self._backend]):
            o = F.scaled_dot_product_attention(prepared.q, prepared.k, prepared.v,
                                               scale=prepared.scale)
        return o.transpose(1, 2), lse


def make_peer(name: str):
    if name == "sdpa-cudnn":
        return SdpaPeer("cudnn")
    if name == "sdpa-flash":
        return SdpaPeer("flash")
    if name == "cudnn-fp8":
        from tuner.peers_cudnn import CudnnFp8Peer

        return CudnnFp8Peer()
    raise PeerUnavailable(f"unknown peer {name!r}; known: {', '.join(PEERS)}")
