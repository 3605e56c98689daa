"""The mma_sync family with one config that crashes the GPU context (tests/doubles/crashing.py)."""

from tests.doubles.crashing import Config, crashing_family  # noqa: F401
from variants.mma_sync import ARCHS  # noqa: F401

space, default, can_implement, compile = crashing_family("variants.mma_sync")
