"""e2e: what a caller with bf16 tensors pays. tuner.attention end to end (quantization, kernel,
host work) beside FA3 bf16, torch SDPA bf16 (cuDNN backend) and SageAttention 1 (fp16 in) where
installed (benchmarks/systems.py), with our kernel alone and our quantization (prepare) alone
measured in the same run, and tuner.attention with the same config's P.V in bf16 (wgmma
pv_dtype="bf16", the accuracy rung beside SageAttention's) and that with QK^T in int8 too
(qk_dtype="int8", Q quantized in prepare: SageAttention's QK^T precision) where the family has
the knobs, and the SDPA drop-in (tuner.scaled_dot_product_attention) on the tensors the SDPA
peer takes: (batch, heads, seq_len, head_dim) contiguous, the layout a model that applies RoPE
after its head transpose hands to attention.

GPU time: CUDA events around each call, the calls queued behind a GPU spin so that a sample is
the GPU's work for the call (benchmarks.common.time_calls), inputs rotated past 2x L2, median of
--repeats. Kernel and prepare alone: tuner.measure.time_kernel (the search's protocol).

Host and wall time per call, each system on its own, in loops sized to about --loop-ms:
  host us      the loop's calls without a sync: the CPU's time per call, the GPU not waited on
  wall - GPU   the same loop (with an event pair around each call) until the GPU drained, per
               call, minus that loop's own GPU time per call (the pairs' mean): what the GPU sits
               idle between calls (the call's host cost where host > GPU)
  sync - GPU   a loop with a sync after each call, per call, minus the GPU time above: the
               latency a synchronous caller pays beyond the GPU's work
wall - GPU takes its GPU time from its own loop, not from the rotated-input timing: two runs'
clocks differ by about +-1 ms at 30 ms per call, which would swamp the idle time.
The benchmark's own share is measured beside them (a loop of bare syncs, a loop of bare event
pairs) and stated under the table: it is what the loops add that no call does.
No profiler runs in this suite: once torch.profiler has run, CUPTI stays subscribed and every
later launch costs more host time.
"""

from __future__ import annotations

import time
from functools import partial

from benchmarks import common
from benchmarks.common import cell, markdown_table, ratio, shape_text
from benchmarks.systems import BF16_PEERS, bf16_peers, native, top_left_refusal

HELP = "tuner.attention from bf16 beside FA3 bf16, SDPA bf16, SageAttention; host cost per call"
DEFAULT_SHAPES = common.MODEL_SHAPES
QUICK_SHAPES = common.QUICK_SHAPES
PV16 = "ours bf16 P.V e2e"
QK8 = "ours int8 QK bf16 P.V e2e"
DROPIN = "ours SDPA drop-in e2e"


def add_arguments(parser) -> None:
    parser.add_argument("--loop-ms", type=float, default=250.0,
                        help="target length of each host/wall loop (5 to 50 calls; default 250)")


def loop_calls(gpu_ms: float, loop_ms: float) -> int:
    """Calls in one host/wall loop: about loop_ms of GPU work, at least 5, at most 50 (50 calls
    of a few launches stay far below the launch queue's depth, so the host never blocks)."""
    return int(min(50, max(5, loop_ms / max(gpu_ms, 1e-3))))


def overheads(call, gpu_ms: float, calls: int) -> dict:
    """host, wall and sync-loop microseconds per call of `call()` (module docstring)."""
    import torch

    call()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        call()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    for _ in range(calls):
        call()
        torch.cuda.synchronize()
    t3 = time.perf_counter()
    # The no-sync loop once more with an event pair around each call: the loop's own GPU time,
    # so that wall - GPU is the GPU's idle time per call, not two runs' clock difference.
    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
             for _ in range(calls)]
    torch.cuda.synchronize()
    t4 = time.perf_counter()
    for start, end in pairs:
        start.record()
        call()
        end.record()
    torch.cuda.synchronize()
    t5 = time.perf_counter()
    busy_us = sum(start.elapsed_time(end) for start, end in pairs) / calls * 1e3
    gpu_us = gpu_ms * 1e3
    return {"gpu_us": gpu_us, "host_us": (t1 - t0) / calls * 1e6,
            "wall_minus_gpu_us": (t5 - t4) / calls * 1e6 - busy_us,
            "sync_minus_gpu_us": (t3 - t2) / calls * 1e6 - gpu_us}


def benchmark_own(calls: int = 200) -> dict:
    """The loops' own cost per iteration: a bare sync on an idle GPU, and a bare event pair."""
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        torch.cuda.synchronize()
    sync_us = (time.perf_counter() - t0) / calls * 1e6
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(calls)]
    t0 = time.perf_counter()
    for start, end in events:
        start.record()
        end.record()
    pair_us = (time.perf_counter() - t0) / calls * 1e6
    torch.cuda.synchronize()
    return {"sync_us": sync_us, "event_pair_us": pair_us}


def _ours(problem, gpu, args):
    """tuner.attention's call, its config's source, and its kernel's Timing (kernel ms and
    prepare ms, tuner.measure.time_kernel)."""
    import torch

    import tuner
    from tuner.measure import time_kernel
    from tuner.runtime import config_for_problem
    from variants import load_family

    best = config_for_problem(problem)
    kernel = load_family(best.family).compile(best.config.for_q_dtype("bfloat16"), problem,
                                              gpu.profile.arch)
    timing = time_kernel(kernel, problem, torch.device("cuda"), args.seed,
                         gpu.profile.l2_bytes, repeats=args.repeats)
    causal = problem.causal
    return (lambda q, k, v: tuner.attention(q, k, v, causal=causal)), best.source, timing


