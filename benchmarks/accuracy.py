"""accuracy: relative RMS error against fp32 attention on the original inputs
(variants.reference.end_to_end_error: FP8 quantization included) for the synthetic activation
kinds of tuner/activations.py, with prepare's exact transforms off and on, beside the peers.

Columns: ours with the config tuner.attention runs for the shape, the transforms set by
Config.with_transforms (Q quantized in prepare where it is rotated): plain (k_smoothing="off",
qk_rotation="none"), smoothed (k_smoothing="mean"), rotated (qk_rotation="hadamard"), both;
both with P.V in bf16 (wgmma pv_dtype="bf16", the rung below FP8's floor), and that with
QK^T in int8 too (qk_dtype="int8", Q quantized in prepare: the lower rung); the default
(tuner.attention as it is, whatever its config turns on); FA3 FP8 with per-(batch, KV head)
descales, SDPA bf16 (cuDNN) and SageAttention 1 (fp16 in) where installed. Rows: every
--kinds kind at every --shapes shape, then --cases (kind@shape: by default "realistic"
causal and "k_bias_8" on 32 query heads over 8 KV heads).

Then the transforms' cost: tuner.attention end to end from bf16 (GPU time, as the e2e suite
times it) with each setting at --cost-shapes, against plain in rounds that take the settings
in turn call by call (ratios taken within a round, since clocks drift within a run by more
than a transform costs); and
the smoothing vector from the full mean (torch) and from the sampled mean (prepare's: the mean
kernel, variants/key_mean_kernel.py).
"""

from __future__ import annotations

import dataclasses

from benchmarks import common
from benchmarks.common import cell, markdown_table, shape_text

HELP = "rel RMS against fp32 per activation kind, K smoothing / Q-K rotation off and on; cost"
DEFAULT_SHAPES = ("1,4096,8,128",)
QUICK_SHAPES = DEFAULT_SHAPES
KINDS = ("randn", "k_bias_8", "k_bias_20", "outliers", "qk_biased", "v_bias")
QUICK_KINDS = ("randn", "k_bias_8", "outliers")
CASES = ("realistic@1,4096,8,128,causal", "k_bias_8@1,4096,32,128,kvh=8")
COST_SHAPES = ("1,4096/8192/30272,56,128",)
QUICK_COST_SHAPES = ("1,8192,56,128",)
COST_ROUNDS, QUICK_COST_ROUNDS = 7, 3
# Column -> (k_smoothing, qk_rotation).
SETTINGS = {"plain": ("off", "none"), "smoothed": ("mean", "none"),
            "rotated": ("off", "hadamard"), "both": ("mean", "hadamard")}
PEER_COLUMNS = ("FA3 FP8", "SDPA bf16", "Sage")
PV16_COLUMN = "both, bf16 P.V"
QK8_COLUMN = "both, int8 QK, bf16 P.V"


def add_arguments(parser) -> None:
    parser.add_argument("--kinds", nargs="+", default=None, metavar="KIND",
                        help=f"activation kinds (default {' '.join(KINDS)}; --quick "
                        f"{' '.join(QUICK_KINDS)})")
    parser.add_argument("--cases", nargs="*", default=list(CASES), metavar="KIND@SHAPE",
                        help=f"extra rows (default {' '.join(CASES)}; none: --cases)")
    parser.add_argument("--cost-shapes", nargs="*", type=common.shape_arg, default=None,
                        metavar="SHAPE", help=f"shapes of the cost table (default "
                        f"{' '.join(COST_SHAPES)}; --quick {' '.join(QUICK_COST_SHAPES)}; "
                        "none: --cost-shapes)")
    parser.add_argument("--cost-rounds", type=int, default=None, metavar="N",
                        help=f"interleaved rounds of the cost table, ratios taken within a "
                        f"round (default {COST_ROUNDS}; --quick {QUICK_COST_ROUNDS})")


def parse_case(text: str) -> tuple[str, list]:
    """'kind@B,S,H,D[,...]' -> (kind, problems); the kind checked against tuner.activations."""
    from tuner.activations import kind
    from tuner.errors import TunerError

    name, at, shape = text.partition("@")
    if not at:
        raise TunerError(f"case {text!r}: expected KIND@SHAPE, e.g. realistic@1,4096,8,128,causal")
    try:
        kind(name)
    except ValueError as exc:
        raise TunerError(f"case {text!r}: {exc}") from None
    return name, common.parse_shape(shape)


