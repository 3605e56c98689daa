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

from benchmarks.common import MODEL_SHAPES, QUICK_SHAPES, cell, markdown_table, ratio, shape_text

HELP = "our kernel alone on prepared FP8 inputs beside FA3 FP8 and cuDNN FP8"
DEFAULT_SHAPES = MODEL_SHAPES
QUICK_SHAPES = QUICK_SHAPES
PEERS = ("fa3-fp8", "cudnn-fp8")


def add_arguments(parser) -> None:
    parser.add_argument("--against", default=",".join(PEERS),
                        help="comma-separated systems beside ours, any of tuner bench's "
                        "--against (default, sdpa, sdpa-cudnn, sdpa-flash, cudnn-fp8, fa3-fp8); "
                        f"default {','.join(PEERS)}")


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
    from benchmarks.common import shapes_of
    from tuner.bench import bench_seq_len
    from tuner.runtime import config_for_problem

    against = _against(args.against)
    table_rows, configs, notes, others = [], [], [], []
    for problem in shapes_of(args):
        best = config_for_problem(problem)
        rows = bench_seq_len(problem, gpu.profile, against, repeats=args.repeats,
                             seed=args.seed)
        print(f"  {shape_text(problem)}: " + ", ".join(
            f"{r.system} {cell(r.median_ms)}" for r in rows), flush=True)
        ours = rows[0]
        by_system = {r.system: r for r in rows[1:]}
        others += [s for s in by_system if s not in others]
        peers = [r.median_ms for s, r in by_system.items() if s != "default" and r.median_ms]
        caller = (ours.median_ms + ours.prepare_ms
                  if ours.median_ms is not None and ours.prepare_ms is not None else None)
        table_rows.append((problem, [
            shape_text(problem), best.source, cell(ours.median_ms), cell(ours.iqr_ms),
            cell(ours.tflops, ".0f"), cell(ours.prepare_ms), cell(caller)],
            {s: r.median_ms for s, r in by_system.items()},
            ratio(min(peers) if peers else None, ours.median_ms), cell(ours.rel_rms, ".4f")))
        configs.append(f"- {shape_text(problem)}: {ours.detail}")
        notes += [f"- {shape_text(problem)} {r.system}: {r.note}" for r in rows if r.note]
    headers = ["shape", "source", "ours ms", "IQR", "TFLOP/s", "prepare ms",
               "prepare + kernel", *[f"{s} ms" for s in others], "faster peer / ours",
               "gate rel RMS"]
    body = [[*cells, *[cell(times.get(s)) for s in others], vs, rms]
            for _, cells, times, vs, rms in table_rows]
    parts = [markdown_table(headers, body), "", "Configs (tuner.attention's for each shape):",
             *configs]
    if notes:
        parts += ["", "Notes:", *notes]
    return "\n".join(parts)
