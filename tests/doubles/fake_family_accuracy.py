"""A fake family whose end-to-end accuracy depends on a knob and on the data, as FP8 attention's
does on real activations (a K channel bias shared by the tokens costs accuracy unless prepare
smooths it away).

Knobs: `tile` (the cost surface of fake_family: 64 is fastest) and `k_smoothing` ("off" or
"mean", the real families' knob name). Every kernel computes the gate's own FP8 reference, so it
passes the gate exactly like fake_family. With k_smoothing="off" it then adds, per (batch, KV
head), a deterministic error of BIAS_GAIN x (r - BIAS_FREE) times the RMS of that head's output,
where r = |mean key| / RMS |key - mean key| measures the shared bias: about 1/sqrt(seq_len_kv)
(0.13 at 64 keys) on the gate's random and structured inputs, none added; about 8 on
tuner.activations' "realistic" kind (K bias of std 8), an end-to-end error of ~3.7 instead of
FP8's own ~0.5 at B=1 H=2 S=65 D=64. k_smoothing="mean" adds nothing and costs SMOOTH_MS more
in prepare, so the fastest config of every tile is the inaccurate one. One config, CRASH_ON_BIAS,
faults (a sticky CUDA error) on biased keys only: it passes the gate and crashes in the budget's
check.
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
BIAS_GAIN = 0.5
SMOOTH_MS = 0.5
CRASH_ON_BIAS = {"tile": 16, "k_smoothing": "mean"}


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

    def prepare(self, q, k, v, softmax_scale=None, validate=True):
        from variants.prepare import quantize_inputs

        self.last_ms = _base.PREPARE_MS + (SMOOTH_MS if self.config.k_smoothing == "mean" else 0)
        return quantize_inputs(q, k, v, softmax_scale=softmax_scale)

    def run(self, prepared, out=None, lse=None):
        from variants.reference import reference_attention

        ref = reference_attention(prepared)
        result = ref.out.float()
        _, k, _ = prepared.dequantized()
        excess = (bias_ratio(k) - BIAS_FREE).clamp_min(0.0)  # (batch, kv_heads)
        if self.config.to_dict() == CRASH_ON_BIAS and bool((excess > 0).any()):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        if self.config.k_smoothing == "off":
            group = result.shape[2] // k.shape[2]
            excess = excess.repeat_interleave(group, dim=1)[:, None, :, None]
            rms = result.pow(2).mean(dim=(1, 3), keepdim=True).sqrt()
            noise = torch.randn(result.shape, generator=torch.Generator().manual_seed(0))
            result = result + BIAS_GAIN * excess * rms * noise
        out = result.to(torch.bfloat16) if out is None else out.copy_(result)
        lse = ref.lse if lse is None else lse.copy_(ref.lse)
        self.last_ms = cost_ms(self.config)
        return out, lse


def compile(cfg, problem, arch: str):
    _base._log_compile(cfg)
    return AccuracyKernel(cfg)
