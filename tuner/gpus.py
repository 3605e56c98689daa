"""Target GPU profiles, local-device detection and the device fingerprint.

A profile is what the tuner needs to reason about a GPU without having one: the CuTe-DSL arch to
compile for, shared memory per block (the opt-in maximum, which bounds the kernel's stages and
tiles), SM count, L2 (to size the input rotation of the timer), and peak rates for "% of peak".

Peak rates are dense (no sparsity), in TFLOP/s. GeForce parts run FP8 and BF16 MMA with FP32
accumulation at half the FP16-accumulate rate; our kernels accumulate in FP32, so `fp8_tflops`
is the FP32-accumulate rate and `fp8_full_tflops` the full rate (block-scaled MXF8 on sm_120
reaches it with unit scales). Where the two are equal the part has no such penalty.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from dataclasses import asdict, dataclass
from functools import cache

from tuner.errors import TunerError, argument

KIB = 1024
MIB = 1024 * 1024


@dataclass(frozen=True)
class GpuProfile:
    name: str  # the --gpu flag value
    marketing_name: str
    arch: str  # CUTE_DSL_ARCH for codegen
    compute_capability: tuple[int, int]
    sm_count: int
    smem_per_block: int  # bytes, opt-in maximum (cudaDevAttrMaxSharedMemoryPerBlockOptin)
    l2_bytes: int
    fp8_tflops: float  # dense FP8, FP32 accumulate
    fp8_full_tflops: float  # dense FP8 at the full (FP16-accumulate or block-scaled) rate
    bf16_tflops: float  # dense BF16, FP32 accumulate
    mem_bandwidth_gbs: float
    # Substrings of torch.cuda.get_device_name() that identify this part.
    match_names: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return asdict(self)


# Compute capability 8.9 and 12.0: 100 KB shared memory per SM, 99 KB (101376 B) per block
# opt-in; 9.0: 228 KB per SM, 227 KB (232448 B) per block. Source: CUDA C++ Programming Guide,
# "Technical Specifications per Compute Capability".
SMEM_99K = 99 * KIB
SMEM_227K = 227 * KIB

PROFILES: dict[str, GpuProfile] = {
    # NVIDIA RTX Blackwell GPU architecture whitepaper (GB203), table "RTX 5080": 84 SMs, 64 MB L2,
    # 960 GB/s GDDR7; FP8 tensor 450.2 TFLOPS dense (1801 AI TOPS FP4 sparse / 4), FP32-accumulate
    # at half rate on GeForce (225.1); BF16 with FP32 accumulate 112.6 dense.
    "5080": GpuProfile(
        "5080",
        "NVIDIA GeForce RTX 5080",
        "sm_120a",
        (12, 0),
        84,
        SMEM_99K,
        64 * MIB,
        fp8_tflops=225.1,
        fp8_full_tflops=450.2,
        bf16_tflops=112.6,
        mem_bandwidth_gbs=960,
        match_names=("RTX 5080",),
    ),
    # Same whitepaper, GB202 "RTX 5090": 170 SMs, 96 MB L2, 1792 GB/s; 3352 AI TOPS FP4 sparse
    # -> 838 FP8 dense full rate, 419 with FP32 accumulate; BF16 FP32-accumulate 209.5.
    "5090": GpuProfile(
        "5090",
        "NVIDIA GeForce RTX 5090",
        "sm_120a",
        (12, 0),
        170,
        SMEM_99K,
        96 * MIB,
        fp8_tflops=419.0,
        fp8_full_tflops=838.0,
        bf16_tflops=209.5,
        mem_bandwidth_gbs=1792,
        match_names=("RTX 5090",),
    ),
    # NVIDIA RTX PRO 6000 Blackwell datasheet: 188 SMs, 128 MB L2, 1792 GB/s, 4000 AI TOPS FP4
    # sparse -> 1000 FP8 dense. Professional parts have historically had no FP32-accumulate
    # penalty; that is assumed here, not measured (no such GPU on this team's bench).
    "pro6000": GpuProfile(
        "pro6000",
        "NVIDIA RTX PRO 6000 Blackwell",
        "sm_120a",
        (12, 0),
        188,
        SMEM_99K,
        128 * MIB,
        fp8_tflops=1000.0,
        fp8_full_tflops=1000.0,
        bf16_tflops=500.0,
        mem_bandwidth_gbs=1792,
        match_names=("RTX PRO 6000",),
    ),
    # NVIDIA Ada GPU architecture whitepaper, "GeForce RTX 4090": 128 SMs, 72 MB L2, 1008 GB/s;
    # FP8 660.6 dense with FP16 accumulate, 330.3 with FP32; BF16 FP32-accumulate 165.2.
    "4090": GpuProfile(
        "4090",
        "NVIDIA GeForce RTX 4090",
        "sm_89",
        (8, 9),
        128,
        SMEM_99K,
        72 * MIB,
        fp8_tflops=330.3,
        fp8_full_tflops=660.6,
        bf16_tflops=165.2,
        mem_bandwidth_gbs=1008,
        match_names=("RTX 4090",),
    ),
    # NVIDIA L40S datasheet: 142 SMs, 48 MB L2, 864 GB/s; FP8 1466 TFLOPS sparse -> 733 dense,
    # BF16 733 sparse -> 366 dense (datacenter part: no FP32-accumulate penalty).
    "l40s": GpuProfile(
        "l40s",
        "NVIDIA L40S",
        "sm_89",
        (8, 9),
        142,
        SMEM_99K,
        48 * MIB,
        fp8_tflops=733.0,
        fp8_full_tflops=733.0,
        bf16_tflops=366.0,
        mem_bandwidth_gbs=864,
        match_names=("L40S",),
    ),
    # NVIDIA H100 datasheet (SXM5): 132 SMs, 50 MB L2, 3.35 TB/s; FP8 3958 sparse -> 1979 dense,
    # BF16 1979 sparse -> 989.4 dense.
    "h100": GpuProfile(
        "h100",
        "NVIDIA H100 SXM",
        "sm_90a",
        (9, 0),
        132,
        SMEM_227K,
        50 * MIB,
        fp8_tflops=1979.0,
        fp8_full_tflops=1979.0,
        bf16_tflops=989.4,
        mem_bandwidth_gbs=3350,
        match_names=("H100",),
    ),
    # NVIDIA H200 datasheet (SXM): same GH100 compute as H100 SXM (1979 FP8 / 989 BF16 dense),
    # 141 GB HBM3e at 4.8 TB/s; 132 SMs and a 60 MiB L2 as torch reads them on the lent H200
    # (get_device_properties().L2_cache_size = 62914560, 2026-11-29).
    "h200": GpuProfile(
        "h200",
        "NVIDIA H200",
        "sm_90a",
        (9, 0),
        132,
        SMEM_227K,
        60 * MIB,
        fp8_tflops=1979.0,
        fp8_full_tflops=1979.0,
        bf16_tflops=989.4,
        mem_bandwidth_gbs=4800,
        match_names=("H200",),
    ),
}


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _local_device_name(device: int = 0) -> tuple[str, tuple[int, int]]:
    import torch

    return torch.cuda.get_device_name(device), torch.cuda.get_device_capability(device)


def profile_for_device_name(device_name: str) -> GpuProfile | None:
    for profile in PROFILES.values():
        if any(m.lower() in device_name.lower() for m in profile.match_names):
            return profile
    return None


def local_profile(device: int = 0) -> GpuProfile:
    """The profile of the local CUDA device, or a TunerError that says why there is none."""
    if not _cuda_available():
        raise TunerError(
            "no CUDA GPU found on this machine; searching and timing need one. "
            "Without a GPU, `tuner space --gpu NAME --compile` still checks a target's kernels"
        )
    name, cc = _local_device_name(device)
    profile = profile_for_device_name(name)
    if profile is None:
        raise TunerError(
            f"no profile for the local GPU {name!r} (compute capability {cc[0]}.{cc[1]}); "
            f"known: {', '.join(PROFILES)}. Add one to tuner/gpus.py with its datasheet figures"
        )
    return profile


def resolve_gpu(name: str, *, require_local: bool = True) -> GpuProfile:
    """A GPU name (--gpu NAME, gpu=NAME) -> profile. 'auto' is the local device. With
    require_local (search, bench, the runtime), a named profile must be the local GPU, because
    timings of another GPU would be meaningless."""
    key = str(name).strip().lower()
    if key == "auto":
        return local_profile()
    aliases = {"rtx5080": "5080", "rtx5090": "5090", "rtx-pro-6000": "pro6000", "rtx4090": "4090"}
    key = aliases.get(key, key)
    if key not in PROFILES:
        raise TunerError(
            f"unknown GPU {name!r}; known profiles: {', '.join(PROFILES)} "
            "(or 'auto' for the local GPU)"
        )
    profile = PROFILES[key]
    if require_local:
        if not _cuda_available():
            raise TunerError(
                f"{argument('gpu', key)} needs that GPU on this machine, but no CUDA GPU was "
                f"found. Without a GPU, `tuner space --gpu {key} --compile` checks its kernels"
            )
        found, cc = _local_device_name()
        if profile_for_device_name(found) is not profile:
            local = profile_for_device_name(found)
            auto = argument("gpu", "auto")
            hint = f"{argument('gpu', local.name)} or {auto}" if local else auto
            raise TunerError(
                f"{argument('gpu', key)} asks for the {profile.marketing_name}, but this machine "
                f"has {found!r} (compute capability {cc[0]}.{cc[1]}); use {hint}"
            )
    return profile


def _driver_version() -> str | None:
    """The driver version nvidia-smi shows (e.g. 580.159.04): from the kernel module's proc file,
    else (containers often lack it) from nvidia-smi itself."""
    try:
        with open("/proc/driver/nvidia/version") as fh:
            match = re.search(r"Kernel Module\s+([0-9.]+)", fh.read())
        if match:
            return match.group(1)
    except OSError:
        pass
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=10, check=True)
        return done.stdout.strip().splitlines()[0] or None
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def _driver_cuda_version() -> str | None:
    """The CUDA version the driver supports (cuDriverGetVersion), e.g. 13.0."""
    try:
        from cuda.bindings import driver

        err, version = driver.cuDriverGetVersion()
        return f"{version // 1000}.{version % 1000 // 10}" if int(err) == 0 else None
    except Exception:  # the bindings are optional here: the fingerprint just lacks the field
        return None


def software_versions() -> dict[str, str | None]:
    from importlib import metadata

    def version_of(dist: str) -> str | None:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    import torch

    return {
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "cutlass_dsl": version_of("nvidia-cutlass-dsl"),
    }


@cache
def device_fingerprint(device: int = 0) -> dict:
    """What identifies the hardware, plus the software versions that produced a measurement."""
    import torch

    props = torch.cuda.get_device_properties(device)
    return {
        "name": props.name,
        "compute_capability": f"{props.major}.{props.minor}",
        "sm_count": props.multi_processor_count,
        "total_memory_gb": round(props.total_memory / 2**30, 1),
        "driver": _driver_version(),
        "driver_cuda": _driver_cuda_version(),
        **software_versions(),
    }


def fingerprint_id(fingerprint: dict) -> str:
    """Short stable id of the hardware (name, compute capability, SMs): tuned winners are keyed by
    it, so a driver or library upgrade keeps them (the full fingerprint is stored beside them)."""
    identity = {k: fingerprint[k] for k in ("name", "compute_capability", "sm_count")}
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()
    return digest[:16]
