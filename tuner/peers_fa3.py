"""FlashAttention-3's FP8 forward (Hopper) as a timed peer, where its interface module is
installed (the `fa3-fwd` wheel on the package index provides `fa3_fwd_interface`; its provenance
is unknown, so it is measured, never depended on: not in pyproject, imported only here).

FA3 takes e4m3 q, k, v in (batch, seq, heads, dim) with fp32 descales of shape (batch,
kv_heads) each (q's is per KV head too: the query heads of a group share it), and writes a bf16
output. Its causal mask is aligned to the bottom right, as ours, so it times causal problems at
any pair of lengths; grouped KV heads are native. prepare quantizes with a per-(batch, KV head)
amax (q's taken over each group's query heads), the granularity FA3 takes; ours are finer
(variants/block_scales.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner.errors import peer_module
from variants.block_scales import E4M3_MAX


@dataclass
class _Fa3Inputs:
    q: object
    k: object
    v: object
    descales: dict
    scale: float


class Fa3Fp8Peer:
    name = "fa3-fp8"

    def __init__(self, causal: bool = False) -> None:
        self._causal = causal
        self._flash_attn_func = peer_module(
            "fa3_fwd_interface", "FlashAttention-3's FP8 forward is not installed (its interface "
            "module fa3_fwd_interface, e.g. from the fa3-fwd wheel; on the lent H200 carry "
            ".device-fa3 and source .device-fa3/env.sh)").flash_attn_func

    def prepare(self, q, k, v, softmax_scale: float | None = None, *,
                validate: bool = True, want_lse: bool = True) -> _Fa3Inputs:
        # validate, want_lse: the Kernel protocol's; a peer checks no inputs and has no shift.
        import torch

        batch, _, heads, dim = q.shape
        kv_heads = k.shape[2]

        def quantize(x, groups: int):
            # amax per (batch, KV head): over seq, dim and the group's heads.
            amax = x.abs().amax(dim=(1, 3)).float().view(batch, kv_heads, groups).amax(dim=2)
            amax = amax.clamp_min(1e-12)
            scale = (E4M3_MAX / amax).repeat_interleave(groups, dim=1)[:, None, :, None]
            codes = (x.float() * scale).clamp_(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
            return codes, (amax / E4M3_MAX).contiguous()

        (q8, dq), (k8, dk), (v8, dv) = (quantize(q, heads // kv_heads), quantize(k, 1),
                                        quantize(v, 1))
        scale = dim**-0.5 if softmax_scale is None else softmax_scale
        return _Fa3Inputs(q8, k8, v8, {"q_descale": dq, "k_descale": dk, "v_descale": dv}, scale)

    def run(self, prepared: _Fa3Inputs, out=None, lse=None, *, want_lse=True):
        o = self._flash_attn_func(prepared.q, prepared.k, prepared.v,
                                  softmax_scale=prepared.scale, causal=self._causal,
                                  **prepared.descales)
        return (o[0] if isinstance(o, tuple) else o), lse
