"""The planted bugs of tests/doubles/planted.py on the wgmma default with pack_gqa (GPU)."""

from tests.doubles.planted import BUGS, Config, planted_family  # noqa: F401
from variants.wgmma import ARCHS  # noqa: F401

space, default, can_implement, compile = planted_family("tests.doubles.wgmma_packed")
