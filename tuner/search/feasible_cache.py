"""The feasible configs of a family on one problem and GPU, kept on disk between searches.

Judging a space is can_implement on every config of the cartesian product: 1.8M wgmma configs,
about 10 s per problem on an H100 host, on a search's critical path before its first candidate
and again for each problem of a run. The verdicts depend on nothing but the family's code, its
knob domains, the problem and the GPU profile, so a run that has judged them keeps one bit per
config of the product (zlib-compressed) under $TUNER_CACHE_DIR/feasible/, named by a hash of
exactly those inputs (the family's code as records.code_version hashes it, and the files beside
its module), and the next search
of the problem reads them back: the same configs in the same order, as dicts to_dict() makes.

A file that is missing, unreadable, truncated or of the wrong length is judged again and
rewritten; a failure to write one is logged and changes nothing else.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import logging
import os
import tempfile
import zlib
from pathlib import Path

from tuner.problem import Problem
from variants.base import PREPARE_ONLY_KNOBS
from variants.build import files_hash
from variants.dsl_compile import cache_root

log = logging.getLogger(__name__)


def feasible_dicts(family: str, module, problem: Problem, gpu) -> list[dict]:
    """(the dicts of) every config of `module`'s space that can_implement accepts on `problem`
    and `gpu`, in enumeration order (variants.base.judge_space's)."""
    from tuner.search.records import code_version

    space = module.space(gpu.arch)
    names = _knob_order(module.Config)
    domains = [space[n] for n in names]
    size = 1
    for domain in domains:
        size *= len(domain)
    # The family's directory too: a one-file family may judge through its neighbours' code.
    code = code_version(module) + files_hash(sorted(Path(module.__file__).parent.glob("*.py")))
    key = json.dumps({"family": family, "code": code, "knobs": names,
                      "domains": domains, "problem": problem.to_dict(), "gpu": gpu.to_dict()},
                     sort_keys=True, default=str)
    path = cache_root() / "feasible" / f"{family}-{hashlib.sha256(key.encode()).hexdigest()[:32]}"
    bits = _read(path, size)
    if bits is None:
        from variants.base import judge_space

        flags = bytearray(size)
        for index, (_, ok, _) in enumerate(judge_space(module, problem, gpu)):
            flags[index] = ok
        bits = flags
        _write(path, flags)
    return [_config(module.Config, names, values).to_dict()
            for values in itertools.compress(itertools.product(*domains), bits)]


def _knob_order(config_cls) -> list[str]:
    """variants.base.enumerate_space's order of the knobs (the prepare-only ones vary
    slowest); tests/test_feasible_cache.py compares what this module reads back with
    judge_space's own enumeration."""
    fields = [f.name for f in dataclasses.fields(config_cls)]
    return [n for n in fields if n in PREPARE_ONLY_KNOBS] + \
        [n for n in fields if n not in PREPARE_ONLY_KNOBS]


def _config(config_cls, names: list[str], values: tuple):
    return config_cls(**dict(zip(names, values, strict=True)))


def _read(path: Path, size: int) -> bytes | None:
    try:
        flags = zlib.decompress(path.read_bytes())
    except (OSError, zlib.error):
        return None
    if len(flags) != size or flags.strip(b"\0\1"):
        return None  # another space's, or damaged: judge again
    return flags


def _write(path: Path, flags: bytearray) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, delete=False) as fh:
            fh.write(zlib.compress(bytes(flags), 6))
        os.replace(fh.name, path)  # whole or absent, for a search running beside this one
    except OSError as exc:
        log.warning("tuner: could not keep the feasible configs in %s (%s); the next search "
                    "judges them again", path.parent, exc)
