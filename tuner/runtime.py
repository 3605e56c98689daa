"""What user code calls: `load_best_config(seq_len)` and `attention(q, k, v)`.

Lookup order for a problem on the local GPU (DESIGN.md; README states the same):
  1. the results database: the winner nearest to the problem (the rule below) among winners
     with the same mask (causal or not: never the other), the same head_dim, and the same heads
     (and batch) when given,
  2. the shipped table db/tables/<gpu>.yaml, same matching,
  3. only where a head count was given and no winner of a source has it: that
     source's winner nearest by work, the database's first (`db-nearest-work`, then
     `table-nearest-work`),
  4. the family default for the arch.
Every candidate is re-checked with can_implement on the local GPU before it is returned; a
fallback (anything but an exact database hit) is logged once per key with its source, never
silent. With `max_error`, steps 1-3 take only winners whose stored end-to-end error
(tuner/budget.py) is at most it, logging a nearer one passed over; a winner without a stored
error, and the default, are used as unknown, and the log says so (docs/tables-and-database.md).

The nearest winner (`_nearest`), in order of preference, each deciding only among the winners
the previous ones left level:
  a. the same group size (query heads per KV head),
  b. the same kind: self-attention (seq_len_kv == seq_len) or cross-attention,
  c. for a cross-attention problem, among cross-attention winners, the same key/value length
     (a self-attention winner whose length happens to equal it is no nearer: on the H200 the
     B=2 S=1024 H=24 winner, 192-key strips, ran B=2 Sq=4608 Skv=1024 in 0.194 ms against
     0.167 for the S=4608 one, docs/tables-and-database.md),
  d. the least distance on a log scale in both lengths: the ratio max/min of the query
     lengths times that of the key/value lengths (for self-attention: of seq_len alone), exact,
  e. on a tie (2048 and 8192 for 4096), the longer query, then the longer key/value length:
     their tiles are the more conservative choice; then the order the source lists them in.
Nearest by work (`_nearest_by_work`) takes a, b, then the least product of the ratio of work
and the ratio of key/value lengths, where work is batch x heads x ceil(seq_len / 128), the query
tiles of 128 rows a grid holds (how the grid fills the SMs), and the key/value length is how
many strips each tile runs (what sets prepare's share and the pipeline's steady state: on an
H100 the B=4 S=1024 H=32 row, 1.25x off in work but 4x in keys, ran B=1 S=4096 H=40 about 1.2x
slower than the S=4096 H=56 row's config, docs/benchmarks.md), then d and e; batch and heads
need not match.

The lookup is memoized per key; a SQLite database is re-read only when its files change
(one stat() per file, on every load_best_config call). tuner.attention's plans read those stats
at most once per STAMP_INTERVAL_S (tuner/plans.py).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import threading
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from tuner.budget import check_max_error
from tuner.errors import TunerError
from tuner.plans import CALLS, SDPA_CALLS, CallPlan
from tuner.problem import Problem, preferred_per_problem

log = logging.getLogger("tuner.runtime")

TABLES_DIR = Path(__file__).resolve().parents[1] / "db" / "tables"
# Query rows per tile in the work measure of the head-count fallback: the default tile of both
# families at head_dim 128 (wgmma: 2 consumer warpgroups of 64 rows; mma_sync: 128 rows).
WORK_TILE_ROWS = 128


@dataclass(frozen=True)
class BestConfig:
    """A config and its source: db-exact, db-nearest, table-exact, table-nearest,
    db-nearest-work, table-nearest-work or default; `tuned_problem` is the problem it was tuned
    for (None for the default)."""

    family: str
    config: Any
    source: str
    detail: str = ""
    tuned_problem: Problem | None = None
    e2e_error: float | None = None  # the winner's stored end-to-end error (None: unknown)

    @property
    def tuned_seq_len(self) -> int | None:
        return None if self.tuned_problem is None else self.tuned_problem.seq_len


def _log_distance(a: int, b: int) -> Fraction:
    """|log a - log b|, as the ratio max/min it is a monotone function of: exact, so that a tie
    is a tie (in floats, log 4096 - log 2048 and log 8192 - log 4096 differ by an ulp)."""
    return Fraction(max(a, b), min(a, b))


def _same_mask_and_dim(tuned: Problem, want: Problem) -> bool:
    # A causal kernel skips and masks strips a full one computes: neither stands in for the
    # other. head_dim is a compile-time shape of every kernel.
    return tuned.causal == want.causal and tuned.head_dim == want.head_dim


def _preferences(tuned: Problem, want: Problem) -> tuple:
    """Rules a to c of the module docstring: False sorts first."""
    other_kv_len = (not want.self_attention and not tuned.self_attention
                    and tuned.seq_len_kv != want.seq_len_kv)
    return (tuned.group != want.group, tuned.self_attention != want.self_attention, other_kv_len)


def _length_distance(tuned: Problem, want: Problem) -> Fraction:
    """Rule d: for self-attention the square of the seq_len ratio, which orders as it does."""
    return (_log_distance(tuned.seq_len, want.seq_len)
            * _log_distance(tuned.seq_len_kv, want.seq_len_kv))


def _longer_first(tuned: Problem) -> tuple[int, int]:
    return -tuned.seq_len, -tuned.seq_len_kv


def work(problem: Problem) -> int:
    """batch x heads x ceil(seq_len / WORK_TILE_ROWS): the query tiles of the problem's grid."""
    return problem.batch * problem.heads * -(-problem.seq_len // WORK_TILE_ROWS)


def nearest_first(
    candidates: list[tuple[Problem, str, dict]], want: Problem, heads: int | None = None,
    batch: int | None = None,
) -> list:
    """The (problem, family, config, ...) entries with the mask and head_dim of `want` (and the
    heads/batch if given), nearest first by rules a-e of the module docstring."""
    usable = [
        c
        for c in candidates
        if _same_mask_and_dim(c[0], want)
        and (heads is None or c[0].heads == heads)
        and (batch is None or c[0].batch == batch)
    ]
    return sorted(usable, key=lambda c: (*_preferences(c[0], want),
                                         _length_distance(c[0], want), *_longer_first(c[0])))


def nearest_by_work_first(candidates: list[tuple[Problem, str, dict]], want: Problem) -> list:
    """The head-count fallback: the entries with the mask and head_dim of `want`, whatever
    their batch and heads, nearest first by rules a, b, the work ratio times the key/value
    length ratio, then d and e."""
    usable = [c for c in candidates if _same_mask_and_dim(c[0], want)]
    return sorted(usable, key=lambda c: (*_preferences(c[0], want)[:2],
                                         _log_distance(work(c[0]), work(want))
                                         * _log_distance(c[0].seq_len_kv, want.seq_len_kv),
                                         _length_distance(c[0], want), *_longer_first(c[0])))


def _nearest(candidates, want: Problem, heads: int | None, batch: int | None):
    """The first of nearest_first (sorted is stable: on a full tie, the source's order); None
    if none."""
    return next(iter(nearest_first(candidates, want, heads, batch)), None)


def _nearest_by_work(candidates, want: Problem):
    return next(iter(nearest_by_work_first(candidates, want)), None)


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
        max_error: float | None = None,
    ) -> BestConfig:
        url = db_url(db)
        key = (problem, heads, batch, gpu.name, url, device_id, max_error)
        stamp = self._db_stamp(url)
        hit = self._memo.get(key)
        if hit is not None and hit[0] == stamp:
            return hit[1]
        best, noted = self._lookup(problem, heads, batch, gpu, url, device_id, max_error)
        with self._lock:
            self._memo[key] = (stamp, best)
            if (best.source != "db-exact" or noted) and key not in self._warned:
                self._warned.add(key)
                log.warning(
                    "tuner: %s on %s: using %s config (%s)",
                    problem.key(),
                    gpu.name,
                    best.source,
                    best.detail,
                )
        return best

    def _lookup(self, problem, heads, batch, gpu, url, device_id, max_error):
        """(the BestConfig, whether its detail holds something max_error made worth logging)."""
        rejected, passed = [], []
        found = self._first(problem, heads, batch, gpu, url, device_id, max_error, rejected,
                            passed)
        if max_error is not None and found.e2e_error is None:
            passed.append(f"its end-to-end error is not stored: unknown against max_error="
                          f"{max_error:g}")
        if passed:
            found = dataclasses.replace(found, detail="; ".join([found.detail, *passed]))
        return found, bool(passed)

    def _first(self, problem, heads, batch, gpu, url, device_id, max_error, rejected, passed):
        for source, entry in self._candidates(problem, heads, batch, gpu, url, device_id,
                                              max_error, passed):
            tuned_problem, family_name, config_dict, error = entry
            from variants import load_family

            family = load_family(family_name)
            cfg, filled = config_from_row(family, config_dict, problem, gpu)
            ok, reason = family.can_implement(cfg, problem, gpu)
            detail = f"tuned for {tuned_problem.key()}"
            if filled:
                detail += (f" before {', '.join(filled)} existed: the default's "
                           + ", ".join(f"{k}={getattr(cfg, k)}" for k in filled))
            if source.endswith("-nearest-work"):
                kind = source
                detail += (f", the nearest by work: {work(tuned_problem)} query tiles of "
                           f"{WORK_TILE_ROWS} rows for {work(problem)}, no winner with "
                           f"{problem.heads} heads")
            else:
                exact = (tuned_problem.seq_len, tuned_problem.seq_len_kv, tuned_problem.group) \
                    == (problem.seq_len, problem.seq_len_kv, problem.group)
                kind = f"{source}-{'exact' if exact else 'nearest'}"
            if ok:
                return BestConfig(
                    family_name,
                    cfg,
                    kind,
                    detail + ("; " + "; ".join(rejected) if rejected else ""),
                    tuned_problem,
                    error,
                )
            rejected.append(f"{kind} {family_name} rejected: {reason}")
        return self._default(problem, gpu, rejected)

    def _candidates(self, problem, heads, batch, gpu, url, device_id, max_error, passed):
        """Yield (source, (problem, family, config, e2e_error)) in lookup order: the database's
        nearest, the table's, then (heads given, and none with them) each one's nearest by work;
        with max_error, of the winners within it, and the nearest of a source passed over for
        its error described in `passed`."""
        sources = {"db": lambda keep: self._db_winners(url, device_id, keep),
                   "table": lambda keep: self._table_entries(gpu, keep)}
        keep = None if max_error is None else (lambda e: e is None or e <= max_error)
        without_heads = {}
        for name, read in sources.items():
            entries = read(keep)
            found = _nearest(entries, problem, heads, batch)
            if keep is not None:
                nearest = _nearest(read(None), problem, heads, batch)
                if nearest is not None and not keep(nearest[3]):
                    passed.append(f"passed over the {name} winner {nearest[1]} for "
                                  f"{nearest[0].key()}: end-to-end error {nearest[3]:.4g} > "
                                  f"max_error={max_error:g}")
            if found:
                yield name, found
            elif heads is not None and entries:
                without_heads[name] = entries
        for name, entries in without_heads.items():
            found = _nearest_by_work(entries, problem)
            if found:
                yield f"{name}-nearest-work", found

    @staticmethod
    def _db_winners(url, device_id, keep=None) -> list[tuple[Problem, str, dict, float | None]]:
        """(problem, family, config, e2e_error) of the winner that runs of each problem, among
        those whose e2e_error `keep` keeps (None: all)."""
        if device_id is None:
            return []
        from tuner.store import NoResults, Store, sqlite_path

        path = sqlite_path(url)
        if path is not None and not path.exists():  # never create an empty database on lookup
            return []
        try:
            store = Store(url, readonly=True)
        except NoResults:  # an empty file (say): no winners, on to the table
            return []
        try:
            winners = store.winners(device_id)
        finally:
            store.close()
        winners = [w for w in winners if keep is None or keep(w.trial.e2e_error)]
        return [(Problem.from_key(w.problem_key), w.family, w.config, w.trial.e2e_error)
                for w in preferred_per_problem(winners, lambda w: w.problem_key,
                                               lambda w: w.stored_time)]

    @staticmethod
    def _table_entries(gpu, keep=None) -> list[tuple[Problem, str, dict, float | None]]:
        from tuner.tables import load_table_entries

        table = table_path(gpu)
        if not table.exists():
            return []
        return load_table_entries(table, None if keep is None else
                                  lambda e: keep(e.fields.get("e2e_error")))

    @staticmethod
    def _default(problem, gpu, rejected) -> BestConfig:
        from variants import families_for_arch, load_family

        # Nothing tuned: the preferred family of the arch (wgmma on Hopper), then the others.
        for name in families_for_arch(gpu.arch):
            family = load_family(name)
            cfg = family.default(gpu.arch, problem)
            ok, reason = family.can_implement(cfg, problem, gpu)
            if ok:
                why = "nothing tuned for this GPU, head_dim and mask"
                return BestConfig(
                    name, cfg, "default", "; ".join([why, *rejected]) if rejected else why
                )
            rejected.append(f"default {name} rejected: {reason}")
        raise TunerError(
            f"no kernel can run {problem.key()} on {gpu.name} ({gpu.arch}): "
            + "; ".join(rejected or ["no family targets this arch"])
        )


