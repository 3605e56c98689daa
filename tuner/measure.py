"""Validate, then time, one compiled kernel (runs inside the sandbox subprocess).

Validation: the correctness gate of tuner/gate.py (random and structured inputs, outputs poisoned
with NaN, the fp32 reference on the gate's own quantization of the inputs).

Timing: CUDA events around the kernel launch alone, and apart from it `prepare` (quantization
and layout) as the runtime calls it, without its input checks and queued behind a GPU sleep so
that the events see the GPU's work (_time_prepare): a search ranks by their sum, what a caller
pays (tuner/search/cost.py).
Warm-up first, then the median of >= 10 launches with its
inter-quartile range. When one input set fits in L2, several sets are rotated so that their total
exceeds 2x the profile's L2: otherwise every launch after the first reads a hot cache and a small
problem looks faster than it ever runs in a model. The SM clock and temperature are read right
after the timed launches (a throttled GPU explains a slow candidate).

A family whose kernels run on the CPU (the test doubles declare `DEVICE = "cpu"`), or a machine
without CUDA, is timed with perf_counter: the kernel call is synchronous there. A CPU family may
bring its own clock instead, for the kernel and for prepare (`time_launch`, variants/base.py;
the sandbox passes it as `cpu_clock`): the test doubles report the cost they model, because
their work measured with
perf_counter on a loaded 2-core machine overshoots by the scheduler's latency and reordered their
candidates. A GPU is always timed with CUDA events.

Errors raised by the candidate's own code (compile, prepare, run) become `CandidateFailure` with a
typed outcome; errors in this module propagate, since they are bugs of the tuner.
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from tuner.outcomes import Outcome

# Substrings of CUDA errors after which the context is unusable ("sticky" errors): the sandbox must
# be restarted, so they are crashes rather than launch errors.
_STICKY_CUDA_ERRORS = (
    "illegal memory access", "illegal address", "misaligned address", "illegal instruction",
    "unspecified launch failure", "hardware stack error", "device-side assert",
    "cuda_error_illegal", "cuda_error_launch_failed", "invalid program counter",
)

MIN_REPEATS = 10


class CandidateFailure(Exception):
    """A candidate failed in its own code, with the outcome that says how."""

    def __init__(self, outcome: Outcome, message: str) -> None:
        super().__init__(message)
        self.outcome = outcome
        self.message = message


def classify_launch_error(exc: BaseException) -> Outcome:
    text = str(exc).lower()
    sticky = any(marker in text for marker in _STICKY_CUDA_ERRORS)
    return Outcome.CRASH if sticky else Outcome.LAUNCH_ERROR


def guarded(stage: str, fn: Callable[..., Any], *args, sync: Callable[[], None] | None = None,
            **kwargs) -> Any:
    """Call the candidate's code; any exception it raises is the candidate's failure.

    `sync` (torch.cuda.synchronize) runs inside the guard, because a kernel fault surfaces at the
    next synchronization, not at the launch.
    """
    try:
        result = fn(*args, **kwargs)
        if sync is not None:
            sync()
        return result
    except Exception as exc:  # noqa: BLE001 - anything the candidate raises is data
        outcome = Outcome.COMPILE_ERROR if stage == "compile" else classify_launch_error(exc)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise CandidateFailure(outcome, f"{stage}: {type(exc).__name__}: {first}"[:2000]) from exc


@dataclass(frozen=True)
class Timing:
    median_ms: float
    iqr_ms: float
    q1_ms: float
    q3_ms: float
    min_ms: float
    repeats: int
    warmup: int
    rotated_sets: int
    prepare_ms: float
    clock: str  # "cuda-events", "cpu-perf-counter" or "cpu-family-clock" (the family's own)
    sm_clock_mhz: float | None
    temperature_c: float | None

    def to_dict(self) -> dict:
        return asdict(self)


def summarize(samples_ms: list[float]) -> tuple[float, float, float, float]:
    """(median, q1, q3, min) of the samples."""
    if len(samples_ms) == 1:
        x = samples_ms[0]
        return x, x, x, x
    q1, med, q3 = statistics.quantiles(samples_ms, n=4, method="inclusive")
    return med, q1, q3, min(samples_ms)


def rotation_sets(set_bytes: int, l2_bytes: int) -> int:
    """How many input sets to rotate so that their total exceeds 2x L2 (1 if one set is larger)."""
    if set_bytes <= 0 or set_bytes > l2_bytes:
        return 1
    return math.floor(2 * l2_bytes / set_bytes) + 1


def read_clocks(device) -> tuple[float | None, float | None]:
    """(SM clock MHz, temperature C) from NVML; torch's wrappers if pynvml is absent; else None."""
    if device.type != "cuda":
        return None, None
    index = device.index or 0
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        clock = pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)
        temp = pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)
        return float(clock), float(temp)
    except Exception:  # noqa: BLE001 - NVML is optional; the fields stay None without it
        pass
    import torch

    clock = temp = None
    try:
        clock = float(torch.cuda.clock_rate(index))
    except Exception:  # noqa: BLE001 - same: optional telemetry
        pass
    try:
        temp = float(torch.cuda.temperature(index))
    except Exception:  # noqa: BLE001
        pass
    return clock, temp


