"""The planted-bug suite on the GPU: each bug of tests/doubles/planted.py wrapped around the real
default kernel of each family is rejected by the check that exists for it, and the untouched
kernel passes. (`tuner search --families tests.doubles.planted_wgmma` runs the same through the
search; benchmarks/RESULTS.md has that run.)"""

import os

import pytest
import torch

from tests.doubles.planted import BUGS
from tuner.gate import validate_kernel
from tuner.problem import Problem

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("family", ["planted_wgmma", "planted_mma_sync"])
@pytest.mark.parametrize("bug", list(BUGS))
def test_planted_bug_is_rejected_on_the_gpu(family, bug):
    import importlib

    module = importlib.import_module(f"tests.doubles.{family}")
    problem = Problem(1, 8, 4097)
    seed = int.from_bytes(os.urandom(4), "little")
    kernel = module.compile(module.Config(bug), problem, "sm_90a")
    report = validate_kernel(kernel, problem, torch.device("cuda"), seed)
    if BUGS[bug] is None:
        assert report.passed, f"seed={seed}: {report.reason}"
    else:
        assert not report.passed and BUGS[bug] in report.reason, f"seed={seed}: {report.reason}"
