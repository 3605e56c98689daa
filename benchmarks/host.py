"""host: where the host time of a repeated tuner.attention call goes.

Per shape, the call beside its GPU work (benchmarks/e2e.py's loops): GPU us (CUDA events), host us
(the loop's calls without a sync), wall - GPU (such a loop until the GPU drained, minus its own GPU
time: what the GPU sits idle per call; benchmarks/e2e.py) and sync - GPU (a sync after each call),
and the caching allocator's allocations per call. Then per part (call_parts), the host's
microseconds per call over --calls calls queued without a sync: the whole call, the signature and
plan lookup (tuner/plans.py), the launch plan's allocations and launches (variants/launch_plan.py;
each launch timed inside the whole call, launch_parts: K smoothing's mean, the quantization, the
kernel with split_tail's two programs), and, not in the call, prepare + run (what a strided input or
the first call pays); "rest" is the whole call less its parts (the api's checks, glue); and the same
call through the custom op and the SDPA drop-in, whole (other_entries). Then cProfile over
--profile-calls calls (the functions with the most own time; the profiler inflates every Python
call, so read the shares), and last torch.profiler's GPU kernels per call (after every host timing:
once it has run, CUPTI stays subscribed and later launches cost more). benchmarks/host_stub.py runs
the same parts on a CPU with the device work stood in.
"""

from __future__ import annotations

import time

from benchmarks import common
from benchmarks.common import cell, markdown_table, shape_text

HELP = "where the host time of a repeated tuner.attention call goes (parts, cProfile, kernels)"
DEFAULT_SHAPES = ("4,1024,32,128", "1,4096,56,128", "1,8192,32,128,causal,kvh=8")
QUICK_SHAPES = ("4,1024,32,128",)
# The parts of call_parts that make up the call (the others are inside one of these, or not in it).
NO_PLAN = "prepare + run (no launch plan: the call's path)"
DISJOINT = ("signature and plan lookup", "launch plan (allocations, launches)", NO_PLAN)
ALLOCATIONS = "of which allocations (scratch, out)"


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


def parts(problem, seed: int) -> tuple[dict, tuple]:
    """(name -> a call of one part of tuner.attention's work, the inputs q, k, v they read): one
    input set of the problem."""
    import torch

    from tuner.measure import random_inputs

    q, k, v = random_inputs(problem, torch.device("cuda"), seed)
    found = {**call_parts(q, k, v, problem.causal), **other_entries(q, k, v, problem.causal)}
    torch.cuda.synchronize()
    return found, (q, k, v)


def other_entries(q, k, v, causal: bool) -> dict:
    """name -> the same call through the custom op (what a torch.compile graph calls) and the
    SDPA drop-in ((batch, heads, seq_len, head_dim) views, its layout copies included): whole
    calls, beside attention()'s parts. The drop-in only where its top-left causal mask is
    tuner.attention's bottom-right one (equal lengths)."""
    import tuner
    from tuner.ops import attention_op

    entries = {"custom op (other entry, whole call)": lambda: attention_op(
        q, k, v, None, "", "auto", None, False, causal, None, False)}
    if not causal or q.shape[1] == k.shape[1]:
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        gqa = q.shape[2] != k.shape[2]
        entries["SDPA drop-in (other entry, whole call)"] = \
            lambda: tuner.scaled_dot_product_attention(qt, kt, vt, is_causal=causal,
                                                       enable_gqa=gqa)
    return entries


def call_plan(q, k, v, causal: bool):
    """The CallPlan (tuner/plans.py) a repeated tuner.attention(q, k, v, causal=causal) runs,
    made by a first call here."""
    import tuner
    from tuner import api, plans

    tuner.attention(q, k, v, causal=causal)
    return plans.CALLS[api.signature(q, k, v, causal, None, "auto", None, None)]


def call_parts(q, k, v, causal: bool) -> dict:
    """name -> a call of one part of a repeated tuner.attention(q, k, v, causal=causal) (its
    plan made here): the CUDA suite above and the CPU stand-in (benchmarks/host_stub.py) time
    the same parts. The last, prepare + run, is not part of the call: it is what a call pays
    where the plan's launches do not take its inputs (strided ones), and the custom op's
    body before its first call. A call without a launch plan (LaunchPlan.make's None) takes
    prepare + run itself, its part then."""
    import torch

    import tuner
    from tuner import api, plans

    plan = call_plan(q, k, v, causal)
    launch, kernel = plan.launch, plan.kernel
    found = {
        "attention() (whole call)": lambda: tuner.attention(q, k, v, causal=causal),
        "signature and plan lookup": lambda: plans.CALLS.get(
            api.signature(q, k, v, causal, None, "auto", None, None)),
    }

    def prepare_run():
        return kernel.run(kernel.prepare(q, k, v, validate=False), want_lse=False)

    if launch is None:
        found[NO_PLAN] = prepare_run
        return found
    scratch = launch.scratch_bytes
    found.update({
        "launch plan (allocations, launches)": lambda: launch(q, k, v, None, False, False),
        ALLOCATIONS: lambda: (
            torch.empty(scratch, dtype=torch.uint8, device=q.device),
            torch.empty(q.shape, dtype=torch.bfloat16, device=q.device)),
        "prepare + run (not in the call)": prepare_run,
    })
    return found


