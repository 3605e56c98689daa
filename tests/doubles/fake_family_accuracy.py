"""A fake family whose end-to-end accuracy depends on a knob and on the data, as FP8 attention's
does on real activations: its prepare is the real one (variants/prepare.py) with the config's
k_smoothing, and its kernel computes the gate's own FP8 reference on the prepared inputs. So it
passes the gate as exactly as fake_family, and its error against fp32 attention on the original
inputs is the FP8 format's: ~0.05 on random inputs, ~0.5 on tuner.activations' "realistic" kind
with k_smoothing="off", ~0.2-0.3 with "mean" (the kind's outlier channels stay; the K bias goes).

Knobs: `tile` (the cost surface of fake_family: 64 is fastest) and `k_smoothing` ("off" or
"mean", the real families' knob name). "mean" costs SMOOTH_MS more in prepare, so the fastest
config of every tile is the inaccurate one. One config, CRASH_ON_BIAS, faults (a sticky CUDA
error) on biased keys in a batch of one, the shape of the budget's realistic data (the gate's
realistic case has two): it passes the gate and crashes in the budget's check.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tests.doubles import fake_family as _base
from tests.doubles.fake_family import time_launch  # noqa: F401 - the modelled clock
from variants.base import ConfigMixin

DEVICE = "cpu"
NAME = "tests.doubles.fake_family_accuracy"
BIAS_FREE = 0.5
SMOOTH_MS = 0.5
CRASH_ON_BIAS = {"tile": 16, "k_smoothing": "off"}


@dataclass(frozen=True)
class Config(ConfigMixin):
    tile: int
    k_smoothing: str


SPACE = {"tile": [16, 32, 64, 128], "k_smoothing": ["off", "mean"]}


def space(arch: str) -> dict[str, list]:
    return {k: list(v) for k, v in SPACE.items()}


def default(arch: str, problem) -> Config:
    # Fast and inaccurate on biased keys: the budget must turn it down and the search go on.
    return Config(tile=64, k_smoothing="off")


def can_implement(cfg, problem, gpu) -> tuple[bool, str | None]:
    return True, None


def cost_ms(cfg) -> float:
    return _base.cost_ms(_base.Config(cfg.tile, 3))


def bias_ratio(k: torch.Tensor) -> torch.Tensor:
    """r per (batch, KV head) of k (batch, seq_len_kv, kv_heads, head_dim)."""
    k = k.float()
    mean = k.mean(dim=1, keepdim=True)
    spread = (k - mean).pow(2).sum(-1).mean(dim=1).sqrt()
    return mean[:, 0].norm(dim=-1) / spread.clamp_min(1e-30)


class AccuracyKernel:
    def __init__(self, cfg):
        self.config = cfg
        self.last_ms: float | None = None  # the modelled cost of the latest call (time_launch)

    def prepare(self, q, k, v, softmax_scale=None, validate=True, want_lse=True):
        from variants.prepare import quantize_inputs

        self.last_ms = _base.PREPARE_MS + (SMOOTH_MS if self.config.k_smoothing == "mean" else 0)
        return quantize_inputs(q, k, v, softmax_scale=softmax_scale,
                               k_smoothing=self.config.k_smoothing)

    def run(self, prepared, out=None, lse=None, *, want_lse=True):
        from variants.reference import reference_attention

        ref = reference_attention(prepared)
        _, k, _ = prepared.dequantized()
        if self.config.to_dict() == CRASH_ON_BIAS and k.shape[0] == 1 \
                and bool((bias_ratio(k) > BIAS_FREE).any()):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        out = ref.out.to(torch.bfloat16) if out is None else out.copy_(ref.out)
        lse = ref.lse if lse is None else lse.copy_(ref.lse)
        if want_lse:  # the reference of smoothed keys has the smoothed LSE, as a kernel's
            prepared.restore_lse(lse)
        self.last_ms = cost_ms(self.config)
        return out, lse

def compile(cfg, problem, arch: str):
    _base._log_compile(cfg)
    return AccuracyKernel(cfg)
