"""The fake family with a space larger than any test's trial budget: the search must pick TPE.

Same planted failures and feasibility rule as fake_family on (tile, stages); two more knobs widen
the space to 384 points (140 feasible, tests/test_search.py) and shift the cost a little. Timed
by the base family's modelled clock (`time_launch`): the value told to TPE for a config is the
same on a loaded machine as on an idle one (which trials are told before each proposal can still
depend on the pipeline's timing).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tests.doubles import fake_family as _base
from tests.doubles.fake_family import FakeKernel, _log_compile, time_launch  # noqa: F401
from variants.base import ConfigMixin

DEVICE = "cpu"


@dataclass(frozen=True)
class Config(ConfigMixin):
    tile: int
    stages: int
    warps: int
    swizzle: bool


SPACE = {"tile": [16, 32, 64, 128, 256, 512], "stages": [1, 2, 3, 4, 6, 8],
         "warps": [1, 2, 4, 8], "swizzle": [False, True]}


def space(arch: str) -> dict[str, list]:
    return {k: list(v) for k, v in SPACE.items()}


def default(arch: str, problem) -> Config:
    return Config(tile=64, stages=2, warps=4, swizzle=False)


def seeds(arch: str, problem) -> list[Config]:
    """The default swizzled: every search measures it second (tests/test_search.py)."""
    return [Config(tile=64, stages=2, warps=4, swizzle=True)]


def can_implement(cfg, problem, gpu) -> tuple[bool, str | None]:
    ok, reason = _base.can_implement(cfg, problem, gpu)
    if ok and cfg.warps * 16 > cfg.tile * 4:
        return False, f"warps: {cfg.warps} warps need tile >= {cfg.warps * 4}"
    return ok, reason


def cost_ms(cfg) -> float:
    return (_base.cost_ms(cfg) + 0.2 * abs(math.log2(cfg.warps / 4))
            + (0.0 if cfg.swizzle else 0.2))


def compile(cfg, problem, arch: str):
    return _base.compile(cfg, problem, arch, _cost=cost_ms, _can_implement=can_implement)
