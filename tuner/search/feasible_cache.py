"""The feasible configs of a family on one problem and GPU, kept on disk between searches.

Judging a space is can_implement on every config of the cartesian product: 3.5M wgmma configs, about
10 s per 1.8M and problem on an H100 host, on a search's critical path before its first candidate
and again for each problem of a run. The verdicts depend on nothing but the family's code, its knob
domains, the problem and the GPU profile, so a run that has judged them keeps the feasible configs
(their knob names once, then one row of values each, and each config's store.config_hash, which a
search needs for every config and which costs about 1 s per 90k to compute; JSON, zlib-compressed,
~1 MB per 90k of wgmma's) under $TUNER_CACHE_DIR/feasible/, named by a hash of exactly those inputs
(the family's code as records.code_version hashes it, the files beside its module, and the hashing
scheme), and the next search of the problem reads them back: the dicts judge_space's configs make,
in its order, with their hashes.

A file that is missing, unreadable, truncated or not of the family's knobs is judged again and
rewritten; a failure to write one is logged and changes nothing else.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import tempfile
import zlib
from pathlib import Path

from tuner.problem import Problem
from tuner.search.judging import judge_feasible
from tuner.store import config_hash
from variants.build import files_hash
from variants.dsl_compile import cache_root

log = logging.getLogger(__name__)


def feasible_dicts(family: str, module, problem: Problem, gpu) -> tuple[list[dict], list[str]]:
    """(the dicts of) every config of `module`'s space that can_implement accepts on `problem`
    and `gpu`, in enumeration order (variants.base.judge_space's), and config_hash(family, c) of
    each."""
    from tuner.search.records import code_version

    knobs = [f.name for f in dataclasses.fields(module.Config)]  # to_dict's keys, in order
    # The family's directory too: a one-file family may judge through its neighbours' code.
    code = code_version(module) + files_hash(sorted(Path(module.__file__).parent.glob("*.py")))
    key = json.dumps({"family": family, "code": code, "space": module.space(gpu.arch),
                      "problem": problem.to_dict(), "gpu": gpu.to_dict(),
                      "hashing": config_hash("", {})},  # another hashing scheme: another file
                     sort_keys=True, default=str)
    path = cache_root() / "feasible" / f"{family}-{hashlib.sha256(key.encode()).hexdigest()[:32]}"
    doc = _read(path, knobs)
    if doc is None:
        configs = judge_feasible(family, module, problem, gpu)
        hashes = [config_hash(family, c) for c in configs]
        _write(path, {"knobs": knobs, "rows": [[c[k] for k in knobs] for c in configs],
                      "hashes": hashes})
        return configs, hashes
    return [dict(zip(knobs, row, strict=True)) for row in doc["rows"]], doc["hashes"]


def _read(path: Path, knobs: list[str]) -> dict | None:
    """The file at `path`, or None where it is missing or not one of these knobs with a hash
    per row."""
    try:
        doc = json.loads(zlib.decompress(path.read_bytes()))
    except (OSError, zlib.error, ValueError):
        return None
    if not (isinstance(doc, dict) and doc.get("knobs") == knobs
            and isinstance(doc.get("rows"), list) and isinstance(doc.get("hashes"), list)
            and len(doc["hashes"]) == len(doc["rows"])
            and all(isinstance(r, list) and len(r) == len(knobs) for r in doc["rows"])
            and all(isinstance(h, str) for h in doc["hashes"])):
        return None  # another family's, or damaged: judge again
    return doc


def _write(path: Path, doc: dict) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, delete=False) as fh:
            fh.write(zlib.compress(json.dumps(doc, separators=(",", ":")).encode(), 6))
        os.replace(fh.name, path)  # whole or absent, for a search running beside this one
    except OSError as exc:
        log.warning("tuner: could not keep the feasible configs in %s (%s); the next search "
                    "judges them again", path.parent, exc)
