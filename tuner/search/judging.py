"""can_implement over a family's whole space, split over processes where the space is large.

wgmma's space is 3.5M configs: about 10 s of one core per 1.8M on an H100 host, before a cold
search measures anything. The cartesian product is cut into parts by fixing its slowest-varying
knobs (the order of variants.base.enumerate_space), each part is judged in a process of its own,
and the parts' feasible configs are joined in their order: the same list, in the same order, as
judging it in one process. A space under PARALLEL_FROM configs, one CPU, or a pool that cannot
start is judged here.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from tuner.problem import Problem

log = logging.getLogger(__name__)

PARALLEL_FROM = 200_000  # configs; below this a pool's start costs more than it saves
MAX_JOBS = 8
PARTS_PER_JOB = 4  # parts differ in size (can_implement stops early on some): keep all busy


def judge_feasible(family: str, module, problem: Problem, gpu, jobs: int | None = None,
                   parallel_from: int = PARALLEL_FROM) -> list[dict]:
    """The dicts of every config of `module`'s space (module.space(gpu.arch)) that
    can_implement accepts on `problem` and `gpu`, in variants.base.enumerate_space's order.
    `family` names the module for load_family in the worker processes."""
    space = module.space(gpu.arch)
    jobs = min(os.cpu_count() or 1, MAX_JOBS) if jobs is None else jobs
    if jobs < 2 or math.prod(len(v) for v in space.values()) < parallel_from:
        return _judge((family, space, problem, gpu), module)
    parts = split_space(module.Config, space, jobs * PARTS_PER_JOB)
    try:
        # forkserver: a search has CUDA and threads up by now, which fork would copy.
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("forkserver")) \
                as pool:
            chunks = list(pool.map(_judge, [(family, part, problem, gpu) for part in parts]))
    except (OSError, BrokenProcessPool) as exc:
        log.warning("tuner: judging %s's space in %d processes failed (%s); judging it here",
                    family, jobs, exc)
        return _judge((family, space, problem, gpu), module)
    return [config for chunk in chunks for config in chunk]


def split_space(config_cls, space: dict[str, list], parts: int) -> list[dict[str, list]]:
    """`space` as at least `parts` sub-spaces (or one per config, where fewer), each with its
    slowest-varying knobs fixed, in the order enumerate_space walks them: enumerating them one
    after another is enumerating `space`."""
    from variants.base import PREPARE_ONLY_KNOBS

    # enumerate_space's order: the prepare-only knobs first, then the others, as declared.
    fields = [f.name for f in dataclasses.fields(config_cls)]
    names = [n for n in fields if n in PREPARE_ONLY_KNOBS] + \
        [n for n in fields if n not in PREPARE_ONLY_KNOBS]
    fixed = 0
    while fixed < len(names) and math.prod(len(space[n]) for n in names[:fixed]) < parts:
        fixed += 1
    return [{**space, **{n: [v] for n, v in zip(names[:fixed], values, strict=True)}}
            for values in itertools.product(*(space[n] for n in names[:fixed]))]


def _judge(args: tuple, module=None) -> list[dict]:
    """One (sub-)space's feasible configs as dicts; in a worker the family is loaded by name."""
    from variants import load_family
    from variants.base import enumerate_space

    family, space, problem, gpu = args
    module = module or load_family(family)
    return [cfg.to_dict() for cfg in enumerate_space(module.Config, space)
            if module.can_implement(cfg, problem, gpu)[0]]
