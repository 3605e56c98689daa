"""Enumerate a family's space for a target GPU, apply can_implement, optionally compile each
feasible config for the target arch (fake tensors: no GPU needed) and collect its resources and
the MMA instructions its SASS issues (with nvdisasm: the dev extra's nvidia-cuda-nvdisasm).

This is how a user with an RTX 5080 in the next room pre-filters the space from a laptop, and
how CI checks that the sm_120a kernels still build.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

from tuner.gpus import GpuProfile
from tuner.problem import Problem
from variants import load_family
from variants.base import judge_space


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
    # The MMA opcodes in the compiled SASS (variants.cubin.mma_class), None without nvdisasm.
    mma_class: str | None = None
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
    return [SpaceRow(family_name, cfg.to_dict(), ok, reason)
            for cfg, ok, reason in judge_space(family, problem, gpu)]


# A build takes ~1 s; one that runs this long is hung and is killed.
COMPILE_TIMEOUT_S = 600.0


def compile_rows(rows: list[SpaceRow], gpu: GpuProfile, problem: Problem | list[Problem],
                 jobs: int, progress=None, *, sass: bool = True) -> None:
    """Compile the feasible rows in `jobs` isolated compile sandboxes (the search's own
    tuner.sandbox.Sandbox: spawned, killed on a hang, restarted after a crash), filling the rows
    in place; `problem` is every row's, or a list with each row's. A build that fails, crashes or
    hangs becomes that row's error. With sass, each build's MMA class is read from its SASS."""
    from tuner.outcomes import Outcome
    from tuner.sandbox import Sandbox, Task, poll
    from variants.cubin import disassemble, mma_class, mma_opcodes, nvdisasm_path

    can_disassemble = sass and nvdisasm_path() is not None
    problems = problem if isinstance(problem, list) else [problem] * len(rows)
    problem_of = {id(r): p for r, p in zip(rows, problems, strict=True)}
    todo = [r for r in rows if r.feasible]
    sandboxes = [Sandbox(f"space-{i}", preload=("variants",)) for i in range(max(1, jobs))]
    try:
        while todo or any(w.busy for w in sandboxes):
            for sandbox in sandboxes:
                if not sandbox.busy and todo:
                    row = todo.pop(0)
                    sandbox.submit(Task(kind="compile", family=row.family, config=row.config,
                                        problem=problem_of[id(row)].to_dict(), arch=gpu.arch,
                                        timeout_s=COMPILE_TIMEOUT_S), row)
            for _, (row, result) in poll(sandboxes, 1.0):
                if result.outcome == Outcome.OK:
                    row.registers = result.resources["registers"]
                    row.spill_bytes = result.resources["spill_bytes"]
                    row.smem_bytes = result.resources["smem_bytes"]
                    row.compile_s = round(result.compile_s, 2)
                    cubin = result.extra.get("cubin")
                    if can_disassemble and cubin:
                        sass = disassemble(Path(cubin).read_bytes())
                        row.mma_class = mma_class(mma_opcodes(sass))
                else:
                    first = (result.message or result.outcome).strip().splitlines()[0]
                    row.error = f"{result.outcome}: {first}"[:300]
                if progress:
                    progress()
    finally:
        for sandbox in sandboxes:
            sandbox.close()


_NUMBER = re.compile(r"\d+")


def group_reasons(reasons: list[str]) -> dict[str, int]:
    """Rejection reasons grouped by the constraint, most frequent first: reasons that differ
    only in their numbers ("shared memory 110592 B per CTA > 101376 B ...") are one group,
    shown with each number as its value, or its range min..max where the group's differ."""
    groups: dict[str, list[list[int]]] = {}
    for reason in reasons:
        template = _NUMBER.sub("\0", reason)
        groups.setdefault(template, []).append([int(n) for n in _NUMBER.findall(reason)])
    shown = {}
    for template, numbers in sorted(groups.items(), key=lambda g: -len(g[1])):
        spans = [str(lo) if lo == hi else f"{lo}..{hi}"
                 for lo, hi in ((min(col), max(col)) for col in zip(*numbers, strict=True))]
        pieces = template.split("\0")
        shown["".join(p + n for p, n in zip(pieces, [*spans, ""], strict=True))] = len(numbers)
    return shown


def summarize(rows: list[SpaceRow]) -> dict:
    return {
        "total": len(rows),
        "feasible": sum(r.feasible for r in rows),
        "compiled": sum(r.status == "compiled" for r in rows),
        "compile_errors": sum(r.status == "compile_error" for r in rows),
        "mma_classes": dict(Counter(r.mma_class for r in rows if r.mma_class).most_common()),
        "rejected_by_reason": group_reasons(
            [r.reason for r in rows if not r.feasible and r.reason]),
    }
