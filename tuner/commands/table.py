"""`tuner table GPU`: the tuning table shipped for a GPU (db/tables/<gpu>.yaml), one line per row:
its problem, family, times, accuracy, and whether it was searched with the code that runs now;
--searches and --missing print the searches that bring its older rows up to date and that add
the problems every table should hold (db/tables/coverage.yaml).

A row whose code version is the family's today (tuner.search.records.code_version) is what a
search confirms rather than searches again (docs/tables-and-database.md); an older one still
runs, with the times its own code measured. No GPU is needed: it reads the file and hashes the
source."""

from __future__ import annotations

import json

from tuner.commands._args import wide_console
from tuner.errors import TunerError

NAME = "table"
HELP = "list the tuning table shipped for a GPU (times, accuracy, code version current or not)"


def add_arguments(parser) -> None:
    parser.add_argument("gpu", help="a GPU profile (h100, h200, ...; auto: the local GPU's)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--searches", action="store_true",
                        help="print the `tuner search` commands that re-search the rows searched "
                             "with older code, one per group of rows that differ only in seq_len")
    parser.add_argument("--missing", action="store_true",
                        help="print the `tuner search` commands of the problems every table "
                             "should hold (db/tables/coverage.yaml) that this one lacks")


def _read(gpu_name: str) -> tuple:
    """(the GPU profile, the table's path, [(entry, whether the family's code version today is
    the one the row was searched with)] in file order); a TunerError where the profile is
    unknown, no table ships for it, or the table does not validate."""
    from tuner.gpus import resolve_gpu
    from tuner.runtime import table_path
    from tuner.search.records import code_version
    from tuner.tables import TableError, read_table
    from variants import load_family

    gpu = resolve_gpu(gpu_name, require_local=False)
    path = table_path(gpu)
    if not path.is_file():
        raise TunerError(f"no tuning table ships for {gpu.name} ({path} does not exist); "
                         f"`tuner search --gpu auto` on one tunes it, `tuner export` writes it")
    try:
        _, entries = read_table(path)
    except TableError as exc:
        raise TunerError(str(exc)) from None
    versions = {}
    for e in entries:
        if e.family not in versions:
            versions[e.family] = code_version(load_family(e.family))
    return gpu, path, [(e, e.fields.get("code_version") == versions[e.family]) for e in entries]


def rows(gpu_name: str) -> tuple[str, list[dict]]:
    """(the table's path, one dict per entry in file order); _read's errors."""
    from variants import load_family

    gpu, path, read = _read(gpu_name)
    out = []
    for e, current in read:
        f = e.fields
        out.append({
            "problem": e.problem.key(), "family_set": e.family_set, "family": e.family,
            "median_ms": f.get("median_ms"), "prepare_ms": f.get("prepare_ms"),
            "e2e_error": f.get("e2e_error"), "e2e_data": f.get("e2e_data"),
            "transforms": _transforms(e, load_family(e.family), gpu),
            "decided_at": str(f["decided_at"]) if f.get("decided_at") else None,
            "code_version": f.get("code_version"), "current": current,
        })
    return str(path), out


def searches(gpu_name: str) -> list[str]:
    """The `tuner search` commands that bring the table's older rows (not current, _read) to
    today's code: one per group of rows alike but for seq_len, in file order, each naming only
    the flags that differ from the CLI's defaults. Run on that GPU, then `tuner export` writes
    the table again."""
    from variants import families_for_arch

    gpu, _, read = _read(gpu_name)
    auto = "+".join(families_for_arch(gpu.arch))
    return _commands(gpu, [(entry.problem, entry.family_set) for entry, current in read
                           if not current], auto)


def missing(gpu_name: str) -> list[str]:
    """The `tuner search` commands of the coverage problems (coverage()) that the table has no
    row of, grouped as searches() groups them, with the arch's whole family set."""
    from variants import families_for_arch

    gpu, _, read = _read(gpu_name)
    held = {entry.problem.key() for entry, _ in read}
    auto = "+".join(families_for_arch(gpu.arch))
    return _commands(gpu, [(p, auto) for p in coverage() if p.key() not in held], auto)


