"""Kernel-variant families. Each family is a subpackage that implements the contract in base.py."""

import importlib

from variants.base import Family

KNOWN_FAMILIES = ("mma_sync", "wgmma")
# Where several families target an arch, the first is the one to serve untuned problems: the
# warpgroup family on Hopper, where FP8 mma.sync is only emulated.
PREFERENCE = ("wgmma", "mma_sync")


def load_family(name: str) -> Family:
    """Import a family module by name; the module itself satisfies the Family protocol.

    A dotted module path (e.g. "tests.doubles.fake_family") loads a family from outside this
    package: that is how tests plug a test double into the search.
    """
    if "." in name:
        return importlib.import_module(name)
    if name not in KNOWN_FAMILIES:
        from variants.errors import TunerError

        raise TunerError(f"unknown family {name!r}; known families: {', '.join(KNOWN_FAMILIES)}")
    return importlib.import_module(f"variants.{name}")


def families_for_arch(arch: str) -> list[str]:
    """Names of the installed families whose kernels target `arch`, in PREFERENCE order."""
    names = []
    for name in PREFERENCE:
        try:
            family = load_family(name)
        except ModuleNotFoundError:
            continue
        if arch in family.ARCHS:
            names.append(name)
    return names
