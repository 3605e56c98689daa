"""The GPU tiers (tests/gpu/__init__.py), checked without a GPU: `-m gpu` and `-m gpu_full` never
select the same test and both skip here; the covering tier holds every knob value of both
families, both head dims and both masks, and the space tests' covers every pair of knob values;
the builds compiled ahead are the ones the tests then load, compiled once for all xdist
workers."""

import os
import subprocess
import sys
import threading
import time
from itertools import combinations
from pathlib import Path

import pytest

from tests.gpu import compile_ahead, compile_ahead_once, pairwise_cover

REPO = Path(__file__).resolve().parents[1]
SWEEPS = ["test_wgmma_gpu", "test_mma_sync_gpu", "test_shapes_gpu", "test_gate_gpu",
          "test_split_tail_gpu", "test_pack_gqa_gpu"]


def _pytest(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=600, check=False,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})


def test_no_test_is_in_both_tiers():
    done = _pytest("--collect-only", "-m", "gpu and gpu_full", "tests/gpu")
    assert done.returncode == 5 and "no tests collected" in done.stdout, done.stdout[-2000:]


def test_the_full_tier_skips_without_a_gpu():
    done = _pytest("-m", "gpu_full", "-rs", "tests/gpu/test_gate_gpu.py")
    assert done.returncode == 0 and " skipped" in done.stdout and " passed" not in done.stdout
    assert "needs a CUDA GPU" in done.stdout, done.stdout[-2000:]


def _gpu_tier_builds():
    """(family, Config, Problem) of the builds the covering tier's sweeps make, read from their
    parametrization as pytest would select it with -m gpu."""
    import importlib

    builds = []
    for name in SWEEPS:
        module = importlib.import_module(f"tests.gpu.{name}")
        for test_name, fn in vars(module).items():
            if not test_name.startswith("test_"):
                continue
            marks = getattr(fn, "pytestmark", [])
            in_gpu = any(m.name == "gpu" for m in marks)
            grids = [m for m in marks if m.name == "parametrize"]
            if not grids:
                builds += module.gpu_builds(test_name, {}) if in_gpu else []
                continue
            (grid,) = grids
            names = [n.strip() for n in grid.args[0].split(",")]
            for case in grid.args[1]:
                marked = isinstance(case, tuple) and hasattr(case, "marks")  # pytest.param
                values = case.values if marked else case if len(names) > 1 else (case,)
                if in_gpu or (marked and any(m.name == "gpu" for m in case.marks)):
                    builds += module.gpu_builds(test_name, dict(zip(names, values, strict=True)))
    return builds


def test_the_covering_tier_holds_every_knob_value_head_dim_and_mask():
    from variants import load_family

    builds = _gpu_tier_builds()
    for family in ("wgmma", "mma_sync"):
        mine = [(cfg.to_dict(), p) for f, cfg, p in builds if f == family]
        for knob, values in load_family(family).space("sm_90a").items():
            assert {cfg[knob] for cfg, _ in mine} >= set(values), (family, knob)
        assert {p.head_dim for _, p in mine} == {64, 128}, family
        assert {p.causal for _, p in mine} == {False, True}, family
        assert any(p.kv_heads < p.heads for _, p in mine), family
        assert any(p.seq_len_kv != p.seq_len for _, p in mine), family


@pytest.mark.parametrize("module", ["test_wgmma_gpu", "test_mma_sync_gpu"])
def test_the_space_cover_holds_every_pair_of_knob_values(module):
    import importlib

    space = importlib.import_module(f"tests.gpu.{module}")

    def pairs(configs):
        return {pair for c in configs for pair in combinations(c.to_dict().items(), 2)}

    assert pairs(space.COVER) == pairs(space.FEASIBLE)
    assert len(space.COVER) < len(space.FEASIBLE) / 10


def test_pairwise_cover_of_a_small_space():
    from dataclasses import asdict, dataclass

    @dataclass(frozen=True)
    class Cfg:
        a: int
        b: str
        c: bool

        def to_dict(self):
            return asdict(self)

    space = [Cfg(a, b, c) for a in (1, 2, 3) for b in "xy" for c in (False, True)
             if not (a == 3 and b == "y")]
    cover = pairwise_cover(space)
    pairs = {p for cfg in space for p in combinations(cfg.to_dict().items(), 2)}
    assert {p for cfg in cover for p in combinations(cfg.to_dict().items(), 2)} == pairs
    assert len(cover) < len(space) and len(set(cover)) == len(cover)


@pytest.mark.compile
def test_a_build_compiled_ahead_is_the_one_the_test_loads(own_build):
    from tuner.problem import Problem
    from variants import mma_sync

    problem = Problem(1, 2, 77)
    cfg = mma_sync.default("sm_90a", problem)
    (row,) = compile_ahead([("mma_sync", cfg, problem)], jobs=1)
    assert row.status == "compiled", row.error
    # In this process (empty memory caches, the same disk cache): loaded, not compiled.
    assert mma_sync.compile(cfg, Problem(2, 3, 300), "sm_90a").loaded_from_disk


def test_workers_sharing_a_folder_compile_once_and_the_rest_wait_for_it(tmp_path):
    calls, finished, returned = [], [], []

    def slow_compile(builds, jobs):
        calls.append((builds, jobs))
        time.sleep(0.5)
        finished.append(time.monotonic())

    def worker():
        compile_ahead_once(["b"], 3, tmp_path, compile=slow_compile)
        returned.append(time.monotonic())

    workers = [threading.Thread(target=worker) for _ in range(4)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(timeout=30)
    assert calls == [(["b"], 3)] and len(returned) == 4
    # None went on to its tests before the compile was done.
    assert min(returned) >= finished[0]
    # A folder already done returns at once; another folder (the next run's) compiles again.
    assert compile_ahead_once(["b"], 3, tmp_path, compile=slow_compile) is False
    (tmp_path / "next").mkdir()
    assert compile_ahead_once(["b"], 3, tmp_path / "next", compile=slow_compile) is True
    assert len(calls) == 2
