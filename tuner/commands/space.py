"""`tuner space`: a family's space for a GPU, feasibility, and (with --compile) resources."""

from __future__ import annotations

import contextlib
import json
import os

from tuner.commands._args import (
    add_shape_arguments,
    at_least,
    dimension,
    problem_from_args,
    wide_console,
)
from tuner.errors import TunerError
from tuner.gpus import resolve_gpu
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
    parser.add_argument("--jobs", type=at_least(1), default=os.cpu_count() or 1,
                        help="compile processes (default: CPU count)")
    parser.add_argument("--limit", type=at_least(1), default=None,
                        help="list (and with --compile, compile) only the first N feasible "
                        "configs, a quick check; the counts still cover the whole space")
    parser.add_argument("--seq-len", type=dimension("seq_len"), default=4096,
                        help="sequence length can_implement checks against (default 4096)")
    parser.add_argument("--heads", type=dimension("heads"), default=56,
                        help="attention heads (default 56)")
    parser.add_argument("--head-dim", type=dimension("head_dim"), default=128,
                        help="head dimension, 64 or 128 (default 128)")
    add_shape_arguments(parser)
    parser.add_argument("--rejected", action="store_true",
                        help="also list every rejected config with its reason (default: the "
                        "count per reason)")
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
    problem = problem_from_args(args, args.seq_len, 1)
    rows = []
    for family in _families_for(gpu.arch, args.family):
        rows += enumerate_rows(gpu, family, problem)
    # --limit: the first N feasible configs are listed and compiled, the rest only counted.
    listed = [r for r in rows if r.feasible][: args.limit]
    if args.compile:
        with _compile_progress(len(listed)) as advance:
            compile_rows(listed, gpu, problem, args.jobs, progress=advance)
    summary = {**summarize(rows), "listed": len(listed)}
    kept = {id(r) for r in listed}
    rows = [r for r in rows if not r.feasible or id(r) in kept]
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
        _print_table(wide_console(), gpu, rows, summary, args.compile, args.rejected)
    return 1 if summary["compile_errors"] else 0


@contextlib.contextmanager
def _compile_progress(total: int):
    """A progress bar on stderr while the builds run (about 2 s a config, minutes for a
    space); yields the callback compile_rows calls after each build."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    progress = Progress(TextColumn("[bold]compiling"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=Console(stderr=True))
    with progress:
        task = progress.add_task("compile", total=total)
        yield lambda: progress.advance(task)


def _print_table(console, gpu, rows, summary, compiled: bool, list_rejected: bool) -> None:
    """The configs as a table (the rejected ones only with --rejected), then the rejections
    counted per reason. Columns with nothing to show are left out, and the config column is
    never narrower than its longest knob=value, so a 100-column terminal wraps a config
    between knobs instead of cutting values."""
    from rich.table import Table

    shown = [r for r in rows if r.feasible or list_rejected]
    columns = {
        "family": lambda r: r.family,
        "config": lambda r: " ".join(f"{k}={v}" for k, v in r.config.items()),
        "status": lambda r: r.status,
    }
    if compiled:
        columns.update({
            "regs": lambda r: r.registers, "spill B": lambda r: r.spill_bytes,
            "smem B": lambda r: r.smem_bytes, "mma_class": lambda r: r.mma_class,
            "compile s": lambda r: r.compile_s,
        })
    columns["note"] = lambda r: r.error or r.reason or ""
    cells = [[get(r) for get in columns.values()] for r in shown]
    table = Table(
        title=f"{gpu.name} ({gpu.arch}): {summary['feasible']} feasible of {summary['total']}"
        + (f", the first {summary['listed']} listed (--limit)"
           if summary["listed"] < summary["feasible"] else "")
        + ("" if list_rejected else " (rejected: counted below; --rejected lists them)")
    )
    keep = [i for i, name in enumerate(columns)
            if name in ("family", "config", "status") or any(c[i] not in (None, "") for c in cells)]
    longest = max((len(tok) for c in cells for tok in c[1].split()), default=6)
    for i in keep:
        name = list(columns)[i]
        if name == "config":
            table.add_column(name, min_width=longest)
        elif name == "note":
            table.add_column(name, overflow="fold")
        else:
            table.add_column(name, no_wrap=True)
    for c in cells:
        table.add_row(*("-" if c[i] is None else str(c[i]) for i in keep))
    if shown:
        console.print(table)
    else:
        console.print(table.title)
    rejected = summary["total"] - summary["feasible"]
    if rejected:
        console.print(f"{rejected} rejected by can_implement:", highlight=False)
        for reason, count in summary["rejected_by_reason"].items():
            console.print(f"  {count:6d}  {reason}", highlight=False, soft_wrap=True)
    console.print(f"summary: {summary['total']} configs, {summary['feasible']} feasible, "
                  f"{summary['compiled']} compiled, {summary['compile_errors']} compile errors"
                  + "".join(f"; {n} {cls}" for cls, n in summary.get("mma_classes", {}).items()),
                  highlight=False)
