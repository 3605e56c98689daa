"""The planted-bug suite on the GPU: each bug of tests/doubles/planted.py wrapped around the real
default kernel of each family is rejected by the check that exists for it, and the untouched
kernel passes. (`tuner search --families tests.doubles.planted_wgmma` runs the same through the
search; benchmarks/RESULTS.md has that run.)"""

import os

import pytest
import torch

from tests.doubles.planted import APPLIES, BUGS, expected_check
from tuner.gate import validate_kernel
from tuner.problem import Problem

pytestmark = pytest.mark.gpu


PROBLEMS = {
    "self": Problem(1, 8, 4097),
    # causal, grouped KV heads (4 query heads per KV head) and queries outnumbering keys
    "causal-gqa-cross": Problem(1, 8, 1500, seq_len_kv=1100, kv_heads=2, causal=True),
}


@pytest.mark.parametrize("family", ["planted_wgmma", "planted_mma_sync"])
@pytest.mark.parametrize("bug", list(BUGS))
@pytest.mark.parametrize("shape", list(PROBLEMS))
def test_planted_bug_is_rejected_on_the_gpu(family, bug, shape):
    import importlib

    module = importlib.import_module(f"tests.doubles.{family}")
    problem = PROBLEMS[shape]
    if bug in APPLIES and not APPLIES[bug](problem):
        pytest.skip(f"{bug} needs a problem with that feature")
    seed = int.from_bytes(os.urandom(4), "little")
    kernel = module.compile(module.Config(bug), problem, "sm_90a")
    report = validate_kernel(kernel, problem, torch.device("cuda"), seed)
    if BUGS[bug] is None:
        assert report.passed, f"seed={seed}: {report.reason}"
    else:
        check = expected_check(bug, problem)
        assert not report.passed and check in report.reason, f"seed={seed}: {report.reason}"
