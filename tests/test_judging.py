"""tuner/search/judging.py: a large space judged in parts over processes gives the configs that
judging it in one process gives, in the same order."""

import logging

import pytest

from tuner import gpus
from tuner.problem import Problem
from tuner.search import judging
from variants import base, load_family

H100 = gpus.PROFILES["h100"]


def judged(module, problem, gpu) -> list[dict]:
    return [cfg.to_dict() for cfg, ok, _ in base.judge_space(module, problem, gpu) if ok]


@pytest.mark.parametrize("family, arch, parts", [
    ("mma_sync", "sm_90a", 8), ("mma_sync", "sm_120a", 50), ("wgmma", "sm_90a", 3),
    ("tests.doubles.fake_family_large", "sm_90a", 1000),
])
def test_the_parts_enumerate_the_space_in_its_order(family, arch, parts):
    module = load_family(family)
    space = module.space(arch)
    split = judging.split_space(module.Config, space, parts)
    assert len(split) >= min(parts, 2)
    whole = base.enumerate_space(module.Config, space)
    got = (cfg for part in split for cfg in base.enumerate_space(module.Config, part))
    for n, (a, b) in enumerate(zip(whole, got, strict=True)):
        assert a == b, f"config {n} differs"
        if family == "wgmma" and n > 200_000:
            break  # the start of each of wgmma's first parts is what an order mistake moves


@pytest.mark.parametrize("problem", [Problem(1, 56, 4096, 128),
                                     Problem(2, 8, 300, 64, causal=True, seq_len_kv=77,
                                             kv_heads=2)])
def test_judging_in_processes_gives_the_same_configs_in_order(problem):
    module = load_family("mma_sync")
    got = judging.judge_feasible("mma_sync", module, problem, H100, jobs=2, parallel_from=0)
    assert got == judged(module, problem, H100)


def test_a_pool_that_cannot_start_is_judged_here(monkeypatch, caplog):
    def no_pool(*_args, **_kwargs):
        raise OSError("no semaphores here")

    monkeypatch.setattr(judging, "ProcessPoolExecutor", no_pool)
    module, problem = load_family("mma_sync"), Problem(1, 8, 1024, 128)
    with caplog.at_level(logging.WARNING, logger=judging.__name__):
        got = judging.judge_feasible("mma_sync", module, problem, H100, jobs=2,
                                     parallel_from=0)
    assert got == judged(module, problem, H100)
    assert "judging it here" in caplog.text