def random_inputs(problem, device, seed: int, dtype=None):
    """q (batch, seq_len, heads, head_dim) and k, v (batch, seq_len_kv, kv_heads, head_dim),
    standard normal, from a seeded generator."""
    import torch

    dtype = dtype or torch.bfloat16
    device = torch.device(device)
    # Drawn on the device itself: at B=1, H=56, S=30272 a CPU draw of the three fp32 tensors took
    # ~5 s per candidate on the H200 host, more than timing the kernel. The same seed gives the
    # same inputs on the same kind of device (Philox on CUDA), which is all a re-check needs.
    gen = torch.Generator(device=device).manual_seed(int(seed))
    q_shape = (problem.batch, problem.seq_len, problem.heads, problem.head_dim)
    kv_shape = (problem.batch, problem.seq_len_kv, problem.kv_heads, problem.head_dim)
    # Drawn in the target dtype: an fp32 draw would cost a 0.9 GB temporary per tensor there.
    return tuple(torch.randn(shape, generator=gen, device=device, dtype=dtype)
                 for shape in (q_shape, kv_shape, kv_shape))


def synchronizer(device) -> Callable[[], None] | None:
    if device.type != "cuda":
        return None
    import torch

    return lambda: torch.cuda.synchronize(device)


def poisoned_outputs(batch: int, heads: int, seq_len: int, head_dim: int, device):
    """out (batch, seq_len, heads, head_dim) bf16 and lse (batch, heads, seq_len) fp32, all NaN:
    an element the kernel does not write cannot pass."""
    import torch

    out = torch.full((batch, seq_len, heads, head_dim), float("nan"), dtype=torch.bfloat16,
                     device=device)
    lse = torch.full((batch, heads, seq_len), float("nan"), dtype=torch.float32, device=device)
    return out, lse


def _problem_outputs(problem, device):
    return poisoned_outputs(problem.batch, problem.heads, problem.seq_len, problem.head_dim,
                            device)


def _tensor_bytes(obj, _seen: set[int] | None = None) -> int:
    """Bytes of the distinct tensors reachable from prepared inputs through dataclass fields,
    dicts, lists and tuples (never arbitrary objects: a peer's inputs hold library handles whose
    attributes can be cyclic)."""
    import dataclasses

    import torch

    seen = set() if _seen is None else _seen
    if isinstance(obj, torch.Tensor):
        if obj.data_ptr() in seen:
            return 0
        seen.add(obj.data_ptr())
        return obj.numel() * obj.element_size()
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        values = [getattr(obj, f.name) for f in dataclasses.fields(obj)]
    elif isinstance(obj, dict):
        values = list(obj.values())
    elif isinstance(obj, (list, tuple)):
        values = list(obj)
    else:
        return 0
    return sum(_tensor_bytes(v, seen) for v in values)


def cuda_event_samples(fn: Callable[[int], Any], repeats: int, sync: Callable[[], Any] | None = None
                       ) -> list[float]:
    """ms of fn(0) .. fn(repeats - 1), each between two CUDA events on the current stream,
    all queued back to back and read after one synchronization (sync, else the device's)."""
    import torch

    events = queue_between_events(fn, repeats)
    (sync or torch.cuda.synchronize)()
    return [start.elapsed_time(end) for start, end in events]


