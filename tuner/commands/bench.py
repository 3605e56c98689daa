"""`tuner bench`: the stored winner, the family default and peers, side by side on this GPU."""

from __future__ import annotations

import datetime as dt
import json

from tuner.commands._args import (
    add_problem_arguments,
    add_shape_arguments,
    at_least,
    name_list,
    problems_from_args,
)

NAME = "bench"
HELP = "time the tuned config, the default and peers (SDPA, cuDNN FP8) side by side"


def add_arguments(parser) -> None:
    parser.add_argument("--gpu", default="auto", help="must be the local GPU (default: auto)")
    add_problem_arguments(parser, seq_lens_example="4096,30272", heads_default=56)
    add_shape_arguments(parser)
    parser.add_argument(
        "--against",
        type=name_list("default,sdpa"),
        default="default,sdpa",
        help="comma-separated: default, head-scales (the tuned config with one K/V scale per "
        "head), sdpa (cuDNN + flash backends), sdpa-cudnn, sdpa-flash, cudnn-fp8, fa3-fp8 "
        "(FlashAttention-3 FP8 where installed)",
    )
    parser.add_argument("--repeats", type=at_least(10), default=20,
                        help="timed launches per system and seq_len, at least 10 (default 20)")
    parser.add_argument("--db", default=None, help="results database URL")
    parser.add_argument("--plot", default=None, help="write TFLOP/s vs seq_len to this image")
    parser.add_argument("--markdown", default=None, help="also write the table as markdown")
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def run(args) -> int:
    from tuner.bench import AGAINST, bench_seq_len, markdown_table, store_peer_rows
    from tuner.errors import TunerError
    from tuner.gpus import device_fingerprint, fingerprint_id, resolve_gpu
    from tuner.store import Store

    problems = problems_from_args(args)
    against = [a.strip() for a in args.against.split(",") if a.strip()]
    unknown = [a for a in against if a not in AGAINST]
    if unknown:
        raise TunerError(f"--against: unknown {', '.join(unknown)}; choose from "
                         f"{', '.join(AGAINST)}")
    gpu = resolve_gpu(args.gpu)
    fp = device_fingerprint()
    device_id = fingerprint_id(fp)
    store = Store(args.db)
    rows = []
    try:
        store.record_device(device_id, fp)
        for problem in problems:
            found = bench_seq_len(problem, gpu, against, repeats=args.repeats, db=args.db)
            store_peer_rows(store, device_id, problem, found)
            rows += found
    finally:
        store.close()
    label = (
        f"{fp['name']} ({dt.date.today().isoformat()}), B={args.batch} H={args.heads} "
        f"D={args.head_dim}" + _shape_label(args)
    )
    table = markdown_table(rows, label)
    if args.markdown:
        with open(args.markdown, "w") as fh:
            fh.write(table + "\n")
    if args.plot:
        from tuner.report import plot_bench

        plot_bench(rows, args.plot, label)
    if args.json:
        print(json.dumps({"device": fp, "rows": [r.to_dict() for r in rows]}, indent=1))
    else:
        print(table)
    return 0


def _shape_label(args) -> str:
    parts = []
    if args.kv_len is not None:
        parts.append(f"Skv={args.kv_len}")
    if args.kv_heads is not None and args.kv_heads != args.heads:
        parts.append(f"Hkv={args.kv_heads}")
    if args.causal:
        parts.append("causal")
    return "".join(f" {p}" for p in parts)
