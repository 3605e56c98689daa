"""What every suite shares: the --shapes syntax, the options common to all suites, the local GPU,
the timing of a call (CUDA events behind a GPU spin, rotated inputs, median of >= 10: the
protocol of tuner/measure.py, from its own pieces), and markdown tables.

A shape is `B,S,H,D[,causal][,kvh=N][,skv=N]`; S may list several lengths separated by '/'
("1,4096/8192,56,128" is two shapes). Each becomes a tuner.problem.Problem, whose checks name a
bad value.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

from tuner.errors import TunerError
from tuner.problem import Problem

# The shapes models run: video DiT blocks (H=56, S up to 30272), LLM-sized grids, head_dim 64,
# causal and grouped-query causal, a cross-attention over 512 text tokens.
MODEL_SHAPES = (
    "1,4096/8192/16384/30272,56,128",
    "2,4608,24,128",
    "4,1024,32,128",
    "1,30272,56,64",
    "1,8192,56,128,causal",
    "1,8192,32,128,causal,kvh=8",
    "1,75600,40,128,skv=512",
)
# A first run's shapes: one long, one host-bound, one causal.
QUICK_SHAPES = ("1,8192,56,128", "4,1024,32,128", "1,8192,56,128,causal")


def parse_shape(text: str) -> list[Problem]:
    """The Problems of one --shapes value (several when S lists lengths with '/')."""
    parts = [p.strip() for p in text.strip().split(",")]
    if len(parts) < 4 or not all(parts[:4]):
        raise TunerError(f"shape {text!r}: expected B,S,H,D[,causal][,kvh=N][,skv=N], "
                         "e.g. 1,4096/8192,56,128 or 1,8192,32,128,causal,kvh=8")
    extra = {"causal": False, "kvh": None, "skv": None}
    for part in parts[4:]:
        name, _, value = part.partition("=")
        if part == "causal":
            extra["causal"] = True
        elif name in ("kvh", "skv") and value:
            extra[name] = _int(value, f"{name} in shape {text!r}")
        else:
            raise TunerError(f"shape {text!r}: unknown field {part!r}; after B,S,H,D come "
                             "'causal', 'kvh=N' (KV heads) and 'skv=N' (key/value length)")
    batch, heads, head_dim = (_int(parts[i], f"{name} in shape {text!r}")
                              for i, name in ((0, "B"), (2, "H"), (3, "D")))
    lengths = [_int(s, f"S in shape {text!r}") for s in parts[1].split("/")]
    return [Problem(batch, heads, s, head_dim, extra["causal"], extra["skv"], extra["kvh"])
            for s in lengths]


def _int(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise TunerError(f"{what} must be an integer, got {text!r}") from None


def shape_text(problem: Problem) -> str:
    """The --shapes text of one problem (parse_shape's inverse), as tables show it."""
    text = f"{problem.batch},{problem.seq_len},{problem.heads},{problem.head_dim}"
    if problem.causal:
        text += ",causal"
    if problem.kv_heads != problem.heads:
        text += f",kvh={problem.kv_heads}"
    if problem.seq_len_kv != problem.seq_len:
        text += f",skv={problem.seq_len_kv}"
    return text


def shape_arg(text: str) -> list[Problem]:
    """argparse type of one --shapes value."""
    try:
        return parse_shape(text)
    except TunerError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_common_arguments(parser: argparse.ArgumentParser, default_shapes: Sequence[str],
                         quick_shapes: Sequence[str]) -> None:
    parser.add_argument("--shapes", nargs="+", type=shape_arg, default=None, metavar="SHAPE",
                        help="B,S,H,D[,causal][,kvh=N][,skv=N], S may be a/b/c (default: "
                        f"{' '.join(default_shapes)})")
    parser.add_argument("--quick", action="store_true",
                        help=f"a short first run (shapes {' '.join(quick_shapes)} unless "
                        "--shapes is given; the suite's other options shrink too)")
    parser.add_argument("--repeats", type=_at_least_10, default=20,
                        help="timed runs per measurement, at least 10 (default 20)")
    parser.add_argument("--seed", type=int, default=0, help="input seed (default 0)")
    parser.add_argument("--results", default=None, metavar="DIR",
                        help="directory of the results pages (default benchmarks/results)")
    parser.add_argument("--no-write", action="store_true",
                        help="print the section only; leave the results page as it is")
    parser.set_defaults(default_shapes=tuple(default_shapes), quick_shapes=tuple(quick_shapes))


def _at_least_10(text: str) -> int:
    value = int(text)
    if value < 10:
        raise argparse.ArgumentTypeError(f"must be >= 10 (a median of fewer is noise), got "
                                         f"{value}")
    return value


def sized(value, default, quick, args):
    """An option left unset (None) takes the suite's default, or its --quick value."""
    if value is not None:
        return value
    return quick if args.quick else default


def shapes_of(args) -> list[Problem]:
    """The problems a run covers: --shapes, else the quick or the default shapes."""
    if args.shapes:
        return [p for group in args.shapes for p in group]
    texts = args.quick_shapes if args.quick else args.default_shapes
    return [p for text in texts for p in parse_shape(text)]


@dataclasses.dataclass(frozen=True)
class Gpu:
    """The local GPU: its profile (tuner/gpus.py: the results page's name, arch, L2) and the
    device's own name."""

    profile: Any
    device_name: str

    @property
    def name(self) -> str:
        return self.profile.name


def local_gpu() -> Gpu:
    """The local CUDA GPU, or a TunerError saying why there is none or why it has no profile."""
    from tuner.gpus import local_profile

    profile = local_profile()
    import torch

    return Gpu(profile, torch.cuda.get_device_name())


@dataclasses.dataclass(frozen=True)
class Stat:
    median_ms: float
    iqr_ms: float


def time_calls(call: Callable[[int], Any], n_sets: int, repeats: int, warmup: int = 3) -> Stat:
    """GPU ms of call(i) (i cycles over n_sets rotated input sets): one untimed call (a first
    call may compile), warm-up, then `repeats` calls queued behind a GPU spin long enough for
    the host to queue them all (tuner.measure.queued_event_samples), so that each CUDA-event
    sample is the GPU's work, not the host's launch cost; median and IQR."""
    from tuner.measure import summarize

    med, q1, q3, _ = summarize(_queued_in_turn([call], n_sets, repeats, warmup)[0])
    return Stat(med, q3 - q1)


def time_interleaved(calls: list[Callable[[int], Any]], n_sets: int, repeats: int,
                     warmup: int = 3) -> list[float]:
    """GPU ms of each of `calls` (as time_calls' call), the calls taken in turn within one
    queued sequence, so that a clock that drifts over the sequence reaches every one of them
    alike (timed in blocks, one after another, each sees its own clocks); the median of each."""
    import statistics

    return [statistics.median(s) for s in _queued_in_turn(calls, n_sets, repeats, warmup)]


def _queued_in_turn(calls: list[Callable[[int], Any]], n_sets: int, repeats: int,
                    warmup: int) -> list[list[float]]:
    """`repeats` GPU-ms samples of each of `calls`, taken in turn: call number c is
    calls[c % len(calls)](c % n_sets). One untimed call of each (a first call may compile),
    warm-up, then the samples queued behind a GPU spin (tuner.measure.queued_event_samples)."""
    import torch

    from tuner.measure import queued_event_samples

    n = len(calls)

    def call(c):
        return calls[c % n](c % n_sets)

    for c in range(n):
        call(c)
    torch.cuda.synchronize()
    n_warm = n * max(warmup, n_sets)
    t0 = time.perf_counter()
    for c in range(n_warm):
        call(c)
    host_ms = (time.perf_counter() - t0) * 1e3 / n_warm  # queueing alone, before the sync
    torch.cuda.synchronize()
    device = torch.device("cuda", torch.cuda.current_device())
    samples = queued_event_samples(call, repeats * n, host_ms, device,
                                   sync=torch.cuda.synchronize)
    return [samples[j::n] for j in range(n)]


def input_sets(problem: Problem, l2_bytes: int, seed: int, extra_bytes: int = 0) -> list:
    """Seeded bf16 (q, k, v) sets of the problem, as many as make their total (with
    `extra_bytes` a set: the outputs, say) exceed 2x L2 when one set fits in it
    (tuner.measure.rotation_sets); standard normal, never zeros."""
    import torch

    from tuner.measure import random_inputs, rotation_sets

    q_elems = problem.batch * problem.seq_len * problem.heads * problem.head_dim
    kv_elems = problem.batch * problem.seq_len_kv * problem.kv_heads * problem.head_dim
    n = rotation_sets(2 * (q_elems + 2 * kv_elems) + extra_bytes, l2_bytes)
    device = torch.device("cuda")
    return [random_inputs(problem, device, seed + i) for i in range(n)]


def output_bytes(problem: Problem) -> int:
    """bf16 output and fp32 LSE of a call."""
    rows = problem.batch * problem.seq_len * problem.heads
    return rows * (2 * problem.head_dim + 4)


def cell(value, spec: str = ".3f") -> str:
    """A table cell: '-' for None, a number by spec, anything else as text."""
    if value is None:
        return "-"
    if isinstance(value, float | int) and not isinstance(value, bool):
        return format(value, spec)
    return str(value)


def ratio(peer_ms: float | None, ours_ms: float | None) -> str:
    """peer / ours as '1.05x' (above 1: ours is faster), '-' if either is missing."""
    if not peer_ms or not ours_ms:
        return "-"
    return f"{peer_ms / ours_ms:.2f}x"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A markdown table; each row's cells already formatted (cell()) or plain text."""
    if any(len(row) != len(headers) for row in rows):
        raise ValueError(f"every row needs {len(headers)} cells: {rows}")
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def first_line(exc: BaseException, limit: int = 120) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:limit]


# The knobs of the int8 QK^T rung (wgmma): int8 Q and K codes, which prepare writes.
INT8_QK = {"qk_dtype": "int8", "q_quant": "prepare"}


def with_knobs(cfg, **knobs):
    """cfg with these knob values, or a line saying which of them its family's Config lacks."""
    missing = [k for k in knobs if k not in {f.name for f in dataclasses.fields(cfg)}]
    if missing:
        return f"{type(cfg).__module__}.Config has no {' / '.join(missing)}"
    return dataclasses.replace(cfg, **knobs)
