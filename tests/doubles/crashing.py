"""A family whose one config crashes the GPU context, around a real family: the search must
record `crash`, restart its GPU sandbox and go on (tests/gpu/test_search_gpu.py).

The space is `pick` in 0..PICKS-1, the pick-th feasible config of the base family in its
enumeration order (0 is the base default); the config at CRASH_PICK runs its kernel and then a
kernel that stores to address 0 through the CUDA driver, a genuine illegal-address fault that
surfaces at the next synchronization as a sticky CUDA error. On a CPU it dies of SIGSEGV.
"""

from __future__ import annotations

import importlib
import os
import signal
from dataclasses import dataclass

from variants.base import ConfigMixin, judge_space

PICKS = 6
CRASH_PICK = 1

_CRASH_PTX = b"""
.version 7.0
.target sm_80
.address_size 64
.visible .entry tuner_planted_crash()
{
    .reg .b64 %rd<2>;
    .reg .b32 %r<2>;
    mov.u64 %rd1, 0;
    mov.u32 %r1, 1;
    st.global.u32 [%rd1], %r1;
    ret;
}
\0"""


@dataclass(frozen=True)
class Config(ConfigMixin):
    pick: int


def _fault(on_cuda: bool) -> None:
    if not on_cuda:
        os.kill(os.getpid(), signal.SIGSEGV)
    from cuda.bindings import driver

    _, module = driver.cuModuleLoadData(_CRASH_PTX)
    _, fn = driver.cuModuleGetFunction(module, b"tuner_planted_crash")
    driver.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0)


class CrashingKernel:
    def __init__(self, kernel, crash: bool) -> None:
        self._kernel, self._crash = kernel, crash
        self.config = kernel.config
        self.resources = kernel.resources

    def prepare(self, *args, **kwargs):
        return self._kernel.prepare(*args, **kwargs)

    def run(self, prepared, out=None, lse=None, *, want_lse=True):
        result = self._kernel.run(prepared, out=out, lse=lse, want_lse=want_lse)
        if self._crash:
            _fault(prepared.q.is_cuda)
        return result


def crashing_family(base_name: str):
    """(space, default, can_implement, compile) of the crashing family around `base_name`."""
    base = importlib.import_module(base_name)

    def base_config(pick: int, problem, gpu_or_arch):
        arch = getattr(gpu_or_arch, "arch", gpu_or_arch)
        if pick == 0:
            return base.default(arch, problem)
        from tuner.gpus import PROFILES

        gpu = gpu_or_arch if hasattr(gpu_or_arch, "arch") else next(
            p for p in PROFILES.values() if p.arch == arch)
        feasible = (c for c, ok, _ in judge_space(base, problem, gpu) if ok)
        return next(c for i, c in enumerate(feasible, start=1) if i == pick)

    def space(arch: str) -> dict[str, list]:
        return {"pick": list(range(PICKS))}

    def default(arch: str, problem=None) -> Config:
        return Config(0)

    def can_implement(cfg, problem, gpu) -> tuple[bool, str | None]:
        return base.can_implement(base_config(cfg.pick, problem, gpu), problem, gpu)

    def compile(cfg, problem, arch: str):
        kernel = base.compile(base_config(cfg.pick, problem, arch), problem, arch)
        return CrashingKernel(kernel, crash=cfg.pick == CRASH_PICK)

    return space, default, can_implement, compile