def table_path(gpu) -> Path:
    """The tuning table shipped for a GPU profile (it may not exist)."""
    return TABLES_DIR / f"{gpu.name}.yaml"


def config_from_row(family, config_dict: dict, problem: Problem, gpu) -> tuple[Any, list[str]]:
    """The Config of a table or database row, and the prepare-only knobs (PREPARE_ONLY_KNOBS)
    it was written without. Such a row predates prepare's exact transforms: it takes the family
    default's values for them, as an untuned problem would, rather than "off". The kernel is the
    same build either way (the knobs change prepare only), and the default's K smoothing is what
    keeps realistic activations accurate (docs/accuracy.md). A value that does not fit the row's
    kernel (can_implement) stays off."""
    from variants.base import PREPARE_ONLY_KNOBS

    cfg = family.Config.from_dict(config_dict)
    missing = [k for k in PREPARE_ONLY_KNOBS if k not in config_dict and hasattr(cfg, k)]
    filled = []
    if missing:
        default = family.default(gpu.arch, problem)
        for knob in missing:  # PREPARE_ONLY_KNOBS' order: K smoothing first
            value = getattr(default, knob)
            trial = dataclasses.replace(cfg, **{knob: value})
            if value != getattr(cfg, knob) and family.can_implement(trial, problem, gpu)[0]:
                cfg = trial
                filled.append(knob)
    return cfg, filled


