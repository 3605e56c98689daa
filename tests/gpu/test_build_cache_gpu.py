"""A kernel compiled in one process and loaded from the disk cache by another runs correctly.

Each family's default is built in a first interpreter, then a second interpreter (empty memory
cache) must load it from disk, not compile, and its output must pass the fp32 reference check on
fresh random inputs with the output poisoned first."""

from __future__ import annotations

import textwrap

import pytest

pytestmark = pytest.mark.gpu

_CHILD = textwrap.dedent("""
    import json, sys, time
    import torch
    from tuner.gpus import local_profile
    from tuner.gate import validate_kernel
    from tuner.problem import Problem
    from variants import load_family
    family = load_family(sys.argv[1])
    arch = local_profile().arch
    problem = Problem(batch=2, heads=8, seq_len=1000, head_dim=128)
    t0 = time.perf_counter()
    kernel = family.compile(family.default(arch, problem), problem, arch)
    obtain_s = time.perf_counter() - t0
    m = validate_kernel(kernel, problem, torch.device("cuda"), seed=int(time.time_ns()) % 2**31)
    print(json.dumps({"from_disk": kernel.loaded_from_disk, "obtain_s": obtain_s,
                      "passed": bool(m.passed), "reason": m.reason, "rel_rms": m.rel_rms}))
""")


@pytest.mark.parametrize("family", ["wgmma", "mma_sync"])
def test_kernel_loaded_from_disk_is_correct(family, tmp_path, python_child):
    from tuner.gpus import local_profile
    from variants import families_for_arch

    if family not in families_for_arch(local_profile().arch):
        pytest.skip(f"{family} does not target this GPU's arch")
    env = {"TUNER_CACHE_DIR": str(tmp_path)}
    built, _ = python_child(_CHILD, family, env=env, timeout=900)
    loaded, _ = python_child(_CHILD, family, env=env, timeout=900)
    print(f"\n{family}: compile {built['obtain_s']:.2f} s (rel RMS {built['rel_rms']:.4f}); "
          f"load from disk {loaded['obtain_s'] * 1e3:.1f} ms (rel RMS {loaded['rel_rms']:.4f})")
    assert not built["from_disk"] and built["passed"], built
    assert loaded["from_disk"], loaded
    assert loaded["passed"], loaded["reason"]
