"""host: where the host time of a repeated tuner.attention call goes.

Per part, the host's microseconds per call over --calls calls queued without a sync (the GPU
left to drain after the loop, so the host never waits on it): the whole call, the input checks
(variants.prepare.check_qkv), the plan lookup (tuner.runtime._plan: the memoized config and
kernel of the shape), the allocation of the output and LSE, prepare's launch and the kernel's
launch on prepared inputs; "rest" is the whole call less the parts (dispatch, glue). Then
cProfile over --profile-calls calls (the functions with the most own time; the profiler inflates
every Python call, so read the shares), and last torch.profiler's GPU kernels per call (after
every host timing: once it has run, CUPTI stays subscribed and later launches cost more).
"""

from __future__ import annotations

import time

from benchmarks import common
from benchmarks.common import cell, markdown_table, shape_text

HELP = "where the host time of a repeated tuner.attention call goes (parts, cProfile, kernels)"
DEFAULT_SHAPES = ("4,1024,32,128", "1,4096,56,128", "1,8192,32,128,causal,kvh=8")
QUICK_SHAPES = ("4,1024,32,128",)


def add_arguments(parser) -> None:
    parser.add_argument("--calls", type=int, default=200,
                        help="calls per host timing (default 200)")
    parser.add_argument("--profile-calls", type=int, default=None,
                        help="calls under cProfile (default 2000, --quick 500)")
    parser.add_argument("--top", type=int, default=12, help="cProfile rows shown (default 12)")
    parser.add_argument("--no-torch-profiler", action="store_true",
                        help="skip the GPU kernels per call")


def host_us(fn, calls: int) -> float:
    """Mean host microseconds of fn() over `calls` calls without a sync (after one warm call)."""
    import torch

    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    us = (time.perf_counter() - t0) / calls * 1e6
    torch.cuda.synchronize()
    return us


def parts(problem, seed: int) -> dict:
    """name -> a call of one part of tuner.attention's work, on one input set of the problem."""
    import torch

    import tuner
    from tuner.measure import random_inputs

    q, k, v = random_inputs(problem, torch.device("cuda"), seed)
    tuner.attention(q, k, v, causal=problem.causal)
    torch.cuda.synchronize()
    return call_parts(q, k, v, problem.causal)


def call_parts(q, k, v, causal: bool) -> dict:
    """name -> a call of one part of a repeated tuner.attention(q, k, v, causal=causal) (its
    plan made already): the CUDA suite above and the CPU stand-in (benchmarks/host_stub.py)
    time the same parts."""
    import torch

    import tuner
    from tuner import runtime
    from variants.prepare import check_qkv

    kernel = runtime._plan(q, k, causal, "", "auto", None)
    prepared = kernel.prepare(q, k, v, validate=False)
    batch, seq_len, heads, _ = q.shape
    out_shape, lse_shape = tuple(q.shape), (batch, heads, seq_len)
    out = torch.empty(out_shape, dtype=torch.bfloat16, device=q.device)
    lse = torch.empty(lse_shape, dtype=torch.float32, device=q.device)
    return {
        "attention() (whole call)": lambda: tuner.attention(q, k, v, causal=causal),
        "input checks": lambda: check_qkv(q, k, v, require_cuda=True, check_finite=False),
        "plan lookup": lambda: runtime._plan(q, k, causal, "", "auto", None),
        "allocation (out, lse)": lambda: (
            torch.empty(out_shape, dtype=torch.bfloat16, device=q.device),
            torch.empty(lse_shape, dtype=torch.float32, device=q.device)),
        "prepare launch": lambda: kernel.prepare(q, k, v, validate=False),
        "kernel launch": lambda: kernel.run(prepared, out=out, lse=lse),
    }


def hot_spots(fn, calls: int, top: int) -> list:
    """cProfile rows (function, calls per call, own us per call, share of own time)."""
    import cProfile
    import pstats

    import torch

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(prof).stats  # (file, line, name) -> (cc, nc, tt, ct, callers)
    total = sum(v[2] for v in stats.values()) or 1.0
    ranked = sorted(stats.items(), key=lambda item: -item[1][2])[:top]
    rows = []
    for (path, line, name), (_, nc, tt, _, _) in ranked:
        where = f"{path.rsplit('/', 1)[-1]}:{line} {name}" if line else name
        rows.append([f"`{where}`", cell(nc / calls, ".1f"), cell(tt / calls * 1e6, ".1f"),
                     f"{tt / total:.0%}"])
    return rows


def gpu_kernels(fn, calls: int = 5) -> list:
    """(kernel name, GPU us per call, launches per call) of `calls` calls, torch.profiler."""
    from collections import defaultdict

    import torch
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    total, count = defaultdict(float), defaultdict(int)
    for evt in prof.events():
        if evt.device_type == torch.autograd.DeviceType.CUDA:
            us = getattr(evt, "device_time", None)
            total[evt.name[:70]] += evt.cuda_time if us is None else us
            count[evt.name[:70]] += 1
    return [[f"`{k}`", cell(total[k] / calls, ".1f"), cell(count[k] / calls, ".1f")]
            for k in sorted(total, key=lambda k: -total[k])]


def run(args, gpu) -> str:
    problems = common.shapes_of(args)
    profile_calls = common.sized(args.profile_calls, 2000, 500, args)
    calls = {p: parts(p, args.seed) for p in problems}
    # Every host timing first, the torch profiler last (module docstring).
    host = {p: {name: host_us(fn, args.calls) for name, fn in calls[p].items()}
            for p in problems}
    sections = []
    for p in problems:
        us = host[p]
        whole = us["attention() (whole call)"]
        rest = whole - sum(v for n, v in us.items() if n != "attention() (whole call)")
        rows = [[n, cell(v, ".1f"), f"{v / whole:.0%}"] for n, v in us.items()]
        rows.append(["rest (dispatch, glue)", cell(rest, ".1f"), f"{rest / whole:.0%}"])
        print(f"  {shape_text(p)}: attention() {whole:.1f} us host", flush=True)
        sections += [f"### {shape_text(p)}", "",
                     markdown_table(["part", "host us per call", "of the call"], rows), "",
                     f"cProfile, {profile_calls} calls (own time; shares, not absolutes):", "",
                     markdown_table(["function", "calls per call", "own us per call", "share"],
                                    hot_spots(calls[p]["attention() (whole call)"],
                                              profile_calls, args.top)), ""]
    if not args.no_torch_profiler:
        for p in problems:
            sections += [f"GPU kernels per attention() call, {shape_text(p)} (torch.profiler):",
                         "", markdown_table(["kernel", "GPU us per call", "launches per call"],
                                            gpu_kernels(calls[p]["attention() (whole call)"])),
                         ""]
    return "\n".join(sections)