_RESOLVER = _Resolver()
# What the lookup reads, for a search that starts from it (tuner/search/known.py):
# (problem, family, config dict, e2e_error) of the shipped table of a GPU profile, and of the
# winners of a device in the database at a URL.
table_entries = _Resolver._table_entries
db_entries = _Resolver._db_winners


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
    """Forget memoized lookups, attention plans and fallback warnings: the next call reads the
    database again (e.g. after writing a non-SQLite database, or within STAMP_INTERVAL_S of a
    change: tuner/plans.py)."""
    _RESOLVER.clear()
    _PLANS.clear()
    CALLS.clear()
    SDPA_CALLS.clear()


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
    seq_len_kv: int | None = None,
    kv_heads: int | None = None,
    causal: bool = False,
    gpu: str = "auto",
    db: str | None = None,
    with_source: bool = False,
    max_error: float | None = None,
):
    """The config to run attention over `seq_len` query tokens with on this GPU.

    heads and batch, when given, must match a winner's (else the nearest by work, module
    docstring); None matches any. seq_len_kv (None: seq_len) and kv_heads (None: heads) pick
    the nearest winner by the module docstring's rules; causal must match exactly. Returns the
    family's Config; with `with_source=True`, a BestConfig that also says which family, where
    the config came from and which tuned problem it was taken from. max_error passes over
    winners whose stored end-to-end error is above it (module docstring).
    """
    if kv_heads is not None and heads is None:
        raise TunerError(f"kv_heads={kv_heads} needs heads: the group size is heads // kv_heads; "
                         "pass heads= as well")
    problem = Problem(batch or 1, heads or 1, seq_len, head_dim, causal, seq_len_kv, kv_heads)
    max_error = None if max_error is None else check_max_error(max_error)
    profile, device_id = _local_gpu_and_device(gpu)
    best = _RESOLVER.resolve(problem, heads, batch, profile, db, device_id, max_error)
    return best if with_source else best.config


