"""A fake kernel family for CPU tests of the search: same protocol as variants/<family>.

The "kernel" computes the fp32 reference on the CPU and then sleeps `cost_ms(cfg)` more, a
deterministic cost surface with its optimum away from the default, so the search has something to
find. Planted configs exercise every outcome (see PLANTED). `DEVICE = "cpu"` tells the tuner the
kernels run on the CPU; `time_launch` is its clock there (variants/base.py): a launch counts for
the cost it models, not for the wall time of its sleep. Measured with perf_counter, a sleep on a
loaded 2-core machine overshoots by the scheduler's latency, and the winner of
test_workers_share_one_study_and_decide_once can flip on it. The sleep stays so
that a search still takes wall time (the time-budget and kill-mid-search tests need that).

Set FAKE_FAMILY_COMPILE_LOG to a file path to get one JSON line per compile() call, in whatever
process it happens: that is how tests prove infeasible configs never reach a compiler.
"""

from __future__ import annotations

import json
import math
import os
import signal
import time
from dataclasses import dataclass

from variants.base import ConfigMixin

DEVICE = "cpu"
NAME = "tests.doubles.fake_family"


@dataclass(frozen=True)
class Config(ConfigMixin):
    tile: int
    stages: int


SPACE = {"tile": [16, 32, 64, 128], "stages": [1, 2, 3, 4]}

# (tile, stages) -> what goes wrong. Infeasible configs (tile * stages > 256) are not listed:
# can_implement rejects them, and compile() raises if one ever gets there.
PLANTED = {
    (16, 1): "compile_error",
    (16, 2): "compile_crash",  # the compiler process dies
    (32, 1): "crash",  # the kernel "segfaults" (SIGSEGV to its own process)
    (16, 4): "hang",
    (32, 4): "launch_error",
    (128, 1): "wrong_result",
}


def space(arch: str) -> dict[str, list]:
    return {k: list(v) for k, v in SPACE.items()}


def default(arch: str, problem) -> Config:
    # Deliberately not the optimum (64, 3) of cost_ms: the search must beat it.
    return Config(tile=64, stages=2)


def can_implement(cfg, problem, gpu) -> tuple[bool, str | None]:
    smem = cfg.tile * cfg.stages
    if smem > 256:
        return False, f"shared memory: tile {cfg.tile} x stages {cfg.stages} = {smem} > 256"
    return True, None


def cost_ms(cfg) -> float:
    if _planted(cfg) == "wrong_result":
        return 1.0  # a kernel that skips work is fast: the search must still not pick it
    # The default (64, 2) and the optimum's other neighbours are 4 ms behind the optimum (64, 3);
    # time_launch reports these numbers exactly, so the order and the re-time's spread rule
    # (IQR 0 here) never depend on how busy the machine is.
    return 2.0 + 6.0 * abs(math.log2(cfg.tile / 64)) + 4.0 * abs(cfg.stages - 3)


# Every config shares one quantization (variants.prepare.quantize_inputs), so its modelled cost
# is one constant: it adds the same to every candidate's caller cost (tuner/search/cost.py) and
# reorders nothing, as a shared prepare does on a GPU. 0.25 ms: about what quantize_inputs takes
# on one CPU core at B=1 H=2 S=64 D=64 (0.3 ms measured, 2026-12-01).
PREPARE_MS = 0.25


def _planted(cfg) -> str | None:
    if os.environ.get("FAKE_FAMILY_NO_PLANTS"):  # a test about scheduling, not outcomes
        return None
    return PLANTED.get((cfg.tile, cfg.stages))


def _log_compile(cfg) -> None:
    path = os.environ.get("FAKE_FAMILY_COMPILE_LOG")
    if path:
        with open(path, "a") as fh:
            fh.write(json.dumps({"module": __name__, "pid": os.getpid(), **cfg.to_dict()}) + "\n")


@dataclass(frozen=True)
class _Resources:
    registers: int
    spill_bytes: int
    smem_bytes: int


def time_launch(kernel, call) -> float:
    """The tuner's clock for this CPU family: run the call (kernel.run or kernel.prepare) and
    count the cost it modelled."""
    kernel.last_ms = None
    call()
    assert kernel.last_ms is not None, "a timed call that models no cost"
    return kernel.last_ms


class FakeKernel:
    def __init__(self, cfg, problem, cost):
        self.config = cfg
        self.problem = problem
        self.cost = cost
        # The modelled cost of the latest run or prepare (time_launch).
        self.last_ms: float | None = None
        self.resources = _Resources(registers=64 + cfg.stages * 16, spill_bytes=0,
                                    smem_bytes=cfg.tile * cfg.stages * 64)

    def prepare(self, q, k, v, softmax_scale=None, validate=True, want_lse=True):
        from variants.prepare import quantize_inputs

        self.last_ms = PREPARE_MS
        return quantize_inputs(q, k, v, softmax_scale=softmax_scale)

    def run(self, prepared, out=None, lse=None, *, want_lse=True):
        from variants.reference import reference_attention

        planted = _planted(self.config)
        if planted == "crash":
            os.kill(os.getpid(), signal.SIGSEGV)
        if planted == "hang":
            time.sleep(3600)
        if planted == "launch_error":
            raise RuntimeError("CUDA error: too many resources requested for launch")
        ref = reference_attention(prepared)
        ref_out, ref_lse = ref.out, ref.lse
        if planted == "wrong_result":
            ref_out = ref_out * 1.5
        if out is None:
            out = ref_out.to(dtype=__import__("torch").bfloat16)
        else:
            out.copy_(ref_out)
        if lse is None:
            lse = ref_lse
        else:
            lse.copy_(ref_lse)
        # time_launch reports this; the sleep only makes the search take wall time like a real
        # one (its length is not what the search compares).
        self.last_ms = self.cost(self.config)
        time.sleep(self.last_ms / 1e3)
        return out, lse


def compile(cfg, problem, arch: str, *, _cost=cost_ms, _can_implement=can_implement):
    _log_compile(cfg)
    ok, reason = _can_implement(cfg, problem, None)
    if not ok:
        raise AssertionError(f"infeasible config reached compile(): {reason}")
    planted = _planted(cfg)
    if planted == "compile_error":
        raise RuntimeError(f"fake DSL error: cannot partition tile {cfg.tile}")
    if planted == "compile_crash":
        os._exit(7)
    return FakeKernel(cfg, problem, _cost)
