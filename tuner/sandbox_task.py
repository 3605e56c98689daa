"""What a sandbox's child runs (tuner/sandbox.py starts it): the Task it is sent, the
CandidateResult it answers, and the compile, gate, accuracy check and timing of one candidate.

Stored times depend on this module, so the code version counts it (tuner/search/records.py);
the parent's process handling in tuner/sandbox.py times nothing and is left out.
"""

from __future__ import annotations

import importlib
import os
import signal
import time
import traceback
from dataclasses import asdict, dataclass, field

from tuner.measure import CandidateFailure, guarded
from tuner.outcomes import Outcome


@dataclass(frozen=True)
class Task:
    kind: str  # "compile": family.compile only (warms the disk cache) | "evaluate": validate + time
    family: str  # module name for variants.load_family (a dotted path for test doubles)
    config: dict
    problem: dict
    arch: str
    l2_bytes: int = 0
    seed: int = 0
    device: str = "cuda"  # "cpu" for families that run on the CPU
    repeats: int = 20
    warmup: int = 3
    timeout_s: float = 600.0
    accuracy: dict | None = None  # budget.Budget.to_task(): the check after the gate (None: none)


@dataclass
class CandidateResult:
    outcome: Outcome
    message: str | None = None
    compile_s: float | None = None
    resources: dict | None = None  # registers, spill_bytes, smem_bytes
    timing: dict | None = None  # measure.Timing.to_dict()
    accuracy: dict | None = None  # reference.AccuracyMetrics.to_dict()
    wall_s: float = 0.0
    extra: dict = field(default_factory=dict)


# ---- child side ----------------------------------------------------------------------------------

def _compile(task: Task):
    from tuner.problem import Problem
    from variants import load_family

    family = load_family(task.family)
    cfg = family.Config.from_dict(task.config)
    problem = Problem(**task.problem)
    t0 = time.perf_counter()
    kernel = guarded("compile", family.compile, cfg, problem, task.arch)
    return family, kernel, time.perf_counter() - t0


def _resources(kernel) -> dict | None:
    res = getattr(kernel, "resources", None)
    return asdict(res) if res is not None else None


def _cpu_clock(family, kernel, device):
    """The CPU family's own clock for one launch (`time_launch`, variants/base.py), else None
    (perf_counter). Only a CPU family's: a GPU is always timed with CUDA events."""
    time_launch = getattr(family, "time_launch", None) if device.type == "cpu" else None
    return None if time_launch is None else (lambda launch: time_launch(kernel, launch))


def _evaluate(task: Task) -> CandidateResult:
    import torch

    from tuner.gate import validate_kernel
    from tuner.measure import time_kernel
    from tuner.problem import Problem

    device = torch.device(task.device)
    if device.type == "cpu":
        # A CPU double shares the cores with the compile pool and the search; torch's spinning
        # intra-op threads then stretch a 2 ms call to ~100 ms on a 2-core machine.
        torch.set_num_threads(1)
    family, kernel, compile_s = _compile(task)
    problem = Problem(**task.problem)
    # Validation inputs differ from the timing inputs (seed + 1): fresh data for each.
    t0 = time.perf_counter()
    metrics = validate_kernel(kernel, problem, device, task.seed + 1)
    validate_s = time.perf_counter() - t0
    if not metrics.passed:
        return CandidateResult(Outcome.WRONG_RESULT, metrics.reason, compile_s, _resources(kernel),
                               accuracy=metrics.to_dict())
    # Wall time of each stage (inputs, reference, launches): where a search's time goes.
    stages, accuracy = {"validate_s": round(validate_s, 4)}, metrics.to_dict()
    if task.accuracy is not None:
        from tuner.budget import check

        budget = check(kernel, problem, device, task.accuracy)
        stages["accuracy_s"] = budget.pop("accuracy_s")
        accuracy.update(budget)
        if not budget["e2e_error"] <= budget["max_error"]:
            return CandidateResult(
                Outcome.TOO_INACCURATE, f"end-to-end error {budget['e2e_error']:.4g} on "
                f"{budget['e2e_data']} is over the budget {budget['max_error']:g}", compile_s,
                _resources(kernel), timing=stages, accuracy=accuracy)
    t0 = time.perf_counter()
    timing = time_kernel(kernel, problem, device, task.seed + 2, task.l2_bytes,
                         repeats=task.repeats, warmup=task.warmup,
                         cpu_clock=_cpu_clock(family, kernel, device))
    stages["time_s"] = round(time.perf_counter() - t0, 4)
    return CandidateResult(Outcome.OK, None, compile_s, _resources(kernel),
                           {**timing.to_dict(), **stages}, accuracy)


def _run_task(task: Task) -> CandidateResult:
    if task.kind == "compile":
        _, kernel, compile_s = _compile(task)
        cubin = getattr(kernel, "cubin_path", None)
        return CandidateResult(Outcome.OK, None, compile_s, _resources(kernel),
                               extra={"cubin": str(cubin)} if cubin else {})
    if task.kind == "evaluate":
        return _evaluate(task)
    raise ValueError(f"unknown task kind {task.kind!r}")


def serve(conn, preload: tuple[str, ...]) -> None:
    # Ctrl-C reaches the whole process group; only the parent decides when children stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Import the heavy modules (torch: seconds) before saying ready, so that a task's deadline
    # measures the task, not the start-up of a fresh child.
    for module in preload:
        importlib.import_module(module)
    conn.send(("ready", os.getpid()))
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):  # the parent is gone
            return
        if task is None:
            return
        t0 = time.perf_counter()
        try:
            result = _run_task(task)
        except CandidateFailure as failure:
            result = CandidateResult(failure.outcome, failure.message)
        except Exception:  # noqa: BLE001 - a tuner bug: report it whole, the parent raises it
            conn.send(("bug", traceback.format_exc()))
            continue
        result.wall_s = time.perf_counter() - t0
        conn.send(("result", result))
        if result.outcome == Outcome.CRASH:
            return  # the CUDA context is poisoned: exit, the parent restarts this sandbox
