"""Enumerate a family's space for a target GPU, apply can_implement, optionally compile each
feasible config for the target arch (fake tensors: no GPU needed) and collect its resources.

This is how a user with an RTX 5080 in the next room pre-filters the space from a laptop, and
how CI checks that the sm_120a kernels still build.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import re
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass

from tuner.gpus import GpuProfile
from tuner.problem import Problem
from variants import load_family
from variants.base import enumerate_space


@dataclass
class SpaceRow:
    family: str
    config: dict
    feasible: bool
    reason: str | None = None  # why can_implement rejected it
    registers: int | None = None
    spill_bytes: int | None = None
    smem_bytes: int | None = None
    compile_s: float | None = None
    error: str | None = None  # compile error, one line

    @property
    def status(self) -> str:
        if not self.feasible:
            return "rejected"
        if self.error:
            return "compile_error"
        return "compiled" if self.registers is not None else "feasible"

    def to_dict(self) -> dict:
        return {**asdict(self), "status": self.status}


def enumerate_rows(gpu: GpuProfile, family_name: str, problem: Problem) -> list[SpaceRow]:
    family = load_family(family_name)
    domains = family.space(gpu.arch)
    rows = []
    for cfg in enumerate_space(family.Config, domains):
        ok, reason = family.can_implement(cfg, problem, gpu)
        rows.append(SpaceRow(family_name, cfg.to_dict(), ok, reason))
    return rows


def _init_compile_worker(arch: str) -> None:
    # Before anything imports cutlass: CuTe DSL reads the target arch from the environment.
    os.environ["CUTE_DSL_ARCH"] = arch


def _compile_one(family_name: str, config: dict, problem: dict, arch: str) -> dict:
    family = load_family(family_name)
    start = time.perf_counter()
    try:
        kernel = family.compile(family.Config.from_dict(config), Problem(**problem), arch)
    except Exception as exc:  # noqa: BLE001 - a failed build is a row of the report, not a crash
        first_line = (str(exc).strip().splitlines() or [""])[0]
        return {"error": f"{type(exc).__name__}: {first_line}"[:300]}
    r = kernel.resources
    return {
        "registers": r.registers,
        "spill_bytes": r.spill_bytes,
        "smem_bytes": r.smem_bytes,
        "compile_s": round(time.perf_counter() - start, 2),
    }


def compile_rows(
    rows: list[SpaceRow], gpu: GpuProfile, problem: Problem, jobs: int, progress=None
) -> None:
    """Compile the feasible rows in a spawn pool of `jobs` processes, filling them in place."""
    todo = [r for r in rows if r.feasible]
    ctx = mp.get_context("spawn")
    with ProcessPoolExecutor(
        max_workers=max(1, jobs),
        mp_context=ctx,
        initializer=_init_compile_worker,
        initargs=(gpu.arch,),
    ) as pool:
        futures = {
            pool.submit(_compile_one, r.family, r.config, problem.to_dict(), gpu.arch): r
            for r in todo
        }
        for future, row in futures.items():
            try:
                result = future.result()
            except BrokenProcessPool:
                # A compiler that takes its process down breaks the pool: every row still
                # pending says so rather than the report dying.
                result = {"error": "compiler process died (BrokenProcessPool)"}
            for key, value in result.items():
                setattr(row, key, value)
            if progress:
                progress()


def summarize(rows: list[SpaceRow]) -> dict:
    # Group rejections by the constraint, not by its numbers ("shared memory N B per CTA > ...").
    rejected = Counter(re.sub(r"\d+", "N", r.reason) for r in rows if not r.feasible and r.reason)
    return {
        "total": len(rows),
        "feasible": sum(r.feasible for r in rows),
        "compiled": sum(r.status == "compiled" for r in rows),
        "compile_errors": sum(r.status == "compile_error" for r in rows),
        "rejected_by_reason": dict(rejected.most_common()),
    }
