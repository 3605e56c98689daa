"""Time mma_sync configs on the local GPU: the seed ladder, or every feasible config.

    python benchmarks/mma_sync_h200.py --configs ladder --seq-lens 4096 30272
    python benchmarks/mma_sync_h200.py --configs all --seq-lens 4096

B=1, H=56, D=128. Kernel time only (prepare excluded), through the tuner's timer
(tuner.measure.time_kernel: CUDA events around each launch, warm-up, median and IQR of --reps
runs, L2-cold rotation). Reference point: torch SDPA in BF16 on the cuDNN backend,
measured in the same process. The ladder is the seed blog's: baseline (1 stage, P in smem, 16
rows/warp, chunk_elems) -> +2 stages -> +register P -> +32 rows/warp (block_n 32) -> +bank_period.
On Hopper mma.sync e4m3 is emulated, so these numbers say nothing about sm_89/sm_120.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from tuner.gpus import local_profile  # noqa: E402
from tuner.measure import time_kernel  # noqa: E402
from tuner.problem import Problem  # noqa: E402
from variants.base import enumerate_space  # noqa: E402
from variants.mma_sync import Config, can_implement, compile, default, space  # noqa: E402

# The seed's first kernel: 64x64 tile, one stage, P through smem, the BF16-habit swizzle.
BASELINE = Config(block_m=64, block_n=64, warps=4, rows_per_warp=16, kv_stages=1,
                  p_source="smem", swizzle="chunk_elems", q_in_registers=False, mma="fp8")
LADDER = [
    ("baseline", BASELINE),
    ("+2 stages", dataclasses.replace(BASELINE, kv_stages=2)),
    ("+register P", dataclasses.replace(BASELINE, kv_stages=2, p_source="registers")),
    ("+32 rows/warp", dataclasses.replace(BASELINE, kv_stages=2, p_source="registers",
                                          block_m=128, rows_per_warp=32, block_n=32)),
    ("+bank_period", dataclasses.replace(BASELINE, kv_stages=2, p_source="registers",
                                         block_m=128, rows_per_warp=32, block_n=32,
                                         swizzle="bank_period")),
]


def timed(kernel, problem: Problem, gpu, reps: int) -> tuple[float, float]:
    """Median and IQR ms through the tuner's one timer (kernel alone, L2-cold rotation)."""
    t = time_kernel(kernel, problem, torch.device("cuda"), seed=1, l2_bytes=gpu.l2_bytes,
                    repeats=reps)
    return t.median_ms, t.iqr_ms


def sdpa_ms(problem: Problem, gpu, reps: int) -> float | None:
    from tuner.measure import CandidateFailure
    from tuner.peers import make_peer

    try:
        return timed(make_peer("sdpa-cudnn"), problem, gpu, reps)[0]
    except (RuntimeError, CandidateFailure) as exc:  # no cuDNN attention for this build / GPU
        print(f"# SDPA cuDNN unavailable: {exc}".splitlines()[0])
        return None


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--configs", choices=("ladder", "all"), default="ladder")
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[4096, 30272])
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--skip", type=int, default=0,
                        help="leave out the first N rows (finish a run cut off by a time limit; "
                             "the order of the rows is fixed)")
    args = parser.parse_args()
    if args.skip and len(args.seq_lens) > 1:
        parser.error("--skip resumes one cut-off run: give a single --seq-lens value")
    gpu = local_profile()
    print(f"# {gpu.marketing_name} ({gpu.arch}), torch {torch.__version__}")
    for seq_len in args.seq_lens:
        problem = Problem(batch=1, heads=56, seq_len=seq_len)
        if args.configs == "ladder":
            named = LADDER
        else:
            named = [(c.short(), c) for c in enumerate_space(Config, space(gpu.arch))
                     if can_implement(c, problem, gpu)[0]]
            named.insert(0, ("default", default(gpu.arch, problem)))
        named = named[args.skip:]
        ref = sdpa_ms(problem, gpu, args.reps)
        print(f"\n## S={seq_len}: SDPA bf16 cuDNN {ref if ref is None else f'{ref:.3f} ms'}\n")
        print("| config | ms | IQR ms | TFLOP/s | vs first row | vs SDPA cuDNN |")
        print("|---|---|---|---|---|---|")
        base = None
        for name, cfg in named:
            ms, iqr = timed(compile(cfg, problem, gpu.arch), problem, gpu, args.reps)
            base = base or ms
            vs_sdpa = f"{ref / ms:.2f}" if ref else "-"
            print(f"| {name} | {ms:.3f} | {iqr:.3f} | {problem.tflops(ms):.1f} | "
                  f"{base / ms:.2f} | {vs_sdpa} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
