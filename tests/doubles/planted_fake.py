"""The CPU fake family's kernel (the fp32 reference on the CPU) with the planted bugs of
tests/doubles/planted.py."""

from tests.doubles.planted import BUGS, Config, planted_family  # noqa: F401

DEVICE = "cpu"

space, default, can_implement, compile = planted_family("tests.doubles.fake_family")