# The plan's launchers (variants/launch_plan.py) launch_parts times in place, and their rows.
LAUNCHERS = (("_mean_launch", "of which the mean launch"),
             ("_quant", "of which the quantization launch"),
             ("_attend", "of which the kernel launch"))


def launch_parts(q, k, v, causal: bool, calls: int) -> dict:
    """name -> host us per call of each launch a repeated tuner.attention call makes (the
    DSL's host stub and the driver behind it), timed inside `calls` whole calls by wrapping the
    plan's launchers (two perf_counter reads each, ~0.1 us, land in the launch's time). Empty
    where the call has no launch plan."""
    import torch

    import tuner

    launch = call_plan(q, k, v, causal).launch
    if launch is None:
        return {}
    originals = {attr: getattr(launch, attr) for attr, _ in LAUNCHERS
                 if getattr(launch, attr) is not None}
    spent = dict.fromkeys(originals, 0.0)
    clock = time.perf_counter

    def timed(attr, fn):
        def launch_(*values):
            t0 = clock()
            fn(*values)
            spent[attr] += clock() - t0
        return launch_

    try:
        for attr, fn in originals.items():
            setattr(launch, attr, timed(attr, fn))
        for _ in range(calls):
            tuner.attention(q, k, v, causal=causal)
        torch.cuda.synchronize()
    finally:
        for attr, fn in originals.items():
            setattr(launch, attr, fn)
    return {name: spent[attr] / calls * 1e6 for attr, name in LAUNCHERS if attr in spent}


def with_launches(us: dict, launches: dict) -> dict:
    """The parts' timings with launch_parts' rows after the allocations' (the launch plan's
    other share), where the table lists them."""
    at = list(us).index(ALLOCATIONS) + 1 if ALLOCATIONS in us else len(us)
    items = list(us.items())
    return dict(items[:at] + list(launches.items()) + items[at:])


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


def allocations_per_call(fn, calls: int = 50) -> float:
    """The caching allocator's allocations per call of fn()."""
    import torch

    fn()
    before = torch.cuda.memory_stats()["allocation.all.allocated"]
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (torch.cuda.memory_stats()["allocation.all.allocated"] - before) / calls


def against_gpu(problem, whole, calls: int, repeats: int) -> list:
    """[GPU us, host us, wall - GPU, sync - GPU, allocations] of the whole call (e2e's loops)."""
    from benchmarks.e2e import overheads

    gpu_ms = common.time_calls(lambda _i: whole(), 1, repeats).median_ms
    h = overheads(whole, gpu_ms, calls)
    return [cell(h["gpu_us"], ".1f"), cell(h["host_us"], ".1f"),
            cell(h["wall_minus_gpu_us"], ".1f"), cell(h["sync_minus_gpu_us"], ".1f"),
            cell(allocations_per_call(whole), ".1f")]


def run(args, gpu) -> str:
    problems = common.shapes_of(args)
    profile_calls = common.sized(args.profile_calls, 2000, 500, args)
    made = {p: parts(p, args.seed) for p in problems}
    calls = {p: found for p, (found, _) in made.items()}
    # Every host timing first, the torch profiler last (module docstring).
    whole_rows = [[shape_text(p), *against_gpu(p, calls[p]["attention() (whole call)"],
                                               args.calls, args.repeats)] for p in problems]
    host = {p: {name: host_us(fn, args.calls) for name, fn in calls[p].items()}
            for p in problems}
    for p, (_, (q, k, v)) in made.items():
        host[p] = with_launches(host[p], launch_parts(q, k, v, p.causal, args.calls))
    sections = [markdown_table(["shape", "GPU us", "host us", "wall - GPU", "sync - GPU",
                                "allocations"], whole_rows), ""]
    for p in problems:
        us = host[p]
        whole = us["attention() (whole call)"]
        rest = whole - sum(us[n] for n in DISJOINT if n in us)
        rows = [[n, cell(v, ".1f"), f"{v / whole:.0%}"] for n, v in us.items()]
        rows.append(["rest (checks, glue)", cell(rest, ".1f"), f"{rest / whole:.0%}"])
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
