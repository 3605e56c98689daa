"""wgmma v_layout on the H200: V transposed by prepare (prepared) vs in shared memory (kernel).

The kernel alone is not the whole story: with v_layout=prepared, `prepare` writes V
feature-major (a transpose, plus the register-P key permutation) while it quantizes; with
v_layout=kernel it writes V as it came, like K, and the kernel's producer warps transpose each
strip in shared memory. So both are timed three ways, side by side per S in one run, with the
other knobs at the default:
  kernel            tuner.measure.time_kernel (CUDA events around the launch alone, L2-cold
                    through input rotation, median of 20)
  prepare           CUDA events around prepare(q, k, v) from bf16 (quantize + layout), median
                    of 20; its inputs are 3 x S x H x D bf16, past L2 from S = 4096 on
  prepare + kernel  CUDA events around both, median of 20: what attention(q, k, v) costs per
                    call when q, k, v are new each call (a model's forward)
Every config is first checked against the fp32 reference at S = 77 and 4096 (H = 2).

  source .device/env.sh && python3 benchmarks/v_layout_h200.py --out $OUT
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from tuner.gate import validate_kernel  # noqa: E402
from tuner.gpus import PROFILES  # noqa: E402
from tuner.measure import cuda_event_samples, random_inputs, time_kernel  # noqa: E402
from tuner.problem import Problem  # noqa: E402
from variants import wgmma  # noqa: E402

HEADS = 56
GPU = PROFILES["h200"]
REPEATS = 20


def events_median_ms(fn, repeats: int = REPEATS, warmup: int = 3) -> float:
    """Median GPU time of fn() between two CUDA events on the current stream."""
    for _ in range(warmup):
        fn()
    return statistics.median(cuda_event_samples(lambda _i: fn(), repeats))


def measure(cfg, seq_len: int) -> dict:
    problem = Problem(1, HEADS, seq_len)
    device = torch.device("cuda")
    kernel = wgmma.compile(cfg, problem, GPU.arch)
    alone = time_kernel(kernel, problem, device, seed=1, l2_bytes=GPU.l2_bytes, repeats=REPEATS)
    q, k, v = random_inputs(problem, device, seed=2)
    out = torch.empty(1, seq_len, HEADS, problem.head_dim, dtype=torch.bfloat16, device=device)
    lse = torch.empty(1, HEADS, seq_len, dtype=torch.float32, device=device)
    prepare_ms = events_median_ms(lambda: kernel.prepare(q, k, v, validate=False))
    both_ms = events_median_ms(
        lambda: kernel.run(kernel.prepare(q, k, v, validate=False), out=out, lse=lse))
    return {"kernel": alone.median_ms, "kernel_iqr": alone.iqr_ms, "prepare": prepare_ms,
            "both": both_ms}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--seq-lens", default="4096,8192,16384,30272")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    seq_lens = [int(s) for s in args.seq_lens.split(",")]
    default = wgmma.default(GPU.arch, Problem(1, HEADS, seq_lens[-1]))
    configs = {layout: dataclasses.replace(default, v_layout=layout)
               for layout in ("prepared", "kernel")}
    for layout, cfg in configs.items():
        for s in (77, 4096):
            problem = Problem(1, 2, s)
            metrics = validate_kernel(wgmma.compile(cfg, problem, GPU.arch), problem,
                                      torch.device("cuda"), seed=s)
            if not metrics.passed:
                raise SystemExit(f"{layout} S={s}: {metrics.reason}")
        print(f"{layout}: passes the reference at S=77, 4096", flush=True)

    lines = [f"## wgmma v_layout on {torch.cuda.get_device_name()} "
             f"({time.strftime('%Y-%m-%d')}), B=1 H={HEADS} D=128, default knobs otherwise, "
             "ms (kernel TFLOP/s)", "",
             "| S | layout | kernel | prepare | prepare + kernel | speed vs prepared: kernel "
             "| speed vs prepared: prepare + kernel |", "|---|---|---|---|---|---|---|"]
    for s in seq_lens:
        problem = Problem(1, HEADS, s)
        rows = {layout: measure(cfg, s) for layout, cfg in configs.items()}
        base = rows["prepared"]
        for layout, row in rows.items():
            lines.append(
                f"| {s} | {layout} | {row['kernel']:.3f} ({problem.tflops(row['kernel']):.0f}) "
                f"| {row['prepare']:.3f} | {row['both']:.3f} "
                f"| {base['kernel'] / row['kernel']:.3f}x | {base['both'] / row['both']:.3f}x |")
        print("\n".join(lines[-2:]), flush=True)
    table = "\n".join(lines)
    (out / "v_layout_h200.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