def _ours_pv16(problem, gpu, qk_int8: bool = False):
    """tuner.attention with the looked-up config's P.V in bf16 (and with qk_int8 its QK^T in
    int8, Q quantized by prepare), or why it cannot run."""
    import tuner
    from tuner.runtime import config_for_problem
    from variants import load_family

    best = config_for_problem(problem)
    cfg = common.with_knobs(best.config.for_q_dtype("bfloat16"), pv_dtype="bf16",
                            **(common.INT8_QK if qk_int8 else {}))
    if isinstance(cfg, str):
        return cfg
    ok, reason = load_family(best.family).can_implement(cfg, problem, gpu.profile)
    if not ok:
        return f"refused: {reason}"
    causal = problem.causal
    return lambda q, k, v: tuner.attention(q, k, v, causal=causal, config=cfg)


def _ours_dropin(problem):
    """The SDPA drop-in's call on SDPA's layout (the SDPA peer's inputs), its output viewed back
    to (batch, seq_len, heads, head_dim) like the peer's; or why it cannot run the problem."""
    import tuner

    why = top_left_refusal(problem)
    if why is not None:
        return why
    causal, gqa = problem.causal, problem.group != 1

    def call(q, k, v):
        out = tuner.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
        return out.transpose(1, 2)

    return call


def measure(problem, gpu, args, *, warm_host: bool = False) -> dict:
    import torch

    sets = common.input_sets(problem, gpu.profile.l2_bytes, args.seed,
                             common.output_bytes(problem))
    ours_call, source, timing = _ours(problem, gpu, args)
    systems = {"ours e2e": ours_call, PV16: _ours_pv16(problem, gpu),
               QK8: _ours_pv16(problem, gpu, qk_int8=True), DROPIN: _ours_dropin(problem),
               **bf16_peers(problem)}
    res = {"problem": problem, "source": source, "kernel_ms": timing.median_ms,
           "prepare_ms": timing.prepare_ms, "ms": {}, "host": {}, "notes": []}
    for name, call in systems.items():
        if isinstance(call, str):
            res["notes"].append(f"{name}: {call}")
            continue
        try:
            layout = "SDPA bf16" if name == DROPIN else name  # the drop-in takes SDPA's layout
            inputs = sets if name in ("ours e2e", PV16, QK8) else [native(layout, s) for s in sets]
            stat = common.time_calls(lambda i, c=call, s=inputs: c(*s[i % len(s)]), len(inputs),
                                     args.repeats)
            n = loop_calls(stat.median_ms, args.loop_ms)
            once = partial(call, *inputs[0])
            if warm_host:  # a cold process runs its first host loops slow
                overheads(once, stat.median_ms, n)
            res["host"][name] = overheads(once, stat.median_ms, n)
            res["ms"][name] = stat.median_ms
        except Exception as exc:  # noqa: BLE001 - a peer failing is a note; ours propagates
            if name == "ours e2e":
                raise
            res["notes"].append(f"{name}: failed: {common.first_line(exc)}")
        torch.cuda.synchronize()
    return res


def run(args, gpu) -> str:
    own = benchmark_own()
    results = []
    for i, problem in enumerate(common.shapes_of(args)):
        res = measure(problem, gpu, args, warm_host=(i == 0))
        print(f"  {shape_text(problem)}: " + ", ".join(
            f"{n} {ms:.3f}" for n, ms in res["ms"].items()), flush=True)
        results.append(res)
    return format_tables(results, own)


def format_tables(results: list[dict], own: dict) -> str:
    headers = ["shape", "source", "ours e2e ms", "TFLOP/s", "kernel ms", "prepare ms",
               "kernel + prepare", *[f"{p} ms" for p in BF16_PEERS], f"{PV16} ms", f"{QK8} ms",
               f"{DROPIN} ms", "faster peer / ours e2e"]
    rows, host_rows, notes = [], [], []
    for r in results:
        p, t = r["problem"], r["ms"]
        ours = t.get("ours e2e")
        peers = [t[n] for n in BF16_PEERS if n in t]
        parts = (r["kernel_ms"] + r["prepare_ms"]
                 if r["kernel_ms"] is not None and r["prepare_ms"] is not None else None)
        rows.append([shape_text(p), r["source"], cell(ours),
                     cell(p.tflops(ours) if ours else None, ".0f"), cell(r["kernel_ms"]),
                     cell(r["prepare_ms"]), cell(parts), *[cell(t.get(n)) for n in BF16_PEERS],
                     cell(t.get(PV16)), cell(t.get(QK8)), cell(t.get(DROPIN)),
                     ratio(min(peers) if peers else None, ours)])
        for name, h in r["host"].items():
            host_rows.append([shape_text(p), name, cell(h["gpu_us"], ".0f"),
                              cell(h["host_us"], ".0f"), cell(h["wall_minus_gpu_us"], ".0f"),
                              cell(h["sync_minus_gpu_us"], ".0f"),
                              "host" if h["host_us"] > h["gpu_us"] else "GPU"])
        notes += [f"- {shape_text(p)} {n}" for n in r["notes"]]
    parts = [markdown_table(headers, rows), "",
             "Per call, us (module docstring of benchmarks/e2e.py): GPU = CUDA events; host = "
             "the call's CPU time; wall - GPU = GPU idle per call in a loop; sync - GPU = a "
             "synchronous caller's latency beyond the GPU's work.", "",
             markdown_table(["shape", "system", "GPU us", "host us", "wall - GPU",
                             "sync - GPU", "bound by"], host_rows), "",
             f"The loops' own cost per iteration: a bare sync {own['sync_us']:.1f} us (inside "
             f"sync - GPU), an event pair {own['event_pair_us']:.1f} us (not in these loops)."]
    if notes:
        parts += ["", "Not measured:", *notes]
    return "\n".join(parts)
