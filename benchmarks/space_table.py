"""Render `tuner space --compile --json` of one family as a markdown table (how
benchmarks/sm120_space.md was made):

  TUNER_CACHE_DIR=$(mktemp -d) tuner space --gpu 5080 --family mma_sync --compile --jobs 2 \
      --json > s.json
  python benchmarks/space_table.py s.json --command "<the command above>" > sm120_space.md

A fresh cache directory makes every row a compile of this run, not an older entry.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    from variants.build import dsl_version

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json_file")
    ap.add_argument("--command", default="tuner space ... --compile --json",
                    help="the command that produced the JSON, for the header")
    args = ap.parse_args()
    doc = json.loads(Path(args.json_file).read_text())
    summary = doc["summary"]
    rows = [c for c in doc["configs"] if c["feasible"]]
    families = sorted({c["family"] for c in rows})
    if len(families) > 1:
        ap.error(f"one family per table, got {families}: run `tuner space --family F`")
    knobs = list(rows[0]["config"]) if rows else []
    spilling = [c for c in rows if (c.get("spill_bytes") or 0) > 0]
    family = families[0] if families else "?"
    print(f"# {family} on {doc['arch']} ({doc['gpu']} profile): every feasible config, "
          "compiled without a GPU\n")
    print(f"Command: `{args.command}`, rendered by `benchmarks/space_table.py`\n"
          f"(nvidia-cutlass-dsl {dsl_version()}, {datetime.date.today()}, fake tensors with "
          f"CUTE_DSL_ARCH={doc['arch']}).\nRegisters per thread and spill (local-memory frame) "
          "bytes read from each cubin; smem = the\nCTA's shared memory (tiles + the DSL's "
          "static 1 KB). Nothing here was run on a GPU.\n")
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
    raise SystemExit(main())
