"""Synthetic activations shaped like the ones real DiT and LLM attention layers produce.

Random normal inputs flatter FP8 attention: every channel has the same spread and nothing is
shared between tokens. Real q and k are different in two ways that matter for FP8 (documented
in docs/accuracy.md with the measured errors):
  - a per-channel bias in K shared by every token of a (batch, KV head): after the block scale
    of 64 keys the bias takes most of e4m3's range, so the part of k that differs between keys
    (what the softmax sees) is left with a few codes;
  - a few outlier channels in Q and K (the same channels in both, as in real models), tens of
    times larger than the rest: a token's or block's amax is set by them.

Each kind is a named `ActivationKind` with its parameters; `activations(kind, problem, ...)`
draws q, k, v for a problem from a seeded generator on the device (fp32 construction, one cast
at the end). The gate's realistic case, the accuracy budget of a search and the accuracy
benchmark all draw from here, so "realistic" means one thing across the project.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ActivationKind:
    """q, k, v = gain * (z + bias) per tensor, z standard normal, bias one N(0, std^2) vector per
    (batch, head) shared by all tokens; then `outlier_channels` channels of q and k (the same
    ones in both, per head) multiplied by `outlier_gain`."""

    name: str
    description: str
    q_bias_std: float = 0.0
    k_bias_std: float = 0.0
    v_bias_std: float = 0.0
    qk_gain: float = 1.0
    outlier_channels: int = 0
    outlier_gain: float = 1.0


KINDS: dict[str, ActivationKind] = {kind.name: kind for kind in (
    ActivationKind("randn", "standard normal q, k, v"),
    ActivationKind("k_bias_8", "K + a per-channel bias (std 8)", k_bias_std=8.0),
    ActivationKind("k_bias_20", "K + a per-channel bias (std 20)", k_bias_std=20.0),
    ActivationKind("outliers", "4 channels of Q and K x30", outlier_channels=4,
                   outlier_gain=30.0),
    ActivationKind("qk_biased", "Q, K x1.5, both biased (Q std 2, K std 8)", q_bias_std=2.0,
                   k_bias_std=8.0, qk_gain=1.5),
    ActivationKind("v_bias", "V + a per-channel bias (std 8)", v_bias_std=8.0),
    # What the gate's realistic case and the default accuracy budget use: both traits at once.
    ActivationKind("realistic", "K bias (std 8) and 4 outlier channels of Q and K x10",
                   k_bias_std=8.0, outlier_channels=4, outlier_gain=10.0),
)}


def kind(name: str) -> ActivationKind:
    try:
        return KINDS[name]
    except KeyError:
        raise ValueError(f"unknown activation kind {name!r}; one of {sorted(KINDS)}") from None


def activations(kind_or_name, problem, device, seed: int, dtype=None):
    """q (batch, seq_len, heads, head_dim) and k, v (batch, seq_len_kv, kv_heads, head_dim) of
    this kind, from a seeded generator on `device`, in `dtype` (default bf16)."""
    spec = kind(kind_or_name) if isinstance(kind_or_name, str) else kind_or_name
    dtype = dtype or torch.bfloat16
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(int(seed))
    b, d = problem.batch, problem.head_dim
    shapes = ((b, problem.seq_len, problem.heads, d), (b, problem.seq_len_kv, problem.kv_heads, d),
              (b, problem.seq_len_kv, problem.kv_heads, d))
    out = []
    for x_shape, std in zip(shapes, (spec.q_bias_std, spec.k_bias_std, spec.v_bias_std),
                            strict=True):
        x = torch.randn(x_shape, generator=gen, device=device)
        if std:
            bias = torch.randn((b, 1, x_shape[2], d), generator=gen, device=device)
            x += std * bias
        out.append(x)
    q, k, v = out
    if spec.qk_gain != 1.0:
        q *= spec.qk_gain
        k *= spec.qk_gain
    if spec.outlier_channels:
        # The same channels in q and k: per KV head, shared by its group of query heads.
        picks = torch.rand((b, problem.kv_heads, d), generator=gen, device=device)
        channels = picks.argsort(dim=-1)[..., :spec.outlier_channels]
        mask = torch.zeros((b, problem.kv_heads, d), dtype=torch.bool, device=device)
        mask.scatter_(-1, channels, True)
        gain = torch.where(mask, spec.outlier_gain, 1.0)[:, None]  # (b, 1, kv_heads, d)
        k *= gain
        q *= gain.repeat_interleave(problem.group, dim=2)
    return tuple(x.to(dtype) for x in (q, k, v))
