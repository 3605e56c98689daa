"""The folded CPU family's kernel (tests/doubles/folded.py: the real prepare and the kernels'
arithmetic emulated in torch) with the planted bugs of tests/doubles/planted.py, every one of
them, those in prepare's exact transforms included (the folded family has their knobs)."""

from tests.doubles.planted import BUGS, Config, planted_family  # noqa: F401

DEVICE = "cpu"

space, default, can_implement, compile = planted_family("tests.doubles.folded")
