"""quant: prepare alone (the quantization and layouts tuner.attention runs before its kernel: one
launch of block amax and e4m3 cast for q, k and v) against its memory floor.

The floor is the bytes any quantization must move (each bf16 input it quantizes read once, its
e4m3 codes written once at the padded length, the fp32 block scales: one per token and head of
q, one per 64 keys of a KV head of k and v; q not at all for a config that quantizes Q in the
kernel) over the device's copy bandwidth, measured in the same run (a device-to-device copy of
1 GiB, read and write counted). prepare is timed as the runtime calls it (validate=False) with
the config tuner.attention runs, CUDA events behind a GPU spin, inputs rotated past 2x L2.

--transforms adds a row per setting of prepare's exact transforms (K smoothing, the Q/K
rotation: plain, smoothed, rotated, both, as the accuracy suite sets them), with its time over
plain's from the same run, so that what a transform costs in prepare is read off beside the
floor. Smoothing's time includes its mean launch (variants/key_mean_kernel.py).
"""

from __future__ import annotations

from benchmarks import common
from benchmarks.common import cell, markdown_table, shape_text

HELP = "prepare (the quantization) alone against its memory floor"
DEFAULT_SHAPES = common.MODEL_SHAPES
QUICK_SHAPES = common.QUICK_SHAPES
KEYS_PER_SCALE = 64  # k's and v's block scales (variants/block_scales.py)


def add_arguments(parser) -> None:
    parser.add_argument("--transforms", action="store_true",
                        help="also time prepare with K smoothing and the Q/K rotation off and on "
                        "(the accuracy suite's settings: plain, smoothed, rotated, both), each "
                        "against plain in the same run")


def settings(cfg, transforms: bool) -> list[tuple[str, object]]:
    """(label, config or why not) of the rows of one shape: the config as tuner.attention runs
    it, then with --transforms each of the accuracy suite's settings of its transforms."""
    from benchmarks.accuracy import SETTINGS, with_setting

    rows = [("as run", cfg)]
    if transforms:
        rows += [(name, with_setting(cfg, name)) for name in SETTINGS]
    return rows


def floor_bytes(problem, padded: int, padded_kv: int, q_in_kernel: bool = False) -> int:
    """Bytes prepare must move: bf16 read + e4m3 write (padded) + fp32 scales, q's left out
    when the kernel quantizes Q itself."""
    b, d = problem.batch, problem.head_dim
    kv = 2 * (2 * b * problem.seq_len_kv * problem.kv_heads * d + b * padded_kv * problem.kv_heads
              * d + 4 * b * problem.kv_heads * -(-padded_kv // KEYS_PER_SCALE))
    q = 2 * b * problem.seq_len * problem.heads * d + b * padded * problem.heads * d \
        + 4 * b * problem.heads * padded
    return kv + (0 if q_in_kernel else q)


def copy_bandwidth(repeats: int) -> float:
    """Bytes per second of a device-to-device copy of 1 GiB (read + write counted)."""
    import torch

    src = torch.empty(1 << 29, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    ms = common.time_calls(lambda i: dst.copy_(src), 1, repeats).median_ms
    return 2 * src.numel() * src.element_size() / (ms * 1e-3)


def run(args, gpu) -> str:
    from tuner.runtime import config_for_problem
    from variants import load_family

    bandwidth = copy_bandwidth(args.repeats)
    rows = []
    for problem in common.shapes_of(args):
        best = config_for_problem(problem)
        sets = common.input_sets(problem, gpu.profile.l2_bytes, args.seed)
        plain_ms = None
        for label, cfg in settings(best.config.for_q_dtype("bfloat16"), args.transforms):
            if isinstance(cfg, str):
                print(f"  {shape_text(problem)} {label}: {cfg}", flush=True)
                rows.append([shape_text(problem), best.source, label, *[None] * 9])
                continue
            kernel = load_family(best.family).compile(cfg, problem, gpu.profile.arch)
            prepared = kernel.prepare(*sets[0], validate=False)
            stat = common.time_calls(
                lambda i, s=sets, kn=kernel: kn.prepare(*s[i % len(s)], validate=False),
                len(sets), args.repeats)
            plain_ms = stat.median_ms if label == "plain" else plain_ms
            moved = floor_bytes(problem, prepared.padded_len, prepared.padded_len_kv,
                                cfg.q_in_kernel)
            floor_ms = moved / bandwidth * 1e3
            print(f"  {shape_text(problem)} {label}: {stat.median_ms:.4f} ms, floor "
                  f"{floor_ms:.4f}", flush=True)
            rows.append([shape_text(problem), best.source, label,
                         " ".join(cfg.transforms_on()) or "none",
                         "kernel" if cfg.q_in_kernel else "prepare",
                         cell(stat.median_ms, ".4f"), cell(stat.iqr_ms, ".4f"),
                         cell(moved / 1e6, ".1f"), cell(floor_ms, ".4f"),
                         cell(stat.median_ms / floor_ms, ".2f"),
                         cell(moved / (stat.median_ms * 1e-3) / 1e9, ".0f"),
                         cell(stat.median_ms / plain_ms, ".3f") if plain_ms else None])
    return "\n".join([
        f"Copy bandwidth (device to device, read + write): {bandwidth / 1e12:.2f} TB/s.", "",
        markdown_table(["shape", "source", "setting", "transforms", "Q quantized in",
                        "prepare ms", "IQR", "floor MB", "floor ms", "prepare / floor", "GB/s",
                        "/ plain"], rows)])
