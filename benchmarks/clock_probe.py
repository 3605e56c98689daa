"""Clocks, power and throttle reasons while each system runs at one shape (issue 19: why our
kernel's speed moves between H200 machines while FA3's does not).

    python3 benchmarks/clock_probe.py [--shape B,S,H,D] [--seconds 4] [--out DIR]

Each system runs back to back for --seconds (after a second of warm-up) while `nvidia-smi`
samples the SM clock, power draw, temperature and active throttle reasons every 50 ms; the
table gives ms per call over the loop (CUDA events) beside the median of the samples. FA3 is the
fa3-fwd wheel (run with .device-fa3/env.sh); a peer that is not installed is left out.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time
from pathlib import Path

import torch
from e2e_h200 import _inputs_and_kernel, fa3, torch_per_head_fp8
from results_out import publish

QUERY = "clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active"


def sampled_run(call, seconds: float) -> dict:
    """ms per call of `call` in a loop of about `seconds`, and the nvidia-smi samples meanwhile."""
    end = time.perf_counter() + 1.0
    while time.perf_counter() < end:  # warm-up: clocks and power settle
        call()
    torch.cuda.synchronize()
    smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits",
                            "-lms", "50"], stdout=subprocess.PIPE, text=True)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    calls = 0
    start.record()
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        call()
        calls += 1
        if calls % 8 == 0:
            torch.cuda.synchronize()  # keep the host within a few calls of the GPU
    stop.record()
    torch.cuda.synchronize()
    smi.terminate()
    lines = [line.split(", ") for line in smi.communicate()[0].splitlines() if line.count(",") == 3]
    clocks = [float(c) for c, _, _, _ in lines]
    power = [float(p) for _, p, _, _ in lines]
    temps = [float(t) for _, _, t, _ in lines]
    reasons = sorted({r.strip() for _, _, _, r in lines})
    return {"ms": start.elapsed_time(stop) / calls, "calls": calls, "samples": len(lines),
            "sm_mhz": statistics.median(clocks) if clocks else None,
            "power_w": statistics.median(power) if power else None,
            "temp_c": max(temps) if temps else None, "throttle": reasons}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="1,30272,56,128")
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    shape = tuple(int(x) for x in args.shape.split(","))
    (q, k, v), best, kernel = _inputs_and_kernel(shape)
    prepared = kernel.prepare(q, k, v)
    systems = {"ours kernel": lambda: kernel.run(prepared)}
    fa3_call = fa3()
    if fa3_call is not None:
        (q8, dq), (k8, dk), (v8, dv) = (torch_per_head_fp8(x) for x in (q, k, v))
        systems["FA3 FP8 kernel"] = lambda: fa3_call(q8, k8, v8, q_descale=dq, k_descale=dk,
                                                     v_descale=dv)
    try:
        from tuner.peers import make_peer

        peer = make_peer("cudnn-fp8")
        peer_in = peer.prepare(q, k, v)
        systems["cuDNN FP8 kernel"] = lambda: peer.run(peer_in)
    except Exception:  # noqa: BLE001 - not installed here
        pass
    systems["ours kernel again"] = systems["ours kernel"]
    limits = subprocess.run(["nvidia-smi", "--query-gpu=name,power.limit,enforced.power.limit,"
                             "power.max_limit,clocks.max.sm,clocks.applications.graphics",
                             "--format=csv,noheader"], capture_output=True, text=True).stdout
    results = {name: sampled_run(call, args.seconds) for name, call in systems.items()}
    lines = [f"Measured on {torch.cuda.get_device_name()}, {time.strftime('%Y-%m-%d')}, B, S, H, "
             f"D = {shape}, ours: {best.config.short()} [{best.source}]. nvidia-smi: "
             f"{limits.strip()} (name, power limit, enforced, max, max SM clock, application "
             "clock).", "",
             "| system | ms/call | calls | SM MHz (median) | power W (median) | max temp C |"
             " throttle reasons seen |", "|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        lines.append(f"| {name} | {r['ms']:.3f} | {r['calls']} | {r['sm_mhz']} | {r['power_w']} "
                     f"| {r['temp_c']} | {' '.join(r['throttle'])} |")
    publish(args.out, "clock_probe", "\n".join(lines), results)


if __name__ == "__main__":
    main()
