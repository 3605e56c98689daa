"""Where candidates run: `--gpu NAME` resolved to a GPU profile, a device fingerprint and the
torch device, or, for families that run on the CPU (test doubles), a profile by name alone."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass
class Target:
    gpu: object  # gpus.GpuProfile
    device_id: str
    fingerprint: dict
    device: str  # "cuda" or "cpu"


def runs_on_cpu(modules: dict) -> bool:
    """Whether every family runs on the CPU (test doubles declare DEVICE = "cpu")."""
    return all(getattr(m, "DEVICE", "cuda") == "cpu" for m in modules.values())


def make_target(gpu_name: str, modules: dict) -> Target:
    """Families that run on the CPU take the profile by name without a local GPU, under a CPU
    fingerprint, so that a CPU machine can test the whole search; any other must find the
    named GPU here (gpus.resolve_gpu stops and says which GPU it found)."""
    from tuner import gpus

    if runs_on_cpu(modules):
        profile = gpus.resolve_gpu("h200" if gpu_name == "auto" else gpu_name, require_local=False)
        fingerprint = {"name": f"cpu-double-{profile.name}", "compute_capability": "cpu",
                       "sm_count": os.cpu_count() or 1}
        return Target(profile, gpus.fingerprint_id(fingerprint), fingerprint, "cpu")
    profile = gpus.resolve_gpu(gpu_name)
    fingerprint = gpus.device_fingerprint()
    return Target(profile, gpus.fingerprint_id(fingerprint), fingerprint, "cuda")
