"""Render `tuner space --compile --json` of one family as a markdown table (how
benchmarks/sm120_space.md was made):

  export TUNER_CACHE_DIR=$(mktemp -d)
  for g in 5080 5090 pro6000; do
    tuner space --gpu $g --family mma_sync --compile --jobs 2 --json > s$g.json
  done
  python benchmarks/space_table.py s5080.json s5090.json spro6000.json \
      --command "<the command above>" > benchmarks/sm120_space.md

A fresh cache directory makes every row of the first GPU a compile of this run, not an older
entry; GPUs of the same arch share those builds (the cache key has no GPU in it), so the later
runs only re-check feasibility and disassemble. The first JSON is rendered in full; each further
one is compared with it row by row and rendered in full only where it differs.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RESULT_KEYS = ("config", "feasible", "registers", "spill_bytes", "smem_bytes", "mma_class",
               "error")


def _commit() -> str:
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _table(doc: dict) -> list[str]:
    summary = doc["summary"]
    rows = [c for c in doc["configs"] if c["feasible"]]
    knobs = list(rows[0]["config"]) if rows else []
    spilling = [c for c in rows if (c.get("spill_bytes") or 0) > 0]
    lines = [f"Summary: {summary['feasible']} feasible of {summary['total']} combinations, "
             f"{summary['compiled']} compiled, {summary['compile_errors']} compile errors; "
             f"{len(spilling)} keep a local-memory frame "
             f"({min((c['spill_bytes'] for c in spilling), default=0)}-"
             f"{max((c['spill_bytes'] for c in spilling), default=0)} B). MMA classes in the "
             "SASS:", ""]
    for cls, count in Counter(c.get("mma_class") or "not disassembled" for c in rows).most_common():
        lines.append(f"- {count} x `{cls}`")
    lines += ["", "Rejected by can_implement:", ""]
    for reason, count in Counter(summary["rejected_by_reason"]).most_common():
        lines.append(f"- {count} x `{reason}`")
    lines += ["", "| " + " | ".join(knobs) + " | regs | spill B | smem B | mma_class | compile s |",
              "|" + "---|" * (len(knobs) + 5)]
    for c in rows:
        values = [str(c["config"][k]) for k in knobs]
        compile_s = f"{c['compile_s']:.2f}" if c.get("compile_s") is not None else "-"
        lines.append("| " + " | ".join(values) + f" | {c['registers']} | {c['spill_bytes']} | "
                     f"{c['smem_bytes']} | {c.get('mma_class') or '-'} | {compile_s} |")
    return lines


def _same_results(a: dict, b: dict) -> bool:
    def key(doc):
        return [tuple(json.dumps(c.get(k), sort_keys=True) for k in RESULT_KEYS)
                for c in doc["configs"]]
    return a["arch"] == b["arch"] and key(a) == key(b)


def main() -> int:
    from variants.build import dsl_version

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json_files", nargs="+", help="`tuner space --json` outputs, one per GPU")
    ap.add_argument("--command", default="tuner space ... --compile --json",
                    help="the command that produced the JSON, for the header")
    ap.add_argument("--commit", default=None,
                    help="the commit the JSON was produced at (default: this checkout's HEAD)")
    ap.add_argument("--note", default=None, help="a paragraph for after the header")
    args = ap.parse_args()
    docs = [json.loads(Path(f).read_text()) for f in args.json_files]
    first = docs[0]
    families = sorted({c["family"] for d in docs for c in d["configs"]})
    if len(families) > 1:
        ap.error(f"one family per table, got {families}: run `tuner space --family F`")
    family = families[0] if families else "?"
    gpus = ", ".join(d["gpu"] for d in docs)
    print(f"# {family} on {first['arch']} ({gpus}): every feasible config, compiled without a "
          "GPU\n")
    print(f"Command: `{args.command}`, rendered by `benchmarks/space_table.py`\n"
          f"(nvidia-cutlass-dsl {dsl_version()}, commit {args.commit or _commit()}, "
          f"{datetime.date.today()}, "
          f"fake tensors with CUTE_DSL_ARCH={first['arch']}).\n"
          "Registers per thread and spill (local-memory frame) bytes read from each cubin; smem = "
          "the\nCTA's shared memory (tiles + the DSL's static 1 KB); mma_class = the MMA opcodes "
          "in the cubin's SASS\n(nvdisasm), each less its shape and E4M3 operand types, with its "
          "count: `QMMA.F32` FP8 with FP32\naccumulate, `QMMA.F16` FP8 with FP16 accumulate "
          "(pv_accum=fp16: P @ V), `QMMA.SF.F32.E8` block-scaled\nMXF8 with UE8M0 scales "
          "(mma=mxf8). Published GeForce Blackwell rates (FlashInfer SM120 RFC #3628 / PR\n"
          "#4149, RTX 5060 Ti and 5090): QMMA.F32 at half rate (~506 TFLOP/s on a 5090), the "
          "other two at full\nrate (~993). Nothing here was run on a GPU and no sm_120 time is "
          "claimed: mma=mxf8 is only\ncompile-checked (the search's gate validates it on the first "
          "real sm_120 GPU); pv_accum=fp16 is\nchecked on the H200 by "
          "tests/gpu/test_mma_sync_gpu.py (ptxas emulates it there with f16 HMMA),\nnot on any "
          "sm_120 GPU.\n")
    if args.note:
        print(args.note + "\n")
    print("\n".join(_table(first)))
    for doc in docs[1:]:
        print()
        if _same_results(first, doc):
            print(f"## {doc['gpu']}\n\nSame arch and per-block shared memory as {first['gpu']}: "
                  "the same feasible configs, each with the same build\n(registers, spills, "
                  f"shared memory, mma_class), row for row; see the {first['gpu']} table above.")
        else:
            print(f"## {doc['gpu']}\n")
            print("\n".join(_table(doc)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
