"""YAML tuning tables: export the stored winners of a device, import them on another machine.

A table is the unit a team commits and ships (db/tables/<gpu>.yaml). Import is all or nothing:
the whole file is parsed and validated (schema version, known families and knobs, can_implement
on the named GPU, device fingerprint) before a single row is written, in one transaction; every
error names the line and the field. A table proves it is whole: export writes the number of
entries and a sha256 of them (`entry_count`, `entries_sha256`, schema version 2), and import
refuses a file whose entries do not match, so a copy cut off mid-file or a value edited by hand
never lands in a database; a version-1 table (written before the checksum) is still imported,
with a warning that nothing proves it whole. Version 3 gave each entry's problem the key/value
length and head count (`seq_len_kv`, `kv_heads`, written always); a version-1 or 2 problem has
neither and reads as self-attention over all heads (its `causal` was always false), so tables of
every readable version give the same winners. Version 4 gave each entry the `code_version` that
measured it (the runtime compares the times of one problem's entries only where the same code
measured them); older entries have none. Version 5 gave each entry the prepare times behind its
speedup (`prepare_ms`, `default_prepare_ms`: the speedup compares kernel + prepare) and the
accuracy budget's result (`e2e_error` on `e2e_data`, "realistic" or "calibration:<sha256>",
under `max_error`), which the runtime's max_error reads; older entries have none (their error is
unknown). A table of a version this tuner does not know, a newer one included, is refused before
anything is written. A file over MAX_TABLE_BYTES is refused
before it is parsed. Export is deterministic (sorted, dates from the data, not from the clock),
so export -> import -> export gives the same bytes.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import SafeConstructor

from tuner.dburl import display_url
from tuner.errors import TunerError, argument
from tuner.outcomes import Outcome, Role
from tuner.problem import Problem, StoredTime, check_dimension, preferred_per_problem

log = logging.getLogger("tuner.tables")

# 2 added entry_count and entries_sha256; version 1 tables are read without them.
# 3 added the problem's seq_len_kv and kv_heads; older tables are read without them.
# 4 added each entry's code_version; older entries have none.
# 5 added prepare_ms, default_prepare_ms, e2e_error, e2e_data and max_error; older entries have
#   none.
SCHEMA_VERSION = 5
READABLE_VERSIONS = (1, 2, 3, 4, 5)
# The fields of an entry's problem, by the first version that has them.
PROBLEM_FIELDS = {"batch": 1, "heads": 1, "seq_len": 1, "head_dim": 1, "causal": 1,
                  "seq_len_kv": 3, "kv_heads": 3}
# A table is a few KB per hundred problems (the shipped one: 10 entries, 6 KB); 16 MiB is room
# for ~25000 entries and keeps a wrong file (a log, a checkpoint) from being parsed for minutes.
MAX_TABLE_BYTES = 16 * 2**20
# `trials` lands in an INTEGER column, 32-bit on PostgreSQL.
MAX_TRIALS = 2**31 - 1
KIND = "fp8-attn-tuner/tuning-table"
ENTRY_FIELDS = {
    "problem",
    "family_set",
    "family",
    "config",
    "median_ms",
    "iqr_ms",
    "tflops",
    "speedup_over_default",
    "default_median_ms",
    "rel_rms",
    "trials",
    "decided_at",
    "code_version",
    "prepare_ms",
    "default_prepare_ms",
    "e2e_error",
    "e2e_data",
    "max_error",
}
# Entry fields by the first version that has them (the others: every version).
ENTRY_FIELDS_SINCE = {"code_version": 4, "prepare_ms": 5, "default_prepare_ms": 5,
                      "e2e_error": 5, "e2e_data": 5, "max_error": 5}
# What e2e_data may name: the realistic activations, or a calibration file by its sha256.
E2E_DATA = re.compile(r"realistic|calibration:[0-9a-f]{64}")
# records.code_version is 12 hex digits; the column holds 64.
MAX_CODE_VERSION_CHARS = 64
REQUIRED_ENTRY_FIELDS = {"problem", "family", "config", "median_ms"}
# Optional numbers of an entry: null or a finite number (`trials`: a count).
OPTIONAL_NUMBERS = ("iqr_ms", "tflops", "speedup_over_default", "default_median_ms", "rel_rms",
                    "prepare_ms", "default_prepare_ms", "e2e_error", "max_error")
# The only YAML types a table holds: plain mappings, lists and scalars. Anything tagged otherwise
# (!!python/object, !!set, a custom tag) is refused, never constructed.
_COLLECTION_TAGS = {"tag:yaml.org,2002:map", "tag:yaml.org,2002:seq"}
# libyaml's composer where PyYAML has it: a search reads the tables for every problem.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class TableError(TunerError):
    """A tuning table that cannot be imported; the message names the line and the field."""


# ---- reading with line numbers -----------------------------------------------------------------


def _construct(node: yaml.Node, path: tuple, lines: dict[tuple, int], seen: set[int]) -> Any:
    line = node.start_mark.line + 1
    lines[path] = line
    # compose() turns every alias into the anchored node itself; expanding a shared node again
    # is how a few lines of aliases become billions of values. Tables never need them.
    if id(node) in seen:
        raise TableError(f"line {line}: anchors and aliases (&, *) are not allowed in a table")
    seen.add(id(node))
    if not isinstance(node, yaml.ScalarNode) and node.tag not in _COLLECTION_TAGS:
        raise TableError(f"line {line}: the YAML tag {node.tag!r} is not allowed in a table")
    if isinstance(node, yaml.MappingNode):
        out = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise TableError(f"line {key_node.start_mark.line + 1}: mapping keys must be text")
            key = key_node.value
            out[key] = _construct(value_node, (*path, key), lines, seen)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_construct(item, (*path, i), lines, seen) for i, item in enumerate(node.value)]
    # Scalars: the safe constructor types them by the tag compose resolved (int, float, bool,
    # null, str, dates); it refuses any other tag.
    try:
        return SafeConstructor().construct_object(node)
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise TableError(f"line {line}: {problem}") from None


def parse_table(text: str, source: str = "<table>") -> tuple[dict, dict[tuple, int]]:
    """Safe-parse YAML into plain data plus the line of every path (for error messages)."""
    try:
        node = yaml.compose(text, Loader=_LOADER)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else "somewhere"
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise TableError(f"{source}: {where}: not valid YAML ({problem})") from None
    except RecursionError:
        raise TableError(f"{source}: nested too deeply to be a tuning table") from None
    if node is None:
        raise TableError(f"{source}: the file is empty")
    lines: dict[tuple, int] = {}
    try:
        data = _construct(node, (), lines, set())
    except TableError as exc:
        raise TableError(f"{source}: {exc}") from None
    if not isinstance(data, dict):
        raise TableError(f"{source}: line 1: a tuning table is a mapping with 'entries'")
    return data, lines


@dataclass(frozen=True)
class TableEntry:
    problem: Problem
    family_set: str
    family: str
    config: Any  # the family's Config
    fields: dict  # everything else, as written
    written: frozenset = frozenset()  # the knobs the entry names (others took their defaults)

    def as_written(self) -> dict:
        """The config dict without the prepare-only knobs the entry does not name: an entry
        written before them takes the default's (tuner.runtime.config_from_row), not "off",
        and keeps doing so through an import and an export."""
        from variants.base import PREPARE_ONLY_KNOBS

        return {k: v for k, v in self.config.to_dict().items()
                if k in self.written or k not in PREPARE_ONLY_KNOBS}


def _where(source: str, lines: dict[tuple, int], path: tuple) -> str:
    # The deepest known ancestor's line: a missing field is reported at its parent.
    while path and path not in lines:
        path = path[:-1]
    field = ".".join(str(p) for p in path) or "(top)"
    return f"{source}: line {lines.get(path, 1)}: {field}"


def validate_table(data: dict, lines: dict[tuple, int], source: str, gpu=None) -> list[TableEntry]:
    """Check everything that can be checked without a database; raise TableError on the first
    problem. With `gpu`, every config must pass can_implement on it."""
    from variants import KNOWN_FAMILIES, load_family

    def fail(path: tuple, message: str):
        raise TableError(f"{_where(source, lines, path)}: {message}")

    if data.get("kind") != KIND:
        fail(("kind",), f"expected kind {KIND!r}, got {data.get('kind')!r}")
    version = data.get("schema_version")
    if type(version) is not int or version not in READABLE_VERSIONS:  # not True, not 1.0
        newer = type(version) is int and version > SCHEMA_VERSION
        fail(
            ("schema_version",),
            f"schema version {data.get('schema_version')!r} is not one of "
            f"{READABLE_VERSIONS}; "
            + ("a newer tuner wrote it: upgrade fp8-attn-tuner to import it, or re-export it "
               "with this version" if newer else
               "re-export the table with a matching tuner version"),
        )
    if version >= 2:
        for field in ("entry_count", "entries_sha256"):
            if field not in data:
                fail((field,), f"{field} is missing; a version-{version} table proves it is "
                     "whole with entry_count and entries_sha256: re-export it with `tuner export`")
    for field in ("gpu", "device"):
        if field not in data:
            fail((field,), "missing")
    if not isinstance(data.get("device"), dict) or "name" not in data["device"]:
        fail(("device",), "must be the device fingerprint mapping (name, compute_capability, ...)")
    try:
        json.dumps(data["device"], allow_nan=False)  # stored as JSON beside the winners
    except (TypeError, ValueError):
        fail(("device",), "fingerprint values must be plain text, numbers, lists or mappings")
    entries = data.get("entries")
    if not isinstance(entries, list):
        fail(("entries",), "must be a list of tuned problems")
    result = []
    for i, entry in enumerate(entries):
        at = ("entries", i)
        if not isinstance(entry, dict):
            fail(at, "each entry must be a mapping")
        for field in sorted(REQUIRED_ENTRY_FIELDS - set(entry)):
            fail(at, f"missing field {field!r}")
        for field in sorted(set(entry) - ENTRY_FIELDS):
            fail((*at, field), f"unknown field; known: {', '.join(sorted(ENTRY_FIELDS))}")
        for field, since in ENTRY_FIELDS_SINCE.items():
            if field in entry and version < since:
                fail((*at, field), f"{field} needs schema_version >= {since}, this is a "
                     f"version-{version} table: re-export it with `tuner export`")
        if not isinstance(entry["problem"], dict):
            fail((*at, "problem"), f"must be a mapping ({', '.join(PROBLEM_FIELDS)})")
        for field, value in entry["problem"].items():
            since = PROBLEM_FIELDS.get(field)
            if since is None or since > version:
                known = [f for f, v in PROBLEM_FIELDS.items() if v <= version]
                fail((*at, "problem", field),
                     f"unknown problem field in a version-{version} table; known: "
                     f"{', '.join(known)}"
                     + (f" ({field} needs schema_version >= {since}: re-export the table with "
                        "`tuner export`)" if since is not None else ""))
            if field != "causal":
                try:
                    check_dimension(field, value)
                except TunerError as exc:
                    fail((*at, "problem", field), str(exc))
        try:
            problem = Problem(**entry["problem"])
        except (TypeError, TunerError) as exc:
            fail((*at, "problem"), str(exc))
        # Only this package's families: a dotted path (how tests load a double) would import
        # whatever module a file names.
        name = entry["family"]
        if name not in KNOWN_FAMILIES:
            fail((*at, "family"), f"unknown family {name!r}; known: {', '.join(KNOWN_FAMILIES)}")
        family = load_family(name)
        family_set = entry.get("family_set", name)
        if not isinstance(family_set, str) or name not in family_set.split("+"):
            fail((*at, "family_set"), f"must name the families searched, '+'-joined, "
                 f"{name!r} among them; got {family_set!r}")
        config_dict = entry["config"]
        if not isinstance(config_dict, dict):
            fail((*at, "config"), "must be a mapping of knob: value")
        try:
            config = family.Config.from_dict(config_dict)
        except (TunerError, TypeError, ValueError) as exc:
            fail((*at, "config"), str(exc))
        domains = family.space(gpu.arch) if gpu is not None else None
        for knob, value in config_dict.items():
            if domains is not None and value not in domains.get(knob, [value]):
                fail(
                    (*at, "config", knob),
                    f"{value!r} is outside the {gpu.arch} domain {domains[knob]}",
                )
        if gpu is not None:
            ok, reason = family.can_implement(config, problem, gpu)
            if not ok:
                fail((*at, "config"), f"cannot run on {gpu.name}: {reason}")
        median = entry["median_ms"]
        if not _number(median) or median <= 0:
            fail((*at, "median_ms"), f"must be a positive number of milliseconds, got {median!r}")
        for field in OPTIONAL_NUMBERS:
            if entry.get(field) is not None and not _number(entry[field]):
                fail((*at, field), f"must be a number or null, got {entry[field]!r}")
        for field in ("prepare_ms", "default_prepare_ms", "e2e_error", "max_error"):
            if entry.get(field) is not None and entry[field] < 0:
                fail((*at, field), f"must be >= 0, got {entry[field]!r}")
        data_name = entry.get("e2e_data")
        if data_name is not None and not (isinstance(data_name, str)
                                          and E2E_DATA.fullmatch(data_name)):
            fail((*at, "e2e_data"), "must be 'realistic', 'calibration:' and a file's sha256 (64 "
                 f"hex digits), or null; got {data_name!r}")
        code = entry.get("code_version")
        if code is not None and not (isinstance(code, str) and 0 < len(code)
                                     <= MAX_CODE_VERSION_CHARS):
            fail((*at, "code_version"), f"must be the text export wrote (at most "
                 f"{MAX_CODE_VERSION_CHARS} characters) or null, got {code!r}")
        trials = entry.get("trials")
        if trials is not None and (type(trials) is not int or not 0 <= trials <= MAX_TRIALS):
            fail((*at, "trials"), f"must be a count (0 to {MAX_TRIALS}) or null, got {trials!r}")
        fields = {k: v for k, v in entry.items() if k not in ("problem", "family", "config")}
        try:
            fields["decided_at"] = _datetime(entry.get("decided_at"))
        except ValueError:
            fail((*at, "decided_at"), f"must be an ISO date and time or null, got "
                 f"{entry['decided_at']!r}")
        result.append(TableEntry(problem, family_set, name, config, fields,
                                 frozenset(config_dict)))
    keys = [(e.problem, e.family_set) for e in result]
    for i, key in enumerate(keys):
        if key in keys[:i]:
            fail(("entries", i, "problem"), f"duplicate entry for {key[0].key()} ({key[1]})")
    # Last, so that a malformed entry is named by its own field first: a table that is valid
    # entry by entry may still have lost entries or had a value cut short (`0.02368` -> `0.02`).
    if version >= 2:
        count = data["entry_count"]
        if count != len(entries):
            fail(("entry_count",), f"the table says {count!r} entries, the file holds "
                 f"{len(entries)}: it was cut off or edited; re-export it with `tuner export` "
                 "(or restore the complete file)")
        if data["entries_sha256"] != entries_digest(entries):
            fail(("entries_sha256",), "does not match the entries: the file was cut off or "
                 "edited after export; re-export it with `tuner export` (or restore the "
                 "complete file)")
    return result


def entries_digest(entries: list) -> str:
    """sha256 of the entries as plain data in canonical JSON (sorted keys, no spaces): the
    same for the entries export writes and for those a YAML reader gets back from the file."""
    text = json.dumps(entries, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _datetime(value) -> dt.datetime | None:
    """decided_at as written by export (ISO text) or typed by YAML (a timestamp), as naive UTC."""
    if value is None:
        return None
    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value)
    if not isinstance(value, dt.datetime):  # a bare date, a number, a list
        raise ValueError(value)
    if value.tzinfo is not None:
        value = value.astimezone(dt.UTC).replace(tzinfo=None)
    return value


def _read_text(path: Path) -> str:
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_TABLE_BYTES + 1)  # never more, whatever stat() said
    except OSError as exc:
        raise TableError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_TABLE_BYTES:
        raise TableError(f"{path} is larger than {MAX_TABLE_BYTES // 2**20} MiB, the limit of a "
                         "tuning table (one written by `tuner export` is a few KB): check the "
                         "file name")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TableError(f"{path}: byte {exc.start} is not UTF-8; a tuning table is text") from None


def read_table(path: Path, gpu=None) -> tuple[dict, list[TableEntry]]:
    path = Path(path)
    data, lines = parse_table(_read_text(path), str(path))
    return data, validate_table(data, lines, str(path), gpu)


def load_table_entries(path: Path, keep=None) -> list[tuple[Problem, str, dict, float | None]]:
    """(problem, family, config dict, e2e_error) of a shipped table, for the runtime lookup: one
    per problem, where winners of several family sets were stored for it (a search over wgmma
    alone beside one over both families) the one store.best_for picks in a database
    (problem.preferred_per_problem), among the entries `keep(entry)` keeps (the runtime's
    max_error)."""
    _, entries = read_table(path)
    kept = [e for e in entries if keep is None or keep(e)]
    preferred = preferred_per_problem(kept, lambda e: e.problem.key(), entry_time)
    return [(e.problem, e.family, e.as_written(), e.fields.get("e2e_error")) for e in preferred]


def entry_time(entry: TableEntry) -> StoredTime:
    f = entry.fields
    return StoredTime(f["median_ms"], f.get("decided_at"), f.get("code_version"))


# ---- export ------------------------------------------------------------------------------------


def _iso(value: dt.datetime | None) -> str | None:
    if value is None:
        return None
    return value.replace(microsecond=0).isoformat()


def _round(x: float | None, digits: int = 4) -> float | None:
    return None if x is None else float(f"{x:.{digits}g}")


def build_table(store, device_id: str, gpu_name: str, keep=None) -> dict:
    """The YAML document for every winner of `device_id` in `store` (with `keep`, a predicate
    on the Problem, for those it keeps: `tuner export --causal` and the like)."""
    from tuner import __version__

    fingerprint = store.devices().get(device_id)
    if fingerprint is None:
        raise TunerError(
            f"no device {device_id} in {display_url(store.url)}; `tuner show` lists what is stored"
        )
    entries = []
    for w in store.winners(device_id):
        problem = Problem.from_key(w.problem_key)
        if keep is not None and not keep(problem):
            continue
        t = w.trial
        # Candidates the search measured (the default included): not the infeasible proposals
        # it stored without compiling, nor the final re-timings. An imported winner carries the
        # count of the search that found it elsewhere.
        trials = w.imported_trials
        if trials is None:
            trials = sum(1 for t in store.trials(problem, device_id=device_id,
                                                 family_set=w.family_set)
                         if t.outcome != Outcome.INFEASIBLE and t.role != Role.RETIME)
        entries.append(
            {
                "problem": problem.to_dict(),
                "family_set": w.family_set,
                "family": w.family,
                "config": dict(w.config),
                "median_ms": _round(t.median_ms),
                "prepare_ms": _round(t.prepare_ms),
                "iqr_ms": _round(t.iqr_ms),
                "tflops": _round(t.tflops),
                "speedup_over_default": _round(w.speedup_over_default),
                "default_median_ms": _round(w.default_trial.median_ms) if w.default_trial else None,
                "default_prepare_ms": (_round(w.default_trial.prepare_ms) if w.default_trial
                                       else None),
                "rel_rms": _round(t.rel_rms),
                "trials": trials,
                "decided_at": _iso(w.decided_at),
                "code_version": t.code_version,
                "e2e_error": _round(t.e2e_error),
                "e2e_data": t.e2e_data,
                "max_error": _round(t.max_error),
            }
        )
    entries.sort(
        key=lambda e: (
            e["problem"]["head_dim"],
            e["problem"]["causal"],
            e["problem"]["heads"],
            e["problem"]["kv_heads"],
            e["problem"]["batch"],
            e["problem"]["seq_len"],
            e["problem"]["seq_len_kv"],
            e["family_set"],
        )
    )
    dates = [e["decided_at"] for e in entries if e["decided_at"]]
    return {
        "kind": KIND,
        "schema_version": SCHEMA_VERSION,
        "gpu": gpu_name,
        "device": fingerprint,
        "device_id": device_id,
        "tool_version": __version__,
        "dsl_version": fingerprint.get("cutlass_dsl"),
        "date": max(dates) if dates else None,
        "entry_count": len(entries),
        "entries_sha256": entries_digest(entries),
        "entries": entries,
    }


def dump_table(doc: dict) -> str:
    header = (
        "# FP8 attention tuning table (fp8-attn-tuner). Measured on the device below; the\n"
        "# numbers hold on that GPU only. Import with `tuner import FILE`.\n"
    )
    return header + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, width=100)


# ---- import ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckedTable:
    """A table that may be imported: its device (fingerprint id and fingerprint) and entries."""

    device_id: str
    device: dict
    entries: list[TableEntry]


def check_import(path: Path, *, force: bool = False,
                 local_fingerprint: dict | None = None) -> CheckedTable:
    """Validate `path` completely for an import, touching no database.

    The table's device must be the local one (same fingerprint id) unless `force`: a table tuned
    on another GPU model would route this GPU to configs nobody measured on it.
    """
    from tuner.gpus import PROFILES, fingerprint_id

    data, lines = parse_table(_read_text(Path(path)), str(path))
    gpu_name = data.get("gpu")
    if not isinstance(gpu_name, str) or gpu_name not in PROFILES:
        raise TableError(
            f"{_where(str(path), lines, ('gpu',))}: unknown GPU {gpu_name!r}; "
            f"known: {', '.join(PROFILES)}"
        )
    entries = validate_table(data, lines, str(path), PROFILES[gpu_name])
    if data["schema_version"] < 2:
        log.warning("tuner import: %s is a version-%s table without entry_count and "
                    "entries_sha256: nothing proves it whole; re-export it to add them",
                    path, data["schema_version"])
    table_device = data["device"]
    try:
        table_id = fingerprint_id(table_device)
    except KeyError as exc:
        raise TableError(
            f"{_where(str(path), lines, ('device',))}: fingerprint lacks {exc}"
        ) from None
    if not force:
        if local_fingerprint is None:
            raise TableError(
                f"{path}: cannot check the table's device ({table_device.get('name')}) against "
                f"this machine: no local GPU. Re-run with {argument('force', True)} to import it "
                "anyway"
            )
        if fingerprint_id(local_fingerprint) != table_id:
            raise TableError(
                f"{_where(str(path), lines, ('device',))}: tuned on {table_device.get('name')} "
                f"({table_id}), this machine has {local_fingerprint.get('name')} "
                f"({fingerprint_id(local_fingerprint)}); use {argument('force', True)} to "
                "import it anyway"
            )
    return CheckedTable(table_id, table_device, entries)


def import_table(
    store, path: Path, *, force: bool = False, local_fingerprint: dict | None = None
) -> int:
    """Validate `path` completely (check_import), then write its winners in one transaction.
    Returns the count of entries."""
    checked = check_import(path, force=force, local_fingerprint=local_fingerprint)
    store.import_winners(checked.device_id, checked.device, checked.entries)
    return len(checked.entries)
