"""What the correctness gate costs per candidate beside timing it, on the local GPU: the family
default at a few shapes, each gate run (validate_kernel) and each timing (time_kernel) measured
warm (second call).

    python benchmarks/gate_cost.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuner.gate import validate_kernel  # noqa: E402
from tuner.gpus import PROFILES  # noqa: E402
from tuner.measure import time_kernel  # noqa: E402
from tuner.problem import Problem  # noqa: E402
from variants import wgmma  # noqa: E402

SHAPES = ((1, 8, 4097), (1, 56, 4096), (1, 56, 8192), (1, 56, 30272))


def wall(fn):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    result = fn()
    torch.cuda.synchronize()
    return result, time.perf_counter() - t0


def main() -> None:
    device = torch.device("cuda")
    print(f"gate cost, wgmma default, {torch.cuda.get_device_name()}")
    print("| B, H, S | gate s | timing s (20 launches, L2-cold) | gate share | passed |")
    print("|---|---|---|---|---|")
    for b, h, s in SHAPES:
        problem = Problem(b, h, s)
        kernel = wgmma.compile(wgmma.default("sm_90a", problem), problem, "sm_90a")
        validate_kernel(kernel, problem, device, 1)
        report, gate_s = wall(lambda k=kernel, p=problem: validate_kernel(k, p, device, 2))
        _, time_s = wall(lambda k=kernel, p=problem: time_kernel(
            k, p, device, 3, PROFILES["h200"].l2_bytes))
        print(f"| {b}, {h}, {s} | {gate_s:.3f} | {time_s:.3f} | "
              f"{gate_s / (gate_s + time_s):.0%} | {report.passed} |")


if __name__ == "__main__":
    main()
