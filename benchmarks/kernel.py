"""kernel: our kernel alone on prepared FP8 inputs beside FA3's FP8 forward (per-(batch, KV head)
descales) and cuDNN's FP8 SDPA (per-tensor descales, FP8 output), where installed.

Ours is the config tuner.attention runs for the shape (tuner.runtime.config_for_problem: the
results database, the shipped table, else the family default), checked by the correctness gate
first. Every system is timed by `tuner bench`'s own code (tuner.bench.bench_seq_len, i.e.
tuner.measure.time_kernel): fresh random inputs, L2-cold rotation, calls queued behind a GPU
spin, median of --repeats CUDA-event samples. TFLOP/s count the visible (query, key) pairs
(causal: half the square). ratio = the faster peer's ms / ours (above 1: ours is faster);
prepare is what a caller of our kernel pays before it (quantization and layouts).
"""

from __future__ import annotations

from benchmarks import common
from benchmarks.common import cell, markdown_table, ratio, shape_text

HELP = "our kernel alone on prepared FP8 inputs beside FA3 FP8 and cuDNN FP8"
DEFAULT_SHAPES = common.MODEL_SHAPES
QUICK_SHAPES = common.QUICK_SHAPES
PEERS = ("fa3-fp8", "cudnn-fp8")
# Systems of --against that are our own kernels: columns, but not peers of the ratio.
OURS = ("default", "head-scales")


def add_arguments(parser) -> None:
    parser.add_argument("--against", default=",".join(PEERS),
                        help="comma-separated systems beside ours, any of tuner bench's "
                        "--against (default, head-scales, sdpa, sdpa-cudnn, sdpa-flash, "
                        f"cudnn-fp8, fa3-fp8); default {','.join(PEERS)}")


def _against(text: str) -> list[str]:
    from tuner.bench import AGAINST
    from tuner.errors import TunerError

    names = [a.strip() for a in text.split(",") if a.strip()]
    unknown = [a for a in names if a not in AGAINST]
    if unknown:
        raise TunerError(f"--against: unknown {', '.join(unknown)}; choose from "
                         f"{', '.join(AGAINST)}")
    return names


def run(args, gpu) -> str:
    from tuner.bench import bench_seq_len
    from tuner.runtime import config_for_problem

    against = _against(args.against)
    measured, configs, notes = [], [], []
    for problem in common.shapes_of(args):
        rows = bench_seq_len(problem, gpu.profile, against, repeats=args.repeats,
                             seed=args.seed)
        print(f"  {shape_text(problem)}: " + ", ".join(
            f"{r.system} {cell(r.median_ms)}" for r in rows), flush=True)
        measured.append((problem, config_for_problem(problem).source, rows))
        configs.append(f"- {shape_text(problem)}: {rows[0].detail}")
        notes += [f"- {shape_text(problem)} {r.system}: {r.note}" for r in rows if r.note]
    return "\n".join([format_table(measured), "", "Configs (what tuner.attention runs):",
                      *configs, *(["", "Notes:", *notes] if notes else [])])


def format_table(measured) -> str:
    """One row per shape: ours (the first of tuner bench's rows), then the other systems."""
    others: list[str] = []
    for _, _, rows in measured:
        others += [r.system for r in rows[1:] if r.system not in others]
    body = []
    for problem, source, rows in measured:
        ours, by_system = rows[0], {r.system: r for r in rows[1:]}
        peers = [r.median_ms for s, r in by_system.items() if s not in OURS and r.median_ms]
        caller = (ours.median_ms + ours.prepare_ms
                  if ours.median_ms is not None and ours.prepare_ms is not None else None)
        body.append([shape_text(problem), source, cell(ours.median_ms), cell(ours.iqr_ms),
                     cell(ours.tflops, ".0f"), cell(ours.prepare_ms), cell(caller),
                     *[cell(by_system[s].median_ms if s in by_system else None) for s in others],
                     ratio(min(peers) if peers else None, ours.median_ms),
                     cell(ours.rel_rms, ".4f")])
    return markdown_table(["shape", "source", "ours ms", "IQR", "TFLOP/s", "prepare ms",
                           "prepare + kernel", *[f"{s} ms" for s in others],
                           "faster peer / ours", "gate rel RMS"], body)
