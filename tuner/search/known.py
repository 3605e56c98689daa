"""Where a search starts: the configs already known to do well near its problem, measured right
after the default and its accurate twin (Space.baselines), before the sampler's proposals.

Three sources, read and ranked as the runtime reads and ranks them (tuner/runtime.py), so that
a search starts from what `tuner.attention` runs today, then from what GPUs like it run:
  table     the shipped table of the GPU (db/tables/<gpu>.yaml, runtime.TABLES_DIR): the rows of
            the PER_SOURCE nearest problems;
  database  the search's own results database: the winners of the PER_SOURCE nearest problems
            tuned on this device;
  siblings  the shipped tables of the other GPUs of its arch (an H200's for an H100's search),
            as one source: the rows of its PER_SOURCE nearest problems. Their times do not hold
            here, but the kernels are the same, and what is fast on one is a good first guess
            on the other.
Nearest is the runtime's rule for a lookup of the problem: only rows with its mask and head_dim;
those with its head count first, by rules a-e of tuner/runtime.py, then the others by work; the
row of the problem itself before all. A config is kept once, and only where it lies in the
feasible space of the search (its families, the arch's knob domains, can_implement on this
problem and GPU) and is no baseline. `tuner search --no-warm-start` reads none of the sources.

A problem whose own row ships in the table, decided by a search like this one (family set, code
version, accuracy budget and data, at least its patience in trials), is confirmed rather than
searched again (confirmed_row): its search stops after SearchSettings.confirm_patience
candidates without improvement.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from tuner.errors import TunerError
from tuner.problem import Problem
from tuner.store import config_hash

log = logging.getLogger("tuner.search")

# Problems taken from each source: the nearest few cost a few trials of a budget of 64 and
# cover what the runtime would fall back to for this problem.
PER_SOURCE = 4


@dataclass(frozen=True)
class Known:
    family: str
    config: dict
    source: str  # where it was read: "table h200.yaml: b2-h24-s1024-d64-full", "database: ..."


def ranked(entries: list, problem: Problem) -> list:
    """(problem, family, config, ...) entries in the order the runtime prefers them for a lookup
    of `problem` (tuner.runtime.config_for_problem); only those of its mask and head_dim."""
    from tuner.runtime import nearest_by_work_first, nearest_first

    same_heads = nearest_first(entries, problem, problem.heads)
    taken = {id(e) for e in same_heads}
    by_work = [e for e in nearest_by_work_first(entries, problem) if id(e) not in taken]
    return sorted([*same_heads, *by_work], key=lambda e: e[0] != problem)


def known_configs(space, problem: Problem, gpu, store, device_id: str) -> list[Known]:
    """The known configs of a search on `space` (proposal.Space), in the order it measures
    them: the table's, then the database's, then the same-arch tables', each source nearest
    first."""
    from tuner.gpus import PROFILES
    from tuner.runtime import db_entries, table_entries
    from tuner.tables import TableError

    def rows(profile):
        try:
            return table_entries(profile)
        except TableError as exc:
            raise TunerError(f"{exc}; the search starts from this table: repair or remove it, "
                             "or pass --no-warm-start") from None

    def labelled(where, entries):  # each entry ends with where it was read
        return [(*entry, where) for entry in entries]

    siblings = [p for p in PROFILES.values() if p.arch == gpu.arch and p.name != gpu.name]
    sources = [labelled(f"table {gpu.name}.yaml", rows(gpu)),
               labelled("database", db_entries(store.url, device_id)),
               # One source, so that they add PER_SOURCE configs however many GPUs share the arch.
               [e for p in siblings for e in labelled(f"table {p.name}.yaml", rows(p))]]
    found = [Known(family, config, f"{where}: {tuned.key()}")
             for entries in sources
             for tuned, family, config, *_, where in ranked(entries, problem)[:PER_SOURCE]]
    return _in_space(found, space, problem, gpu)


def confirmed_row(space, problem: Problem, gpu, code_versions: dict[str, str], family_set: str,
                  budget, min_trials: int) -> str | None:
    """"table <gpu>.yaml: <problem key>" where the GPU's shipped table holds a row of `problem`
    itself that this search measures (a baseline or one of space.known) and that a search like
    this one decided: the same family set, the code that runs now (code_versions: family ->
    records.code_version), an accuracy budget on the same data no tighter than `budget`'s (a
    tuner.budget.Budget, or None) with the row within it, and at least `min_trials` candidates.
    None elsewhere, a missing or unreadable table included (known_configs reports it)."""
    from tuner.runtime import config_from_row, table_path
    from tuner.tables import TableError, read_table

    path = table_path(gpu)
    try:
        _, entries = read_table(path) if path.exists() else (None, [])
    except TableError:
        return None
    measured = {config_hash(*b) for b in space.baselines} | \
        {config_hash(k.family, k.config) for k in space.known}
    for entry in entries:
        fields = entry.fields
        module = space.modules.get(entry.family)
        if entry.problem != problem or entry.family_set != family_set or module is None \
                or fields.get("code_version") != code_versions.get(entry.family) \
                or (fields.get("trials") or 0) < min_trials:
            continue
        # The row as it runs and as the warm start measured it (a row without the transforms
        # takes the default's: tuner.runtime.config_from_row).
        config = config_from_row(module, entry.as_written(), problem, gpu)[0]
        if config_hash(entry.family, config.to_dict()) not in measured:
            continue
        # A looser budget admits configs the row's search never timed; a tighter one only
        # drops some, and the row's stays where its error is within it.
        if budget is not None and not (
                fields.get("e2e_data") == budget.data
                and fields.get("max_error") is not None
                and fields["max_error"] >= budget.max_error
                and fields.get("e2e_error") is not None
                and fields["e2e_error"] <= budget.max_error):
            continue
        return f"table {gpu.name}.yaml: {problem.key()}"
    return None


def _in_space(found: list[Known], space, problem: Problem, gpu) -> list[Known]:
    """Those of `found` in the feasible space, once each, baselines left out; a row written
    before prepare's transforms existed takes the default's, as the runtime runs it."""
    from tuner.runtime import config_from_row

    seen = {config_hash(*b) for b in space.baselines}
    feasible = space.feasible_hashes
    kept = []
    for known in found:
        module = space.modules.get(known.family)
        if module is None:
            log.info("warm start: %s is a %s config, not searched here", known.source,
                     known.family)
            continue
        try:  # a database row of older code may name knobs this version has not
            config = config_from_row(module, known.config, problem, gpu)[0].to_dict()
        except TunerError as exc:
            log.info("warm start: %s skipped: %s", known.source, exc)
            continue
        digest = config_hash(known.family, config)
        if digest not in feasible:
            log.info("warm start: %s skipped: not in the feasible space of this problem",
                     known.source)
        elif digest not in seen:
            seen.add(digest)
            kept.append(Known(known.family, config, known.source))
    return kept
