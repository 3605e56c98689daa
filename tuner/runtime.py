"""What user code calls: `load_best_config(seq_len)` and `attention(q, k, v)`.

Lookup order for a problem on the local GPU (DESIGN.md):
  1. the results database: exact seq_len, else the nearest tuned seq_len on a log scale among
     winners with the same head_dim (and heads / batch when given),
  2. the shipped table db/tables/<gpu>.yaml, same matching,
  3. the family default for the arch.
Every candidate is re-checked with can_implement on the local GPU before it is returned; a
fallback (anything but an exact database hit) is logged once per key, never silent.

The lookup is memoized per key; a SQLite database is re-read only when its files change
(one stat() per file), so a repeated call costs microseconds.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from tuner.errors import TunerError
from tuner.problem import Problem

log = logging.getLogger("tuner.runtime")

TABLES_DIR = Path(__file__).resolve().parents[1] / "db" / "tables"


@dataclass(frozen=True)
class BestConfig:
    """A config and its source: db-exact, db-nearest, table-exact, table-nearest or default."""

    family: str
    config: Any
    source: str
    tuned_seq_len: int | None = None
    detail: str = ""


def _log_distance(a: int, b: int) -> Fraction:
    """|log a - log b|, as the ratio max/min it is a monotone function of: exact, so that a tie
    is a tie (in floats, log 4096 - log 2048 and log 8192 - log 4096 differ by an ulp)."""
    return Fraction(max(a, b), min(a, b))


def _nearest(
    candidates: list[tuple[Problem, str, dict]], want: Problem, heads: int | None, batch: int | None
):
    """Among (problem, family, config) entries with the same head_dim (and heads/batch if given),
    the one whose seq_len is nearest on a log scale; an exact tie (2048 and 8192 for 4096: the
    same ratio) goes to the larger seq_len, whose tiles are the more conservative choice for a
    long sequence; entries of one seq_len keep their given order (the first wins)."""
    usable = [
        c
        for c in candidates
        if c[0].head_dim == want.head_dim
        and (heads is None or c[0].heads == heads)
        and (batch is None or c[0].batch == batch)
    ]
    if not usable:
        return None
    return min(usable, key=lambda c: (_log_distance(c[0].seq_len, want.seq_len), -c[0].seq_len))


class _Resolver:
    """Memoized lookup; one per process (module-level `_RESOLVER`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._memo: dict[tuple, tuple[tuple, BestConfig]] = {}
        self._warned: set[tuple] = set()

    def clear(self) -> None:
        with self._lock:
            self._memo.clear()
            self._warned.clear()

    @staticmethod
    def _db_stamp(url: str) -> tuple:
        """Changes whenever the database could have changed: SQLite file + WAL sizes and times.
        For other backends nothing cheap exists: the memo holds until clear_cache()."""
        stamp = [url]
        for p in _stamped_files(url):
            try:
                st = os.stat(p)
                stamp += [st.st_mtime_ns, st.st_size]
            except FileNotFoundError:
                stamp += [None, None]
        return tuple(stamp)

    def resolve(
        self,
        problem: Problem,
        heads: int | None,
        batch: int | None,
        gpu,
        db: str | None,
        device_id: str | None,
    ) -> BestConfig:
        url = db_url(db)
        key = (problem, heads, batch, gpu.name, url, device_id)
        stamp = self._db_stamp(url)
        hit = self._memo.get(key)
        if hit is not None and hit[0] == stamp:
            return hit[1]
        best = self._lookup(problem, heads, batch, gpu, url, device_id)
        with self._lock:
            self._memo[key] = (stamp, best)
            if best.source != "db-exact" and key not in self._warned:
                self._warned.add(key)
                log.warning(
                    "tuner: %s on %s: using %s config (%s)",
                    problem.key(),
                    gpu.name,
                    best.source,
                    best.detail,
                )
        return best

    def _lookup(self, problem, heads, batch, gpu, url, device_id) -> BestConfig:
        rejected = []
        for source, entry in self._candidates(problem, heads, batch, gpu, url, device_id):
            tuned_problem, family_name, config_dict = entry
            from variants import load_family

            family = load_family(family_name)
            cfg = family.Config.from_dict(config_dict)
            ok, reason = family.can_implement(cfg, problem, gpu)
            exact = tuned_problem.seq_len == problem.seq_len
            kind = f"{source}-{'exact' if exact else 'nearest'}"
            if ok:
                return BestConfig(
                    family_name,
                    cfg,
                    kind,
                    tuned_problem.seq_len,
                    f"tuned for {tuned_problem.key()}"
                    + ("; " + "; ".join(rejected) if rejected else ""),
                )
            rejected.append(f"{kind} {family_name} rejected: {reason}")
        return self._default(problem, gpu, rejected)

    def _candidates(self, problem, heads, batch, gpu, url, device_id):
        """Yield (source, (problem, family, config)) in lookup order: db first, then table."""
        if device_id is not None:
            from tuner.store import NoResults, Store, sqlite_path

            path = sqlite_path(url)
            if path is None or path.exists():  # never create an empty database on lookup
                try:
                    store = Store(url, readonly=True)
                except NoResults:  # an empty file (say): no winners, on to the table
                    store = None
                if store is not None:
                    try:
                        winners = [
                            (Problem.from_key(w.problem_key), w.family, w.config)
                            for w in store.winners(device_id)
                        ]
                    finally:
                        store.close()
                    found = _nearest(winners, problem, heads, batch)
                    if found:
                        yield "db", found
        from tuner.tables import load_table_entries

        table = TABLES_DIR / f"{gpu.name}.yaml"
        if table.exists():
            found = _nearest(load_table_entries(table), problem, heads, batch)
            if found:
                yield "table", found

    @staticmethod
    def _default(problem, gpu, rejected) -> BestConfig:
        from variants import families_for_arch, load_family

        # Nothing tuned: the preferred family of the arch (wgmma on Hopper), then the others.
        for name in families_for_arch(gpu.arch):
            family = load_family(name)
            cfg = family.default(gpu.arch, problem)
            ok, reason = family.can_implement(cfg, problem, gpu)
            if ok:
                why = "nothing tuned for this GPU and head_dim"
                return BestConfig(
                    name, cfg, "default", None, "; ".join([why, *rejected]) if rejected else why
                )
            rejected.append(f"default {name} rejected: {reason}")
        raise TunerError(
            f"no kernel can run {problem.key()} on {gpu.name} ({gpu.arch}): "
            + "; ".join(rejected or ["no family targets this arch"])
        )


_RESOLVER = _Resolver()


def db_url(db: str | None) -> str:
    """The database a lookup reads: `db`, else $TUNER_DB_URL, else the default SQLite file."""
    from tuner.store import default_db_url

    return db or os.environ.get("TUNER_DB_URL") or default_db_url()


@functools.lru_cache(maxsize=64)
def _stamped_files(url: str) -> tuple[Path, ...]:
    """The files whose stat() says a SQLite database changed (none for other backends); parsed
    once per URL, since the stamp is taken on every attention() call."""
    from tuner.store import sqlite_path

    path = sqlite_path(url)
    return () if path is None else (path, Path(f"{path}-wal"))


def clear_cache() -> None:
    """Forget memoized lookups, attention plans and fallback warnings (e.g. after writing a
    non-SQLite database)."""
    _RESOLVER.clear()
    _PLANS.clear()


@functools.cache
def _local_gpu_and_device(gpu: str):
    """(profile, fingerprint id) of the local GPU: fixed for the life of the process, so the
    device query and hashing run once, not on every lookup."""
    from tuner.gpus import device_fingerprint, fingerprint_id, resolve_gpu

    profile = resolve_gpu(gpu)
    return profile, fingerprint_id(device_fingerprint())


def load_best_config(
    seq_len: int,
    *,
    heads: int | None = None,
    head_dim: int = 128,
    batch: int | None = None,
    gpu: str = "auto",
    db: str | None = None,
    with_source: bool = False,
):
    """The config to run attention over `seq_len` tokens with on this GPU.

    Returns the family's Config; with `with_source=True`, a BestConfig that also says which
    family, where the config came from and which tuned seq_len it was taken from.
    """
    problem = Problem(batch or 1, heads or 1, seq_len, head_dim)
    profile, device_id = _local_gpu_and_device(gpu)
    best = _RESOLVER.resolve(problem, heads, batch, profile, db, device_id)
    return best if with_source else best.config


def family_of(config) -> str:
    """The family a Config belongs to (its package name under variants/)."""
    module = type(config).__module__
    parts = module.split(".")
    if parts[0] != "variants" or len(parts) < 2:
        raise TunerError(f"{type(config).__name__} from {module} is not a kernel family's Config")
    return parts[1]


def run_attention(q, k, v, softmax_scale, config_text: str, gpu: str, db, check_finite: bool):
    """The body of the custom op on real tensors: the plan (config pinned or looked up, its
    kernel compiled once), prepare and launch on the current stream."""
    if check_finite:
        from variants.prepare import check_finite_inputs

        check_finite_inputs(q, k, v)
    kernel = _plan(q, config_text, gpu, db)
    return kernel.run(kernel.prepare(q, k, v, softmax_scale, validate=False))


def run_attention_fp8(q, k, v, descales, softmax_scale, config_text: str, gpu: str, db):
    """attention_fp8's body: the same plan as bf16 inputs of this shape, without quantizing."""
    kernel = _plan(q, config_text, gpu, db)
    return kernel.run(kernel.prepare_fp8(q, k, v, descales, softmax_scale))


@dataclass
class _Plan:
    """What a repeated call of one shape reuses: its compiled kernel, and for a looked-up config
    the database stamp it was looked up under (a changed database re-plans)."""

    kernel: Any
    url: str | None
    stamp: tuple


# (shape, device, config text, gpu, db argument, $TUNER_DB_URL) -> _Plan. A hot call costs a dict
# lookup and two stat() calls instead of the lookup's Problem keys, URL parsing and GPU checks.
_PLANS: dict[tuple, _Plan] = {}


def _plan(q, config_text: str, gpu: str, db):
    key = (q.shape, q.device, config_text, gpu, db, os.environ.get("TUNER_DB_URL"))
    plan = _PLANS.get(key)
    if plan is not None and (plan.url is None or _Resolver._db_stamp(plan.url) == plan.stamp):
        return plan.kernel
    batch, seq_len, heads, head_dim = q.shape
    problem = Problem(batch, heads, seq_len, head_dim)
    url = stamp = None
    if config_text:
        family_name, config = _config_from_text(config_text)
    else:
        url = db_url(db)
        stamp = _Resolver._db_stamp(url)
        best = load_best_config(
            seq_len, heads=heads, head_dim=head_dim, batch=None, gpu=gpu, db=db, with_source=True
        )
        family_name, config = best.family, best.config
    kernel = _kernel_for(family_name, config, problem, gpu)
    _PLANS[key] = _Plan(kernel, url, stamp)
    return kernel


@functools.lru_cache(maxsize=256)
def _config_from_text(text: str):
    """(family, Config) of ops.config_key's text; parsed once per distinct config."""
    import json

    from variants import load_family

    doc = json.loads(text)
    return doc["family"], load_family(doc["family"]).Config.from_dict(doc["config"])


# The families' compile() caches builds too; this memo sits in front of it so that a hot call
# skips the GPU lookup, can_implement and the codegen-key hashing, not just the build.
_KERNELS: dict[tuple, Any] = {}


def _kernel_for(family_name: str, config, problem: Problem, gpu: str):
    key = (family_name, config, problem)
    kernel = _KERNELS.get(key)
    if kernel is None:
        from tuner.gpus import resolve_gpu
        from variants import load_family

        family = load_family(family_name)
        profile = resolve_gpu(gpu)
        ok, reason = family.can_implement(config, problem, profile)
        if not ok:
            raise TunerError(
                f"config {config} cannot run {problem.key()} on {profile.name}: {reason}"
            )
        kernel = _KERNELS[key] = family.compile(config, problem, profile.arch)
    return kernel
