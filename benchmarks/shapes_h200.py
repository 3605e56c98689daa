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
import json
import time
from pathlib import Path

import torch
from e2e_h200 import fa3, median_ms

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


def measure(shape, fa3_call) -> dict:
    import tuner
    from tuner import runtime
    from tuner.peers import make_peer
    from tuner.problem import Problem

    batch, seq, heads, seq_kv, kv_heads, causal = shape
    problem = Problem(batch, heads, seq, seq_len_kv=seq_kv, kv_heads=kv_heads, causal=causal)
    gen = torch.Generator(device="cuda").manual_seed(seq + heads + seq_kv)
    q = torch.randn(batch, seq, heads, 128, generator=gen, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(batch, seq_kv, kv_heads, 128, generator=gen, device="cuda",
                        dtype=torch.bfloat16) for _ in range(2))
    best = runtime.config_for_problem(problem)
    kernel = runtime._kernel_for(best.family, best.config, problem, "auto")
    prepared = kernel.prepare(q, k, v)
    res = {"shape": shape, "key": problem.key(), "config": best.config.short(),
           "source": best.source, "ms": {}, "skipped": {}}
    t = res["ms"]
    t["ours kernel"] = median_ms(lambda: kernel.run(prepared))
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
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    fa3_call = fa3()
    measure(SHAPES[0], fa3_call)  # untimed: the first shape of a cold process runs slow
    results = []
    for shape in SHAPES:
        results.append(measure(shape, fa3_call))
        print(json.dumps(results[-1]), flush=True)
    md = table(results, torch.cuda.get_device_name())
    print(md)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "shapes_h200.md").write_text(md + "\n")
        (args.out / "shapes_h200.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