def config_for_problem(problem: Problem, *, gpu: str = "auto", db: str | None = None,
                       max_error: float | None = None) -> BestConfig:
    """The BestConfig tuner.attention runs `problem` with: a winner with its heads (any batch),
    else the nearest by work, where the problem's own batch counts, else the default."""
    max_error = None if max_error is None else check_max_error(max_error)
    profile, device_id = _local_gpu_and_device(gpu)
    return _RESOLVER.resolve(problem, problem.heads, None, profile, db, device_id, max_error)


def family_of(config) -> str:
    """The family a Config belongs to (its package name under variants/)."""
    module = type(config).__module__
    parts = module.split(".")
    if parts[0] != "variants" or len(parts) < 2:
        raise TunerError(f"{type(config).__name__} from {module} is not a kernel family's Config")
    return parts[1]


def checked_plan(q, k, v, config_text: str, gpu: str, db, check_finite: bool,
                 causal: bool = False, max_error: float | None = None) -> CallPlan:
    """The plan of a call on real tensors (config pinned or looked up, its kernel compiled
    once), after the finite scan where the caller asked for it."""
    if check_finite:
        from variants.input_checks import check_finite_inputs

        check_finite_inputs(q, k, v)
    return attention_plan(q, k, causal, config_text, gpu, db, max_error)


