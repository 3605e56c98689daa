"""`tuner space`: a family's space for a GPU, feasibility, and (with --compile) resources."""

from __future__ import annotations

import json
import os

from tuner.commands._args import wide_console
from tuner.errors import TunerError
from tuner.gpus import resolve_gpu
from tuner.problem import Problem
from tuner.space import compile_rows, enumerate_rows, summarize

NAME = "space"
HELP = "enumerate a family's configs for a GPU; --compile builds them for its arch (no GPU needed)"


def add_arguments(parser) -> None:
    parser.add_argument("--gpu", required=True, help="target profile, e.g. 5080, h200 (see gpus)")
    parser.add_argument(
        "--family",
        default=None,
        help="family to enumerate (default: every family that targets the arch)",
    )
    parser.add_argument("--compile", action="store_true", help="compile each feasible config")
    parser.add_argument(
        "--jobs",
        type=int,
        default=os.cpu_count() or 1,
        help="compile processes (default: CPU count)",
    )
    parser.add_argument(
        "--limit",
        type=int,
        default=None,
        help="compile at most this many feasible configs (a quick check)",
    )
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--heads", type=int, default=56)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def _families_for(arch: str, requested: str | None) -> list[str]:
    from variants import families_for_arch, load_family

    if requested is None:
        usable = families_for_arch(arch)
        if not usable:
            raise TunerError(f"no kernel family targets {arch}")
        return usable
    family = load_family(requested)
    if arch not in family.ARCHS:
        raise TunerError(
            f"family {requested} does not target {arch} (it targets {', '.join(family.ARCHS)}); "
            "pick a GPU of that arch or another family"
        )
    return [requested]


def run(args) -> int:
    gpu = resolve_gpu(args.gpu, require_local=False)
    problem = Problem(1, args.heads, args.seq_len, args.head_dim)
    rows = []
    for family in _families_for(gpu.arch, args.family):
        rows += enumerate_rows(gpu, family, problem)
    if args.compile:
        feasible = [r for r in rows if r.feasible]
        chosen = feasible[: args.limit]
        for r in feasible[len(chosen):]:
            r.reason = "not compiled (--limit)"  # still counted as feasible in the summary
        compile_rows(chosen, gpu, problem, args.jobs)
    summary = summarize(rows)
    if args.json:
        print(
            json.dumps(
                {
                    "gpu": gpu.name,
                    "arch": gpu.arch,
                    "problem": problem.to_dict(),
                    "summary": summary,
                    "configs": [r.to_dict() for r in rows],
                },
                indent=1,
            )
        )
    else:
        _print_table(gpu, rows, summary, args.compile)
    return 1 if summary["compile_errors"] else 0


def _print_table(gpu, rows, summary, compiled: bool) -> None:
    from rich.table import Table

    console = wide_console(200)
    table = Table(
        title=f"{gpu.name} ({gpu.arch}): {summary['feasible']} feasible of {summary['total']}"
    )
    for col in ("family", "config", "status", "regs", "spill B", "smem B", "mma_class",
                "compile s", "note"):
        table.add_column(col)
    shown = [r for r in rows if r.feasible] if compiled else rows
    for r in shown:
        cfg = " ".join(f"{k}={v}" for k, v in r.config.items())

        def cell(value):
            return "-" if value is None else str(value)

        table.add_row(
            r.family,
            cfg,
            r.status,
            cell(r.registers),
            cell(r.spill_bytes),
            cell(r.smem_bytes),
            cell(r.mma_class),
            cell(r.compile_s),
            r.error or r.reason or "",
        )
    console.print(table)
    console.print(f"summary: {json.dumps(summary)}")