def queue_between_events(fn: Callable[[int], Any], repeats: int) -> list:
    """fn(0) .. fn(repeats - 1) queued back to back, each between two timing events on the
    current stream; returns the (start, end) pairs, to be read after a synchronization."""
    import torch

    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(repeats)]
    for i, (start, end) in enumerate(events):
        start.record()
        fn(i)
        end.record()
    return events


def perf_counter_ms(launch: Callable[[], Any]) -> float:
    """The default CPU clock: wall ms of one synchronous call."""
    t0 = time.perf_counter()
    launch()
    return (time.perf_counter() - t0) * 1e3


def _time_prepare(kernel, inputs, device, sync, repeats: int, cpu_clock=None) -> float:
    """Median ms of prepare (what the caller pays before the kernel: quantization and layout),
    timed like the kernel (CUDA events, the input sets rotated); on the CPU by cpu_clock, else
    perf_counter.

    Called as a repeated call that drops the LSE prepares (want_lse=False: no K smoothing
    q . m; the timed runs drop the LSE too), and validate=False: `attention()` checks its
    inputs once per call outside prepare, and the checks' finiteness scan syncs the device, so
    timing them here measured a host round trip (0.45 ms against 0.044 ms of GPU work at B=4
    S=1024 H=32 on the H200) whose noise outweighed whole kernels at small shapes. On a GPU the
    calls are also queued ahead of the GPU (queued_event_samples), as the kernel's are."""
    def run(i: int) -> None:
        guarded("prepare", kernel.prepare, *inputs[i % len(inputs)], validate=False,
                want_lse=False)

    host_ms = 0.0
    if device.type == "cuda":
        # A first, untimed round measures the host time that the spin must cover (queueing
        # alone: taken before the sync, so the GPU's work is not in it).
        t0 = time.perf_counter()
        for i in range(len(inputs)):
            run(i)
        host_ms = (time.perf_counter() - t0) * 1e3 / len(inputs)
        guarded("prepare", sync)
    return statistics.median(_samples(run, repeats, device, sync, "prepare", cpu_clock,
                                      host_ms=host_ms))


_SLEEP_CYCLES_PER_MS: dict[str, float] = {}


def _queue_ahead(device, ms: float):
    """Keep the GPU busy for about `ms` (torch.cuda._sleep, a spin in a kernel) so that the
    host can queue the timed calls behind it: their events then measure the GPU's work alone.
    Returns an event recorded after the spin (done: the spin is over).

    The spin's cycles per ms are measured once per device, after an untimed spin (a first
    launch can load the spin kernel's module on the host inside the timed interval, and a rate
    measured across that gap is too low), over 5 ms. A rate can still be off (the clocks move),
    so queued_event_samples checks the returned event instead of trusting the length. On the
    H200 an unchecked spin once let prepare read 0.05-0.09 ms at S=1024..8192 H=56 D=64, the
    host's launch rate, against 0.014-0.076 ms of GPU work. The spin is capped at 200 ms."""
    import torch

    key = str(device)
    if key not in _SLEEP_CYCLES_PER_MS:
        torch.cuda._sleep(1000)
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        probe = 10_000_000  # about 5 ms at 2 GHz: launch jitter is small beside it
        start.record()
        torch.cuda._sleep(probe)
        end.record()
        end.synchronize()
        _SLEEP_CYCLES_PER_MS[key] = probe / max(start.elapsed_time(end), 1e-3)
    torch.cuda._sleep(int(min(ms, 200.0) * _SLEEP_CYCLES_PER_MS[key]))
    done = torch.cuda.Event()
    done.record()
    return done


def queued_event_samples(fn: Callable[[int], Any], repeats: int, host_ms: float, device,
                         sync: Callable[[], Any]) -> list[float]:
    """cuda_event_samples of fn(0) .. fn(repeats - 1) queued behind a GPU spin long enough for
    the host (host_ms a call) to queue them all, so that each sample is the GPU's time for the
    call, not the host's launch overhead (which in a model overlaps the previous layer's
    kernels). If the spin is over before the last call is queued (the host fell behind it),
    the round is thrown away and run again behind a spin 4x longer, up to two more times."""
    ahead_ms = 2.0 * host_ms * repeats + 1.0
    for _ in range(3):  # the first round, then up to two behind longer spins
        done = _queue_ahead(device, ahead_ms)
        events = queue_between_events(fn, repeats)
        covered = not done.query()
        sync()
        if covered:
            break
        ahead_ms *= 4.0
    return [start.elapsed_time(end) for start, end in events]