def with_setting(cfg, setting: str):
    """The config with the column's transforms, or why it cannot have them."""
    names = {f.name for f in dataclasses.fields(cfg)}
    if not {"k_smoothing", "qk_rotation"} <= names:
        return f"{type(cfg).__module__}.Config has no k_smoothing / qk_rotation knobs"
    smoothing, rotation = SETTINGS[setting]
    return cfg.with_transforms(k_smoothing=smoothing, qk_rotation=rotation)


def with_pv16(cfg):
    """The config with both transforms and P.V in bf16, or why it cannot have them."""
    both = with_setting(cfg, "both")
    return both if isinstance(both, str) else common.with_knobs(both, pv_dtype="bf16")


def with_qk8(cfg):
    """with_pv16's config with QK^T in int8 (Q quantized by prepare), or why it cannot have it."""
    pv16 = with_pv16(cfg)
    return pv16 if isinstance(pv16, str) else common.with_knobs(pv16, **common.INT8_QK)


def _rows(args) -> list[tuple[str, object]]:
    from tuner.activations import kind

    kinds = args.kinds or (QUICK_KINDS if args.quick else KINDS)
    for name in kinds:
        try:
            kind(name)
        except ValueError as exc:
            from tuner.errors import TunerError

            raise TunerError(f"--kinds: {exc}") from None
    rows = [(name, p) for name in kinds for p in common.shapes_of(args)]
    for text in args.cases:
        name, problems = parse_case(text)
        rows += [(name, p) for p in problems]
    return rows


def _errors(kind_name: str, problem, seed: int) -> tuple[dict, str]:
    """column -> rel RMS (or why not), and the default config's transforms."""
    import tuner
    from benchmarks.systems import bf16_peers, fa3_fp8, native
    from tuner.activations import activations
    from tuner.errors import PeerUnavailable, TunerError
    from tuner.runtime import config_for_problem
    from variants.reference import end_to_end_error

    q, k, v = activations(kind_name, problem, "cuda", seed)
    base = config_for_problem(problem).config
    calls = {}
    for setting in SETTINGS:
        cfg = with_setting(base, setting)
        calls[setting] = cfg if isinstance(cfg, str) else (
            lambda c=cfg: tuner.attention(q, k, v, causal=problem.causal, config=c))
    for column, rung in ((PV16_COLUMN, with_pv16), (QK8_COLUMN, with_qk8)):
        cfg = rung(base)
        calls[column] = cfg if isinstance(cfg, str) else (
            lambda c=cfg: tuner.attention(q, k, v, causal=problem.causal, config=c))
    calls["default"] = lambda: tuner.attention(q, k, v, causal=problem.causal)
    try:
        fa3 = fa3_fp8(problem)
        calls["FA3 FP8"] = lambda: fa3(q, k, v)
    except PeerUnavailable as exc:
        calls["FA3 FP8"] = str(exc)
    for name, call in bf16_peers(problem, ("SDPA bf16", "Sage")).items():
        calls[name] = call if isinstance(call, str) else (
            lambda c=call, n=name: c(*native(n, (q, k, v))))
    errors = {}
    for name, call in calls.items():
        if isinstance(call, str):
            errors[name] = call
            continue
        try:
            errors[name] = end_to_end_error(call(), q, k, v, causal=problem.causal)
        except TunerError as exc:  # a config that cannot run the shape: named, not timed
            errors[name] = f"refused: {common.first_line(exc)}"
        except Exception as exc:  # noqa: BLE001 - a peer failing is a note; ours propagates
            if name in SETTINGS or name in ("default", PV16_COLUMN, QK8_COLUMN):
                raise
            errors[name] = f"failed: {common.first_line(exc)}"
    knobs = "/".join(str(getattr(base, n, "-")) for n in ("k_smoothing", "qk_rotation"))
    return errors, knobs


