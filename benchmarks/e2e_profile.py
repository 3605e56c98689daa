"""Where `tuner.attention`'s time goes from bf16 inputs (issue 15): the host's cost per stage
of one call, and the GPU's time per launch (torch.profiler, CUPTI kernel records).

    python3 benchmarks/e2e_profile.py [--shapes 1,4096,56,128 4,1024,32,128] [--out DIR]
                                      [--cprofile]   # also the host's hottest functions

Host costs are perf_counter over many calls queued without a sync (the GPU stays behind, so
nothing waits on it); GPU times are the profiler's per-kernel durations, averaged per call.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from call_timing import gpu_kernels, host_and_wall_us

DEFAULT_SHAPES = ("1,4096,56,128", "4,1024,32,128", "1,8192,56,128", "2,4608,24,128")


def host_us(fn, calls: int = 200) -> float:
    """Mean host microseconds per call of fn, the GPU left to drain after the loop."""
    return host_and_wall_us(fn, calls)[0]


def host_hot_spots(fn, calls: int = 2000, rows: int = 25) -> str:
    """cProfile of `calls` calls of fn: the functions with the most own time (the profiler
    inflates every Python call, so read the shares, not the absolute times)."""
    import cProfile
    import io
    import pstats

    host_us(fn, 50)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(rows)
    return text.getvalue()


def _launch_parts(kernel, prepared, out, lse, q) -> dict:
    """Host us of the pieces of one launch: the DSL's own call, FastLaunch, its
    run_compiled_program alone (cells already filled), and a torch allocation."""
    from variants.common.abi import launch_values

    launcher, extra = kernel._launcher(q.device)
    stream = torch.cuda.current_stream().cuda_stream
    values = launch_values(prepared, out, lse, stream, extra=extra)
    addresses = launcher.fill(values)
    return {
        "DSL call (make_ptr args)": host_us(lambda: kernel._fn(*launcher.dsl_args(values))),
        "FastLaunch call": host_us(lambda: launcher(*values)),
        "run_compiled_program": host_us(lambda: kernel._fn.run_compiled_program(addresses)),
        "torch.empty": host_us(lambda: torch.empty(16, device="cuda")),
        "torch.zeros": host_us(lambda: torch.zeros(16, device="cuda")),
        "current_stream": host_us(lambda: torch.cuda.current_stream(q.device).cuda_stream),
    }


def profile_shape(shape: tuple[int, int, int, int], with_gpu: bool = False) -> dict:
    """The host stages of one shape, or with_gpu its GPU launches (main runs every shape's host
    stages first: once torch.profiler has run in a process, CUPTI stays subscribed and every
    later launch costs more host time)."""
    import tuner
    from tuner.runtime import _kernel_for, load_best_config, run_attention
    from variants.prepare import check_qkv

    batch, seq_len, heads, head_dim = shape
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(shape, generator=gen, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))
    tuner.attention(q, k, v)
    torch.cuda.synchronize()
    best = load_best_config(seq_len, heads=heads, head_dim=head_dim, with_source=True)
    from tuner.problem import Problem

    kernel = _kernel_for(best.family, best.config, Problem(batch, heads, seq_len, head_dim),
                         "auto")
    prepared = kernel.prepare(q, k, v, validate=False)
    out = torch.empty(q.shape, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty((batch, heads, seq_len), dtype=torch.float32, device="cuda")
    host = {
        "attention()": host_us(lambda: tuner.attention(q, k, v)),
        "attention(check_finite=False)": host_us(
            lambda: tuner.attention(q, k, v, check_finite=False)),
        "run_attention (no op dispatch)": host_us(
            lambda: run_attention(q, k, v, None, "", "auto", None, False)),
        "check_qkv": host_us(lambda: check_qkv(q, k, v, require_cuda=True, check_finite=False)),
        "load_best_config": host_us(lambda: load_best_config(seq_len, heads=heads,
                                                             head_dim=head_dim, with_source=True)),
        "prepare": host_us(lambda: kernel.prepare(q, k, v, validate=False)),
        "run (kernel launch)": host_us(lambda: kernel.run(prepared, out=out, lse=lse)),
        **_launch_parts(kernel, prepared, out, lse, q),
    }
    if not with_gpu:
        return {"shape": shape, "config": best.config.short(), "source": best.source,
                "host_us": host}
    return {
        "attention()": gpu_kernels(lambda: tuner.attention(q, k, v, check_finite=False)),
        "prepare": gpu_kernels(lambda: kernel.prepare(q, k, v, validate=False)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=list(DEFAULT_SHAPES))
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--cprofile", action="store_true")
    args = parser.parse_args()
    shapes = [tuple(int(x) for x in text.split(",")) for text in args.shapes]
    results = [profile_shape(shape) for shape in shapes]
    for shape, res in zip(shapes, results, strict=True):
        res["gpu"] = profile_shape(shape, with_gpu=True)
        print(f"\n## B, S, H, D = {shape} ({res['config']}, {res['source']}), measured on "
              f"{torch.cuda.get_device_name()}")
        print("| host stage | us per call |\n|---|---|")
        for name, us in res["host_us"].items():
            print(f"| {name} | {us:.1f} |")
        for what, rows in res["gpu"].items():
            print(f"\nGPU launches of {what}: {sum(r[1] for r in rows):.1f} us in all")
            print("| kernel | us per call | launches |\n|---|---|---|")
            for name, us, n in rows:
                print(f"| `{name}` | {us:.1f} | {n} |")
        if args.cprofile:
            import tuner

            q = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
            print(host_hot_spots(lambda q=q: tuner.attention(q, q, q)))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "e2e_profile.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