def _commands(gpu, problems, auto: str) -> list[str]:
    """One `tuner search` per group of (problem, family set) alike but for seq_len, in order,
    naming only the flags that differ from the CLI's defaults."""
    groups: dict[tuple, list[int]] = {}
    for p, family_set in problems:
        flags = [f"--heads {p.heads}"]
        for flag, value, default in (("--batch", p.batch, 1), ("--head-dim", p.head_dim, 128),
                                     ("--kv-heads", p.kv_heads, p.heads)):
            if value != default:
                flags.append(f"{flag} {value}")
        if p.seq_len_kv != p.seq_len:  # cross-attention: every length of the group has these keys
            flags.append(f"--kv-len {p.seq_len_kv}")
        if p.causal:
            flags.append("--causal")
        if family_set != auto:
            flags.append(f"--families {family_set.replace('+', ',')}")
        groups.setdefault(tuple(flags), []).append(p.seq_len)
    return [f"tuner search --gpu {gpu.name} --seq-lens {','.join(map(str, sorted(set(lens))))} "
            + " ".join(flags) for flags, lens in groups.items()]


COVERAGE_KEYS = {"heads", "seq_lens", "batch", "head_dim", "kv_heads", "kv_len", "causal"}


def coverage() -> list:
    """The problems of db/tables/coverage.yaml (runtime.TABLES_DIR), in file order; a TunerError
    naming the file and the entry where it does not parse."""
    import yaml

    from tuner.problem import Problem
    from tuner.runtime import TABLES_DIR

    path = TABLES_DIR / "coverage.yaml"
    try:
        entries = yaml.safe_load(path.read_text())["problems"]
        problems = []
        for i, e in enumerate(entries):
            unknown = set(e) - COVERAGE_KEYS
            if unknown or not {"heads", "seq_lens"} <= set(e):
                raise ValueError(f"entry {i + 1} has keys {sorted(e)}: heads and seq_lens, and "
                                 f"any of {sorted(COVERAGE_KEYS - {'heads', 'seq_lens'})}")
            for seq_len in e["seq_lens"]:
                problems.append(Problem(
                    e.get("batch", 1), e["heads"], seq_len, e.get("head_dim", 128),
                    bool(e.get("causal", False)), e.get("kv_len", seq_len),
                    e.get("kv_heads", e["heads"])))
    except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError, TunerError) as exc:
        raise TunerError(f"{path}: {exc}") from None
    return problems


def _transforms(entry, family, gpu) -> str:
    """The prepare transforms the row runs with ("none" for none): the knobs it names, and for a
    knob it does not name the default's (runtime.config_from_row); a row that names neither
    (written before they existed) says "the default's"."""
    from tuner.runtime import config_from_row
    from variants.base import PREPARE_ONLY_KNOBS

    if not set(PREPARE_ONLY_KNOBS) & entry.written:
        return "the default's"
    cfg, _ = config_from_row(family, entry.as_written(), entry.problem, gpu)
    return " ".join(f"{k}={getattr(cfg, k)}" for k, off in PREPARE_ONLY_KNOBS.items()
                    if getattr(cfg, k, off) != off) or "none"


def run(args) -> int:
    if args.searches or args.missing:
        for command in (searches(args.gpu) if args.searches else []) + \
                (missing(args.gpu) if args.missing else []):
            print(command)
        return 0
    path, table_rows = rows(args.gpu)
    if args.json:
        print(json.dumps({"table": path, "rows": table_rows}, indent=2))
        return 0
    from rich.table import Table

    current = sum(r["current"] for r in table_rows)
    table = Table(title=f"{path}: {len(table_rows)} rows, {current} searched with today's code")
    for col in ("problem", "family", "kernel ms", "prepare ms", "e2e error", "transforms",
                "decided", "code version"):
        table.add_column(col, justify="right" if col.endswith(("ms", "error")) else "left")
    for r in table_rows:
        error = "-" if r["e2e_error"] is None else f"{r['e2e_error']:.3g} ({r['e2e_data']})"
        version = r["code_version"] or "none"
        table.add_row(
            r["problem"], r["family"] if r["family"] == r["family_set"] else
            f"{r['family']} ({r['family_set']})",
            "-" if r["median_ms"] is None else f"{r['median_ms']:.4g}",
            "-" if r["prepare_ms"] is None else f"{r['prepare_ms']:.4g}",
            error, r["transforms"], (r["decided_at"] or "-")[:10],
            f"{version} (current)" if r["current"] else f"{version} (older)")
    wide_console().print(table)
    return 0
