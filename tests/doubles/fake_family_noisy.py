"""A fake family whose candidates lead the default by less than their own measured spread.

Three configs, all feasible and correct: the default (tile 64) and two that are faster by
LEAD_MS and 2 * LEAD_MS. Every kernel instance alternates between its cost and its cost plus
JITTER_MS from one call to the next: deterministic noise, which the base family's `time_launch`
reports as measured (not the sleep's wall time, which a loaded machine stretches). An even number
of repeats (the tests use 10) then has an IQR of exactly JITTER_MS (the inclusive quartiles of
alternating samples are the low and the high value) and a median of cost + JITTER_MS / 2, in
the cost order. JITTER_MS is 4x the largest lead: the fastest candidate measures fastest, and
the search must still keep the default ("beaten by more than the IQR",
tuner.search.pick_winner).
"""

from __future__ import annotations

from dataclasses import dataclass

from tests.doubles import fake_family as _base
from tests.doubles.fake_family import time_launch  # noqa: F401 - the modelled clock, jitter too
from variants.base import ConfigMixin

DEVICE = "cpu"
NAME = "tests.doubles.fake_family_noisy"
DEFAULT_MS = 3.0
LEAD_MS = 0.5
JITTER_MS = 4.0


@dataclass(frozen=True)
class Config(ConfigMixin):
    tile: int
    stages: int


SPACE = {"tile": [32, 64, 128], "stages": [2]}


def space(arch: str) -> dict[str, list]:
    return {k: list(v) for k, v in SPACE.items()}


def default(arch: str, problem) -> Config:
    return Config(tile=64, stages=2)


def can_implement(cfg, problem, gpu) -> tuple[bool, str | None]:
    return True, None


def cost_ms(cfg) -> float:
    return DEFAULT_MS - {64: 0.0, 128: LEAD_MS, 32: 2 * LEAD_MS}[cfg.tile]


class NoisyKernel(_base.FakeKernel):
    def __init__(self, cfg, problem, cost):
        super().__init__(cfg, problem, cost)
        self.calls = 0

    def run(self, prepared, out=None, lse=None, *, want_lse=True):
        self.calls += 1
        jitter = JITTER_MS if self.calls % 2 else 0.0
        self.cost = lambda cfg: cost_ms(cfg) + jitter
        return super().run(prepared, out, lse, want_lse=want_lse)


def compile(cfg, problem, arch: str):
    return NoisyKernel(cfg, problem, cost_ms)
