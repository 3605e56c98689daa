"""The planted-bug suite on the GPU: each bug of tests/doubles/planted.py wrapped around the real
default kernel of each family is rejected by the check that exists for it, and the untouched
kernel passes. (`tuner search --families tests.doubles.planted_wgmma` runs the same through the
search.) `-m gpu` plants each bug once in each family, the
two families on different shapes where the bug applies to both; `-m gpu_full` every bug in every
family on every shape."""

import os

import pytest
import torch

from tests.doubles.planted import APPLIES, BUGS, expected_check
from tests.gpu import tiered
from tuner.gate import validate_kernel
from tuner.gpus import PROFILES
from tuner.problem import Problem

PROBLEMS = {
    "self": Problem(1, 8, 4097),
    # causal, grouped KV heads (4 query heads per KV head) and queries outnumbering keys
    "causal-gqa-cross": Problem(1, 8, 1500, seq_len_kv=1100, kv_heads=2, causal=True),
}


FAMILIES = ["planted_wgmma", "planted_mma_sync"]


def _applies(bug: str, shape: str) -> bool:
    return bug not in APPLIES or APPLIES[bug](PROBLEMS[shape])


def _once_per_family_and_bug(_, case) -> bool:
    """The family's shape for the bug: the n-th bug's n-th shape (cycling) for the first family,
    the next for the second, so that where a bug applies to both shapes each one sees it; the
    shape it applies to where that is one."""
    family, bug, shape = case
    shapes = [s for s in PROBLEMS if _applies(bug, s)] or list(PROBLEMS)
    n = list(BUGS).index(bug) + FAMILIES.index(family)
    return shape == shapes[n % len(shapes)]


@pytest.mark.parametrize("family, bug, shape", tiered(
    [(f, b, s) for f in FAMILIES for b in BUGS for s in PROBLEMS], _once_per_family_and_bug,
    ids=lambda case: f"{case[2]}-{case[1]}-{case[0]}"))
def test_planted_bug_is_rejected_on_the_gpu(family, bug, shape):
    import importlib

    module = importlib.import_module(f"tests.doubles.{family}")
    problem = PROBLEMS[shape]
    if bug in APPLIES and not APPLIES[bug](problem):
        pytest.skip(f"{bug} needs a problem with that feature")
    ok, reason = module.can_implement(module.Config(bug), problem, PROFILES["h200"])
    if not ok:  # a bug in a knob the base family does not have (planted.KNOBS)
        pytest.skip(reason)
    seed = int.from_bytes(os.urandom(4), "little")
    kernel = module.compile(module.Config(bug), problem, "sm_90a")
    report = validate_kernel(kernel, problem, torch.device("cuda"), seed)
    if BUGS[bug] is None:
        assert report.passed, f"seed={seed}: {report.reason}"
    else:
        check = expected_check(bug, problem)
        assert not report.passed and check in report.reason, f"seed={seed}: {report.reason}"


def gpu_builds(name, params):
    """The kernels a test here builds (tests/conftest.py compiles them ahead, in parallel): a
    planted family wraps its base family's default (tests/doubles/planted.py)."""
    from variants import load_family

    base = params["family"].removeprefix("planted_")
    problem = PROBLEMS[params["shape"]]
    return [(base, load_family(base).default("sm_90a", problem), problem)]