def _samples(fn, repeats: int, device, sync, stage: str, cpu_clock=None, *,
             host_ms: float = 0.0) -> list[float]:
    """ms of fn(0) .. fn(repeats - 1): on a GPU CUDA events, the calls queued ahead of the GPU
    (queued_event_samples; host_ms: the host's time per call; a sync failure counts as
    `stage`'s), else each call timed by cpu_clock, or perf_counter."""
    if device.type == "cuda":
        return queued_event_samples(fn, repeats, host_ms, device,
                                    sync=lambda: guarded(stage, sync))
    timer = cpu_clock or perf_counter_ms
    return [timer(functools.partial(fn, i)) for i in range(repeats)]


def time_kernel(kernel, problem, device, seed: int, l2_bytes: int, *, repeats: int = 20,
                warmup: int = 3, cpu_clock: Callable[[Callable[[], Any]], float] | None = None
                ) -> Timing:
    """Median/IQR of `repeats` launches of the kernel alone, L2-cold through input rotation.

    `cpu_clock(call) -> ms` runs one call (a launch, or a prepare) on the CPU and says what it
    counts for (a CPU family's `time_launch`); None is perf_counter_ms. A GPU is timed with CUDA
    events only."""

    if cpu_clock is not None and device.type == "cuda":
        raise ValueError("cpu_clock is for CPU families; CUDA launches are timed with events")
    repeats = max(MIN_REPEATS, repeats)
    sync = synchronizer(device)
    q, k, v = random_inputs(problem, device, seed)

    first = guarded("prepare", kernel.prepare, q, k, v, want_lse=False, sync=sync)
    out, lse = _problem_outputs(problem, device)
    set_bytes = _tensor_bytes(first) + _tensor_bytes(out) + _tensor_bytes(lse)
    # The GPU profile's L2 means nothing to a CPU double: no rotation there.
    n_sets = rotation_sets(set_bytes, l2_bytes) if device.type == "cuda" else 1
    inputs = [(q, k, v)]
    sets = [(first, out, lse)]
    for i in range(1, n_sets):
        # Other random inputs per set, so no set is a cached copy of another.
        qi, ki, vi = random_inputs(problem, device, seed + i)
        inputs.append((qi, ki, vi))
        sets.append((guarded("prepare", kernel.prepare, qi, ki, vi, want_lse=False, sync=sync),
                     *_problem_outputs(problem, device)))
    prepare_ms = _time_prepare(kernel, inputs, device, sync, repeats, cpu_clock)

    n_warm = max(warmup, n_sets)
    t0 = time.perf_counter()
    for i in range(n_warm):
        prepared, out, lse = sets[i % n_sets]
        guarded("run", kernel.run, prepared, out=out, lse=lse, want_lse=False)
    # The host's time to queue a launch (before the sync: the GPU's work is not in it), which
    # the GPU spin ahead of the timed launches must cover.
    host_ms = (time.perf_counter() - t0) * 1e3 / n_warm
    if sync:
        guarded("run", sync)

    # As tuner.attention runs by default: without return_lse, so K smoothing's LSE restore (and,
    # for a Q quantized in the kernel, its read of q) is not part of a launch's time.
    def launch(i: int) -> None:
        prepared, out, lse = sets[i % n_sets]
        guarded("run", kernel.run, prepared, out=out, lse=lse, want_lse=False)

    samples = _samples(launch, repeats, device, sync, "run", cpu_clock, host_ms=host_ms)
    clock, temp = read_clocks(device)
    med, q1, q3, low = summarize(samples)
    return Timing(
        median_ms=med, iqr_ms=q3 - q1, q1_ms=q1, q3_ms=q3, min_ms=low, repeats=repeats,
        warmup=warmup, rotated_sets=n_sets, prepare_ms=prepare_ms,
        clock=("cuda-events" if device.type == "cuda"
               else "cpu-family-clock" if cpu_clock is not None else "cpu-perf-counter"),
        sm_clock_mhz=clock, temperature_c=temp,
    )
