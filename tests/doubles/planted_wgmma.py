"""The wgmma family's default kernel with the planted bugs of tests/doubles/planted.py (GPU)."""

from tests.doubles.planted import BUGS, Config, planted_family  # noqa: F401
from variants.wgmma import ARCHS  # noqa: F401

space, default, can_implement, compile = planted_family("variants.wgmma")
