"""Is tuner.measure's prepare time the GPU's work? At small shapes the searches' prepare_ms sits on
a floor (about 0.07 ms from S=1024 to 8192 at H=56 D=64, where the work grows 8x) and the same
prepare timed 0.041 and 0.091 ms in one run. This probe times one config's prepare four ways:

  measure      tuner.measure._time_prepare, as time_kernel calls it (three times)
  long sleep   the same event loop queued behind a 100 ms GPU sleep (the host cannot catch up)
  host ms      the host time to queue one prepare call while the GPU sleeps: if prepare
               synchronized the device, this would be the sleep's length, not the launch cost
  per launch   host ms of the same calls with the GPU idle (the launch cost itself)

    python3 benchmarks/prepare_timing_probe.py [--shapes B,S,H,D;...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def probe(shape) -> dict:
    from tuner import measure
    from tuner.problem import Problem
    from variants import wgmma

    batch, seq, heads, dim = shape
    problem = Problem(batch, heads, seq, dim)
    cfg = wgmma.default("sm_90a", problem)
    kernel = wgmma.compile(cfg, problem, "sm_90a")
    device = torch.device("cuda")
    sync = measure.synchronizer(device)
    inputs = [measure.random_inputs(problem, device, seed) for seed in range(4)]
    for qkv in inputs:
        kernel.prepare(*qkv, validate=False)
    torch.cuda.synchronize()
    row = {"shape": shape, "q_quant": cfg.q_quant,
           "measure": [round(measure._time_prepare(kernel, inputs, device, sync, 20), 4)
                       for _ in range(3)]}

    def run(i):
        kernel.prepare(*inputs[i % len(inputs)], validate=False)

    torch.cuda._sleep(200_000_000)  # about 100 ms at 1.98 GHz
    t0 = time.perf_counter()
    events = measure.queue_between_events(run, 20)
    # Queueing alone: taken before the sync, which waits for the spin.
    row["host ms, GPU asleep"] = round((time.perf_counter() - t0) * 1e3 / 20, 4)
    torch.cuda.synchronize()
    row["long sleep"] = round(statistics.median(s.elapsed_time(e) for s, e in events), 4)
    t0 = time.perf_counter()
    for i in range(20):
        run(i)
    row["host ms, GPU idle"] = round((time.perf_counter() - t0) * 1e3 / 20, 4)
    torch.cuda.synchronize()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="1,1024,56,64;1,4096,56,64;1,8192,56,64;"
                        "4,1024,32,128;1,4096,56,128")
    args = parser.parse_args()
    print(f"Measured on {torch.cuda.get_device_name()}")
    for s in args.shapes.split(";"):
        print(json.dumps(probe(tuple(int(x) for x in s.split(",")))), flush=True)


if __name__ == "__main__":
    main()
