"""The wgmma family whose default packs the query heads of a KV group into a tile's rows
(pack_gqa) wherever the problem allows it: the base of tests/doubles/planted_wgmma_packed.py."""

from __future__ import annotations

import dataclasses

from tuner.gpus import PROFILES
from variants import wgmma
from variants.wgmma import ARCHS, Config, can_implement, compile, seeds, space  # noqa: F401


def default(arch: str, problem=None) -> Config:
    cfg = wgmma.default(arch, problem)
    packed = dataclasses.replace(cfg, pack_gqa=True)
    if problem is not None and can_implement(packed, problem, PROFILES["h200"])[0]:
        return packed
    return cfg
