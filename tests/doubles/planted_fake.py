"""The CPU fake family's kernel (the fp32 reference on the CPU) with the planted bugs of
tests/doubles/planted.py.

No `time_launch`: perf_counter times it, so a whole search still goes through the tuner's
default CPU clock. Its winner does not depend on the clock: only "none" is correct."""

from tests.doubles.planted import BUGS, Config, planted_family  # noqa: F401

DEVICE = "cpu"

space, default, can_implement, compile = planted_family("tests.doubles.fake_family")
