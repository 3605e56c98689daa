"""The two ways the end-to-end benchmarks time a call, in one place (e2e_h200.py, e2e_profile.py,
quant_profile.py):

  host_and_wall_us: the host's microseconds per call of a loop queued without a sync (the GPU left
      to drain after it, so nothing on the host waits for it), and the wall microseconds per call
      of that loop once the GPU has drained;
  gpu_kernels: the GPU's time per kernel, from the profiler's CUPTI kernel records (no host gaps
      in it, which CUDA events around a short call would include).
"""

from __future__ import annotations

import time
from collections import defaultdict

import torch


def host_and_wall_us(call, calls: int = 50) -> tuple[float, float]:
    """(host us per call, wall us per call) of `calls` calls in a loop, after one warm-up call."""
    call()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        call()
    host = (time.perf_counter() - t0) / calls * 1e6
    torch.cuda.synchronize()
    return host, (time.perf_counter() - t0) / calls * 1e6


def gpu_kernels(call, calls: int = 5, *, name=lambda raw: raw[:90]) -> list[tuple[str, float, int]]:
    """(kernel name, GPU us per call, launches per call) of `calls` calls, slowest first; `name`
    maps the profiler's kernel name to the row it is summed into."""
    from torch.profiler import ProfilerActivity, profile

    call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    total, count = defaultdict(float), defaultdict(int)
    for evt in prof.events():
        if evt.device_type == torch.autograd.DeviceType.CUDA:
            total[name(evt.name)] += evt.device_time
            count[name(evt.name)] += 1
    return sorted(((key, total[key] / calls, count[key] // calls) for key in total),
                  key=lambda row: -row[1])
