"""The shapes models have (issue 17): causal masks, grouped KV heads, cross-attention lengths, our
FP8 kernel beside FlashAttention-3's FP8 forward and cuDNN's FP8 SDPA, all in one process on the
same inputs.

    python3 benchmarks/shapes_h200.py [--out DIR]     (FA3: after a .device call, with
                                                       source .device-fa3/env.sh)

Systems (ms, median of CUDA-event samples, the same inputs every repeat):
  ours kernel   the config tuner.attention would run (database, table or default) on prepared
                inputs: the kernel alone
  ours e2e      tuner.attention from bf16 (quantization included)
  FA3 FP8       flash_attn_func on e4m3 inputs (the fa3-fwd wheel, a measured peer only)
  cuDNN FP8     cudnn-frontend sdpa_fp8 (its causal mask is aligned to the top left, so it runs
                causal shapes of equal lengths only)
TFLOP/s count the visible (query, key) pairs (tuner.problem.Problem.flops: causal at equal
lengths is half the square).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from e2e_h200 import fa3, median_ms
from results_out import measure_each, publish

# (batch, seq_len, heads, seq_len_kv, kv_heads, causal)
SHAPES = [
    (1, 4096, 56, 4096, 56, True),
    (1, 8192, 56, 8192, 56, True),
    (1, 16384, 56, 16384, 56, True),
    (1, 8192, 32, 8192, 8, True),
    (1, 8192, 32, 8192, 8, False),
    (1, 16384, 32, 16384, 8, True),
    (1, 16384, 32, 16384, 8, False),
    (1, 75600, 40, 512, 40, False),
    (2, 4608, 24, 512, 24, False),
]


def bf16_inputs(problem):
    """bf16 q, k, v of the problem, seeded by its lengths and heads."""
    d = problem.head_dim
    gen = torch.Generator(device="cuda").manual_seed(problem.seq_len + problem.heads
                                                     + problem.seq_len_kv)
    q = torch.randn(problem.batch, problem.seq_len, problem.heads, d, generator=gen,
                    device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(problem.batch, problem.seq_len_kv, problem.kv_heads, d, generator=gen,
                        device="cuda", dtype=torch.bfloat16) for _ in range(2))
    return q, k, v


def inputs_and_kernel(problem):
    """bf16_inputs, the config tuner.attention would run, its kernel and the prepared inputs."""
    from tuner import runtime

    q, k, v = bf16_inputs(problem)
    best = runtime.config_for_problem(problem)
    kernel = runtime._kernel_for(best.family, best.config, problem, "auto")
    return (q, k, v), best, kernel, kernel.prepare(q, k, v)


def measure(shape, fa3_call) -> dict:
    import tuner
    from tuner import runtime
    from tuner.peers import make_peer
    from tuner.problem import Problem

    batch, seq, heads, seq_kv, kv_heads, causal = shape
    problem = Problem(batch, heads, seq, seq_len_kv=seq_kv, kv_heads=kv_heads, causal=causal)
    (q, k, v), best, kernel, prepared = inputs_and_kernel(problem)
    res = {"shape": shape, "key": problem.key(), "config": best.config.short(),
           "source": best.source, "ms": {}, "skipped": {}}
    t = res["ms"]
    t["ours kernel"] = median_ms(lambda: kernel.run(prepared))
    if best.family == "wgmma":
        # The tile_order knob (issue 17) both ways on the same prepared inputs: the order
        # changes which tile a CTA runs, not what prepare writes.
        import dataclasses

        from variants.wgmma.config import TILE_ORDERS

        res["tile_order"] = {}
        for order in TILE_ORDERS:
            other = runtime._kernel_for(best.family, dataclasses.replace(
                best.config, tile_order=order), problem, "auto")
            res["tile_order"][order] = median_ms(lambda: other.run(prepared))  # noqa: B023
    t["ours e2e"] = median_ms(lambda: tuner.attention(q, k, v, causal=causal))
    if fa3_call is not None:
        def per_tensor(x):
            amax = x.abs().amax().float().clamp_min(1e-12)
            return (x.float() * (448.0 / amax)).to(torch.float8_e4m3fn), amax / 448.0

        (q8, dq), (k8, dk), (v8, dv) = (per_tensor(x) for x in (q, k, v))
        descales = {n: d.reshape(1, 1).expand(batch, kv_heads).contiguous()
                    for n, d in (("q_descale", dq), ("k_descale", dk), ("v_descale", dv))}
        t["FA3 FP8"] = median_ms(lambda: fa3_call(q8, k8, v8, causal=causal, **descales))
    try:
        peer = make_peer("cudnn-fp8", problem)
        peer_in = peer.prepare(q, k, v)
        t["cuDNN FP8"] = median_ms(lambda: peer.run(peer_in))
    except Exception as exc:  # noqa: BLE001 - a peer missing or refusing the shape
        res["skipped"]["cuDNN FP8"] = str(exc).splitlines()[0][:160]
    res["tflops"] = {name: problem.tflops(ms) for name, ms in t.items()}
    return res


def table(results, device: str) -> str:
    cols = ["ours kernel", "FA3 FP8", "cuDNN FP8", "ours e2e"]
    lines = [f"Measured on {device}, {time.strftime('%Y-%m-%d')}: ms (TFLOP/s), median of 20.",
             "", "| B, Sq, H, Skv, Hkv, mask | config | " + " | ".join(cols)
             + " | kernel vs FA3 FP8 | kernel vs cuDNN FP8 |", "|" + "---|" * (len(cols) + 4)]
    for r in results:
        t, f = r["ms"], r["tflops"]
        cells = [f"{t[c]:.3f} ({f[c]:.0f})" if c in t else "-" for c in cols]
        ratios = [f"{t[p] / t['ours kernel']:.2f}x" if p in t else "-"
                  for p in ("FA3 FP8", "cuDNN FP8")]
        b, s, h, skv, hkv, causal = r["shape"]
        lines.append(f"| {b}, {s}, {h}, {skv}, {hkv}, {'causal' if causal else 'full'} | "
                     f"{r['source']} | " + " | ".join(cells + ratios) + " |")
    orders = [r for r in results if "tile_order" in r]
    if orders:
        names = list(orders[0]["tile_order"])
        lines += ["", "tile_order, kernel alone (ms; the config above with only the order "
                  "changed):", "", "| B, Sq, H, Skv, Hkv, mask | " + " | ".join(names)
                  + f" | {names[1]} vs {names[0]} |", "|" + "---|" * (len(names) + 2)]
        for r in orders:
            b, s, h, skv, hkv, causal = r["shape"]
            ms = [r["tile_order"][n] for n in names]
            lines.append(f"| {b}, {s}, {h}, {skv}, {hkv}, {'causal' if causal else 'full'} | "
                         + " | ".join(f"{m:.3f}" for m in ms) + f" | {ms[0] / ms[1]:.2f}x |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    fa3_call = fa3()
    results = measure_each(SHAPES, lambda shape: measure(shape, fa3_call))
    md = table(results, torch.cuda.get_device_name())
    publish(args.out, "shapes_h200", md, results)


if __name__ == "__main__":
    main()