def run_attention(q, k, v, softmax_scale, config_text: str, gpu: str, db, check_finite: bool,
                  causal: bool = False, max_error: float | None = None,
                  want_lse: bool = True):
    """The body of the custom op on real tensors: checked_plan's launches on the current
    stream. want_lse=False: the caller drops the LSE, so K smoothing's shift is not added back
    (CompiledKernel.run)."""
    return checked_plan(q, k, v, config_text, gpu, db, check_finite, causal, max_error).run(
        q, k, v, softmax_scale, want_lse)


def run_attention_fp8(q, k, v, descales, softmax_scale, config_text: str, gpu: str, db,
                      causal: bool = False):
    """attention_fp8's body: the same plan as bf16 inputs of this shape, without quantizing
    (the config's for_q_dtype twin: prepare's transforms off). No max_error: a stored error is
    measured from bf16 inputs through prepare, which the caller's codes skip."""
    kernel = attention_plan(q, k, causal, config_text, gpu, db).kernel
    return kernel.run(kernel.prepare_fp8(q, k, v, descales, softmax_scale))


# (q shape, k shape, q dtype, causal, device, config text, gpu, db argument, max_error) ->
# CallPlan (tuner/plans.py, which says when a looked-up plan re-reads its database).
_PLANS: dict[tuple, CallPlan] = {}


def problem_of(q, k, causal: bool = False) -> Problem:
    """The Problem of q (batch, seq_len, heads, head_dim) and k (batch, seq_len_kv, kv_heads,
    head_dim), shapes checked by variants.prepare.check_qkv."""
    batch, seq_len, heads, head_dim = q.shape
    return Problem(batch, heads, seq_len, head_dim, causal, seq_len_kv=k.shape[1],
                   kv_heads=k.shape[2])


def attention_plan(q, k, causal: bool, config_text: str, gpu: str, db,
                   max_error=None) -> CallPlan:
    """The CallPlan of q's and k's shapes, dtype and device with this config text (ops.config_key;
    "" looks the config up): made once, and for a looked-up config made again when its database
    or $TUNER_DB_URL changed (checked once the plan is STAMP_INTERVAL_S old)."""
    # q's dtype: a config may read bf16 q only (wgmma q_quant=kernel); an fp16 or FP8 q runs
    # its twin that quantizes or lays out q in prepare (Config.for_q_dtype).
    key = (q.shape, k.shape, q.dtype, causal, q.device, config_text, gpu, db, max_error)
    plan = _PLANS.get(key)
    if plan is not None:
        if plan.fresh():
            return plan
        url = db_url(db)
        if url == plan.url and _Resolver._db_stamp(url) == plan.stamp:
            plan.refresh()
            return plan
    problem = problem_of(q, k, causal)
    url = stamp = None
    if config_text:
        family_name, config = _config_from_text(config_text)
    else:
        url = db_url(db)
        stamp = _Resolver._db_stamp(url)
        best = config_for_problem(problem, gpu=gpu, db=db, max_error=max_error)
        family_name, config = best.family, best.config
    config = config.for_q_dtype(str(q.dtype).removeprefix("torch."))
    kernel = _kernel_for(family_name, config, problem, gpu)
    # The same kernel after a database change: its launch plan still holds.
    launch = plan.launch if plan is not None and plan.kernel is kernel else None
    _PLANS[key] = plan = CallPlan(kernel, url, stamp, launch)
    return plan


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
