"""Where a short-KV cross-attention's time goes (issue 17): the kernel at one query length and
head count over key/value lengths of 1 to 16 strips, with cuDNN FP8 beside it on the same inputs.
A least-squares line through (strips a tile visits, ms) splits our time into a part per strip
(the QK/softmax/PV work) and a fixed part per launch and tile (Q load, pipeline fill and drain,
epilogue), which is what a 4-strip problem like 75600 x 512 spends its time on.

    python3 benchmarks/cross_scaling_h200.py [--out DIR]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from e2e_h200 import median_ms
from results_out import measure_each, publish
from shapes_h200 import inputs_and_kernel

QUERIES = [(1, 75600, 40), (2, 4608, 24)]  # (batch, seq_len_q, heads)
KV_LENS = [128, 256, 512, 1024, 2048]


def measure(batch, seq, heads, seq_kv) -> dict:
    from tuner.peers import make_peer
    from tuner.problem import Problem

    problem = Problem(batch, heads, seq, seq_len_kv=seq_kv)
    (q, k, v), best, kernel, prepared = inputs_and_kernel(problem)
    row = {"shape": (batch, seq, heads, seq_kv), "strips": -(-seq_kv // best.config.block_n),
           "tiles": batch * heads * -(-seq // best.config.block_m), "ms": {}}
    row["ms"]["ours"] = median_ms(lambda: kernel.run(prepared))
    try:
        peer = make_peer("cudnn-fp8", problem)
        peer_in = peer.prepare(q, k, v)
        row["ms"]["cuDNN FP8"] = median_ms(lambda: peer.run(peer_in))
    except Exception as exc:  # noqa: BLE001 - a peer missing or refusing the shape
        row["skipped"] = str(exc).splitlines()[0][:160]
    return row


def fit(rows, system: str):
    """(ms per strip, fixed ms) of the least-squares line through (strips, ms)."""
    pts = [(r["strips"], r["ms"][system]) for r in rows if system in r["ms"]]
    if len(pts) < 2:
        return None
    n = len(pts)
    mx, my = sum(x for x, _ in pts) / n, sum(y for _, y in pts) / n
    slope = (sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts))
    return slope, my - slope * mx


def table(rows, device: str) -> str:
    lines = [f"Measured on {device}, {time.strftime('%Y-%m-%d')}: kernel alone, ms, median of 20.",
             "", "| B, Sq, H, Skv | strips a tile | ours | cuDNN FP8 | cuDNN / ours |",
             "|---|---|---|---|---|"]
    for r in rows:
        ours, peer = r["ms"]["ours"], r["ms"].get("cuDNN FP8")
        lines.append(f"| {', '.join(map(str, r['shape']))} | {r['strips']} | {ours:.3f} | "
                     + (f"{peer:.3f} | {peer / ours:.2f}x |" if peer else "- | - |"))
    lines.append("")
    for query in QUERIES:
        group = [r for r in rows if tuple(r["shape"][:3]) == query]
        for system in ("ours", "cuDNN FP8"):
            line = fit(group, system)
            if line:
                per_strip, fixed = line
                lines.append(f"- B={query[0]} Sq={query[1]} H={query[2]}, {system}: "
                             f"{per_strip:.4f} ms a strip + {fixed:.4f} ms fixed "
                             f"({group[0]['tiles']} tiles of 128 rows)")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    shapes = [(*query, seq_kv) for query in QUERIES for seq_kv in KV_LENS]
    # The untimed warm-up on the small query shape (the first shape is the 75600-token one).
    rows = measure_each(shapes, lambda shape: measure(*shape), warmup=(*QUERIES[1], KV_LENS[0]))
    md = table(rows, torch.cuda.get_device_name())
    publish(args.out, "cross_scaling_h200", md, rows)


if __name__ == "__main__":
    main()
