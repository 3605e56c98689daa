"""variants.base.enumerate_space builds configs without dataclass __init__ where that is the same
thing (a frozen dataclass without __post_init__), and through __init__ otherwise."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from variants import load_family
from variants.base import PREPARE_ONLY_KNOBS, enumerate_space


@pytest.mark.parametrize("family, arch", [("mma_sync", "sm_120a"), ("wgmma", "sm_90a")])
def test_the_configs_equal_those_init_builds_in_product_order(family, arch):
    cls = load_family(family).Config
    space = load_family(family).space(arch)
    names = [n for n in (f.name for f in dataclasses.fields(cls)) if n in PREPARE_ONLY_KNOBS]
    names += [f.name for f in dataclasses.fields(cls) if f.name not in PREPARE_ONLY_KNOBS]
    built = [cls(**dict(zip(names, values, strict=True)))
             for values in itertools.islice(itertools.product(*(space[n] for n in names)), 5000)]
    got = list(itertools.islice(enumerate_space(cls, space), 5000))
    assert got == built and [hash(c) for c in got] == [hash(c) for c in built]
    with pytest.raises(dataclasses.FrozenInstanceError):
        got[0].block_n = 3


def test_a_config_with_post_init_is_built_through_init():
    seen = []

    @dataclasses.dataclass(frozen=True)
    class Checked:
        a: int
        b: str

        def __post_init__(self):
            seen.append((self.a, self.b))

    configs = list(enumerate_space(Checked, {"a": [1, 2], "b": ["x"]}))
    assert seen == [(1, "x"), (2, "x")]
    assert configs == [Checked(1, "x"), Checked(2, "x")]