def _cost(problem, gpu, args) -> list:
    """ms of tuner.attention per setting, and of the two smoothing vectors, at one shape.

    The settings are timed in --cost-rounds rounds (the order rotating each round), each round
    one queued sequence that takes the settings in turn call by call (common.time_interleaved),
    and each ratio is taken within its round: clocks drift by a few percent within a run, more
    than a transform costs, so only calls side by side compare. Cells: median ms over rounds,
    then the median ratio against plain and its range over rounds."""
    import statistics

    import torch

    import tuner
    from tuner.runtime import config_for_problem
    from variants.prepare import mean_launcher, smoothing_vector_on_gpu
    from variants.transforms import smoothing_vector

    sets = common.input_sets(problem, gpu.profile.l2_bytes, args.seed,
                             common.output_bytes(problem))
    base = config_for_problem(problem).config
    configs = {s: with_setting(base, s) for s in SETTINGS}
    runnable = [s for s, c in configs.items() if not isinstance(c, str)]
    rounds = common.sized(args.cost_rounds, COST_ROUNDS, QUICK_COST_ROUNDS, args)
    ms = {s: [] for s in runnable}
    for r in range(rounds):
        order = runnable[r % len(runnable):] + runnable[:r % len(runnable)]
        medians = common.time_interleaved(
            [lambda i, c=configs[s]: tuner.attention(*sets[i], causal=problem.causal, config=c)
             for s in order], len(sets), args.repeats)
        for setting, median in zip(order, medians, strict=True):
            ms[setting].append(median)
    full = common.time_calls(lambda i: smoothing_vector(sets[i % len(sets)][1], sample_keys=None),
                             len(sets), args.repeats).median_ms
    k = sets[0][1]  # the sampled mean as prepare takes it: the mean kernel, torch.mean without
    launch = mean_launcher(k)
    m = torch.empty((k.shape[0], k.shape[2], k.shape[3]), dtype=torch.float32, device=k.device)
    sampled = common.time_calls(
        (lambda i: smoothing_vector_on_gpu(launch, sets[i % len(sets)][1], m)) if launch
        else (lambda i: smoothing_vector(sets[i % len(sets)][1])), len(sets),
        args.repeats).median_ms
    cells = []
    for setting in SETTINGS:
        if setting not in ms:
            cells.append("-")
            continue
        text = cell(statistics.median(ms[setting]))
        if "plain" in ms and setting != "plain":
            ratios = [a / b for a, b in zip(ms[setting], ms["plain"], strict=True)]
            text += (f" ({statistics.median(ratios):.3f}x, "
                     f"{min(ratios):.3f}-{max(ratios):.3f})")
        cells.append(text)
    return [shape_text(problem), *cells, cell(full, ".4f"), cell(sampled, ".4f")]


def run(args, gpu) -> str:
    rows = []
    columns = [*SETTINGS, PV16_COLUMN, QK8_COLUMN, "default", *PEER_COLUMNS]
    notes = set()
    for kind_name, problem in _rows(args):
        errors, knobs = _errors(kind_name, problem, args.seed)
        print(f"  {kind_name} {shape_text(problem)}: " + ", ".join(
            f"{c} {cell(errors[c], '.4f')}" for c in columns if not isinstance(errors[c], str)),
            flush=True)
        cells = []
        for c in columns:
            if isinstance(errors[c], str):
                notes.add(f"- {c}: {errors[c]}")
                cells.append("-")
            else:
                cells.append(cell(errors[c], ".4f"))
        rows.append([kind_name, shape_text(problem), *cells, knobs])
    parts = [markdown_table(["kind", "shape", *columns, "default's smoothing/rotation"], rows)]
    if notes:
        parts += ["", "Not measured:", *sorted(notes)]
    cost_shapes = ([p for g in args.cost_shapes for p in g] if args.cost_shapes is not None
                   else [p for t in (QUICK_COST_SHAPES if args.quick else COST_SHAPES)
                         for p in common.parse_shape(t)])
    if cost_shapes:
        cost = [_cost(p, gpu, args) for p in cost_shapes]
        parts += ["", "The transforms' cost: tuner.attention from bf16, GPU ms, the median of "
                  "interleaved rounds (the median ratio against plain in its round, and the "
                  "range over rounds); the smoothing vector from the full mean and from the "
                  "sampled mean, ms.", "",
                  markdown_table(["shape", *SETTINGS, "full mean", "sampled mean"], cost)]
    return "\n".join(parts)
