"""The causal kernels (a compile-time specialization; grouped KV heads and lengths are runtime
values) build without a GPU for every arch their family targets: mma_sync for sm_120a too,
which no GPU here can run."""

import dataclasses

import pytest

from tuner.problem import Problem
from variants import load_family

pytestmark = pytest.mark.compile

CAUSAL = Problem(1, 32, 8192, seq_len_kv=8192, kv_heads=8, causal=True)


@pytest.mark.parametrize("head_dim", [128, 64])
@pytest.mark.parametrize("family_name, arch", [("wgmma", "sm_90a"), ("mma_sync", "sm_90a"),
                                               ("mma_sync", "sm_120a")])
def test_causal_kernels_compile_with_a_build_of_their_own(family_name, arch, head_dim,
                                                         own_build):
    family = load_family(family_name)
    problem = dataclasses.replace(CAUSAL, head_dim=head_dim)
    cfg = family.default(arch, problem)
    causal = family.compile(cfg, problem, arch)
    plain = family.compile(cfg, Problem(1, 32, 8192, head_dim), arch)
    assert causal._fn is not plain._fn  # its own codegen key, not the non-causal build
    assert causal.cubin_path != plain.cubin_path
    if arch == "sm_120a":  # the arch the family is tuned for must not spill
        assert causal.resources.spill_bytes == 0
