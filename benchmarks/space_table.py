"""Render `tuner space --compile --json` as the markdown table of benchmarks/sm120_space.md.

  TUNER_CACHE_DIR=$(mktemp -d) tuner space --gpu 5080 --family mma_sync --compile --json > s.json
  python benchmarks/space_table.py s.json > benchmarks/sm120_space.md

A fresh cache directory makes every row a compile of this run, not an older entry.
"""

from __future__ import annotations

import json
import sys
from collections import Counter


def main(path: str) -> int:
    doc = json.loads(open(path).read())
    summary = doc["summary"]
    rows = [c for c in doc["configs"] if c["feasible"]]
    knobs = list(rows[0]["config"]) if rows else []
    spilling = [c for c in rows if (c.get("spill_bytes") or 0) > 0]
    print(f"# mma_sync on {doc['arch']} ({doc['gpu']} profile): every feasible config, compiled "
          "on a CPU\n")
    print("Command: `TUNER_CACHE_DIR=$(mktemp -d) tuner space --gpu 5080 --family mma_sync "
          "--compile --jobs 2 --json`, rendered by `benchmarks/space_table.py`\n"
          "(nvidia-cutlass-dsl 4.8.1, 2026-11-29, no GPU: fake tensors with "
          "CUTE_DSL_ARCH=sm_120a).\nRegisters per thread and spill (local-memory frame) bytes "
          "read from each cubin; smem = the\nCTA's shared memory (tiles + the DSL's static 1 KB). "
          "Nothing here was run: no sm_120 GPU exists\non this team's bench.\n")
    print(f"Summary: {summary['feasible']} feasible of {summary['total']} combinations, "
          f"{summary['compiled']} compiled, {summary['compile_errors']} compile errors; "
          f"{len(spilling)} keep a local-memory frame "
          f"({min((c['spill_bytes'] for c in spilling), default=0)}-"
          f"{max((c['spill_bytes'] for c in spilling), default=0)} B). "
          "Rejected by can_implement:\n")
    for reason, count in Counter(summary["rejected_by_reason"]).most_common():
        print(f"- {count} x `{reason}`")
    print()
    print("| " + " | ".join(knobs) + " | regs | spill B | smem B | compile s |")
    print("|" + "---|" * (len(knobs) + 4))
    for c in rows:
        values = [str(c["config"][k]) for k in knobs]
        compile_s = f"{c['compile_s']:.2f}" if c.get("compile_s") is not None else "-"
        print("| " + " | ".join(values) + f" | {c['registers']} | {c['spill_bytes']} | "
              f"{c['smem_bytes']} | {compile_s} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
