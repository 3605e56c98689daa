"""The GPU tiers: `-m gpu` runs a covering set (every family, shape class, mask and knob value at
least once, in a few minutes on one GPU); `-m gpu_full` runs the exhaustive sweeps (every feasible
config, every bug on every shape). A test in the full tier carries gpu_full and not gpu, so that
`-m gpu` never selects it. Compile time dominates both (2-5 s a build, one after another in the
test process), so a module states the builds of each of its tests (gpu_builds(test name,
parameters) -> [(family, Config, Problem)]) and tests/conftest.py compiles those of the selected
tests in parallel before the first one runs."""

from itertools import combinations
from pathlib import Path

import pytest
from filelock import FileLock

GPU = pytest.mark.gpu
GPU_FULL = pytest.mark.gpu_full


def tiered(cases, in_gpu, ids) -> list:
    """pytest.params of `cases` (tuples of a test's arguments), each marked gpu where
    in_gpu(index, case), else gpu_full; ids(case) names each."""
    return [pytest.param(*case, marks=GPU if in_gpu(i, case) else GPU_FULL, id=ids(case))
            for i, case in enumerate(cases)]


def pairwise_cover(configs: list) -> list:
    """Configs of `configs` (greedily, in a fixed order) such that every pair of knob values
    that some config of `configs` holds together is held together by a chosen one: each value
    of each knob, and each knob's value against each other knob's, at least once."""
    rows = [c.to_dict() for c in configs]
    knobs = list(rows[0])
    bit: dict = {}
    masks = []
    for row in rows:
        mask = 0
        for a, b in combinations(knobs, 2):
            mask |= 1 << bit.setdefault((a, row[a], b, row[b]), len(bit))
        masks.append(mask)
    todo, chosen = (1 << len(bit)) - 1, []
    while todo:
        best = max(range(len(rows)), key=lambda i: (masks[i] & todo).bit_count())
        chosen.append(configs[best])
        todo &= ~masks[best]
    return chosen


def selected_builds(items) -> list[tuple]:
    """(family, Config, Problem) of every kernel the GPU tests among `items` will build, as their
    modules' gpu_builds(test name, parameters) state them; one per build (the build depends on
    the problem's head_dim and mask, and with pack_gqa its group)."""
    builds = {}
    for item in items:
        hook = getattr(getattr(item, "module", None), "gpu_builds", None)
        if hook is None or not any(item.get_closest_marker(m) for m in ("gpu", "gpu_full")):
            continue
        callspec = getattr(item, "callspec", None)
        for family, cfg, problem in hook(item.originalname, callspec.params if callspec else {}):
            # wgmma's pack_gqa compiles the group in as well.
            group = problem.group if getattr(cfg, "pack_gqa", False) else 1
            builds.setdefault((family, cfg, problem.head_dim, problem.causal, group),
                              (family, cfg, problem))
    return list(builds.values())


def compile_ahead(builds, jobs: int) -> list:
    """Compile `builds` for sm_90a in `jobs` compile sandboxes (tuner.space.compile_rows) into
    the disk cache, where each test's own compile() then finds them: the tests compile one
    build after another in one process, at 2-5 s each. A build that fails here is left to its
    test to report. Returns the rows (status, error) for a caller that wants them."""
    from tuner.gpus import PROFILES
    from tuner.space import SpaceRow, compile_rows

    rows = [SpaceRow(family, cfg.to_dict(), True) for family, cfg, _ in builds]
    compile_rows(rows, PROFILES["h200"], [problem for *_, problem in builds], jobs, sass=False)
    return rows


def compile_ahead_once(builds, jobs: int, shared: Path, compile=compile_ahead) -> bool:
    """compile(builds, jobs) once for all processes that share the folder `shared`: under
    pytest-xdist every worker collects every test, so each would compile every build, all at
    once on the same cores; the first takes the lock and compiles, the others wait on it and
    then find the disk cache warm. True where this call compiled."""
    done = shared / "gpu_builds_ahead.done"
    with FileLock(shared / "gpu_builds_ahead.lock"):
        if done.exists():
            return False
        compile(builds, jobs)
        done.touch()
    return True


def assert_passes_the_gate(family, cfg, problem) -> None:
    """`cfg` of `family` (a module) through the correctness gate on the GPU with a fresh seed
    (named if it fails), its three cases each printed on one line."""
    import os

    import torch

    from tuner.gate import validate_kernel

    seed = int.from_bytes(os.urandom(4), "little")
    report = validate_kernel(family.compile(cfg, problem, "sm_90a"), problem,
                             torch.device("cuda"), seed)
    print(f"\n{cfg.short()} {problem.key()}: "
          + " ".join(f"{c['case']} rel {c.get('rel_rms', 0):.4f} row {c.get('worst_row', 0):.4f}"
                     for c in report.cases))
    assert report.passed, f"{cfg.short()} seed={seed}: {report.reason}"
    assert [c["case"] for c in report.cases] == ["random", "structured", "realistic"]
