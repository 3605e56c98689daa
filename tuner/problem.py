"""The attention problem a kernel is tuned for, with a stable key for caches and the database."""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import asdict, dataclass

from tuner.errors import TunerError

# head_dim values some family generates: the kernels' statement (variants/base.py), not ours.
from variants.base import HEAD_DIMS as SUPPORTED_HEAD_DIMS

# Upper bounds of the other dimensions, the sane range a user-given number must fall in (a
# larger one is a typo, and would otherwise overflow a launch argument or a database column):
# batch and heads are grid dimensions of the mma_sync launch (CUDA caps gridDim.y and .z at
# 65535); seq_len and its padded length are 32-bit launch arguments (2**30 leaves room for the
# padding, and is 35000x the longest sequence tuned so far). All fit PostgreSQL's 32-bit INTEGER.
# The key/value length and head count take the bounds of their query counterparts.
MAX_DIMS = {"batch": 65535, "heads": 65535, "seq_len": 2**30, "seq_len_kv": 2**30,
            "kv_heads": 65535}

# b<batch>-h<heads>-s<seq_len>-d<head_dim>-<full|causal>, then only the fields that differ from
# self-attention over all heads, in this order: -kvh<kv_heads> (grouped KV heads) and
# -kv<seq_len_kv> (another key/value length). Keys written before those fields existed are the
# same text for the same problem, so databases and tables keep their keys.
_KEY = re.compile(r"b(\d+)-h(\d+)-s(\d+)-d(\d+)-(full|causal)(?:-kvh(\d+))?(?:-kv(\d+))?")


def check_dimension(name: str, value) -> None:
    """One problem dimension (batch, heads, seq_len, head_dim, seq_len_kv, kv_heads) is an int
    in its range."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TunerError(f"Problem.{name} must be an int, got {value!r}")
    if value < 1:
        raise TunerError(
            f"Problem.{name} must be >= 1, got {value}; "
            "an empty attention has nothing to compute, skip the call instead"
        )
    if name in MAX_DIMS and value > MAX_DIMS[name]:
        raise TunerError(f"Problem.{name} must be <= {MAX_DIMS[name]}, got {value}")
    if name == "head_dim" and value not in SUPPORTED_HEAD_DIMS:
        raise TunerError(
            f"head_dim {value} is not supported; supported: {SUPPORTED_HEAD_DIMS} "
            "(pad the head dimension with zeros to the next supported size)"
        )


@dataclass(frozen=True)
class Problem:
    """Attention forward: q (batch, seq_len, heads, head_dim) against k, v (batch, seq_len_kv,
    kv_heads, head_dim).

    `seq_len` is the query length (also `seq_len_q`); `seq_len_kv` None means seq_len
    (self-attention) and `kv_heads` None means heads (one KV head per query head); both are
    stored resolved, so Problem(1, 8, 64) == Problem(1, 8, 64, seq_len_kv=64, kv_heads=8).
    Query head h reads KV head h // group, group = heads // kv_heads (grouped-query attention).
    `causal` masks aligned to the bottom right, as FlashAttention defines it: query i sees the
    keys j <= i + seq_len_kv - seq_len, so the last query sees every key, and when
    seq_len > seq_len_kv the first seq_len - seq_len_kv queries see none (their output is 0 and
    their LSE -inf). Whether a kernel implements a problem is its family's can_implement's call.
    """

    batch: int
    heads: int
    seq_len: int
    head_dim: int = 128
    causal: bool = False
    seq_len_kv: int | None = None
    kv_heads: int | None = None

    def __post_init__(self) -> None:
        for name in ("batch", "heads", "seq_len", "head_dim"):
            check_dimension(name, getattr(self, name))
        if not isinstance(self.causal, bool):
            raise TunerError(f"Problem.causal must be a bool, got {self.causal!r}")
        # Frozen: resolve the defaults in place, so that equal problems compare and hash equal.
        if self.seq_len_kv is None:
            object.__setattr__(self, "seq_len_kv", self.seq_len)
        if self.kv_heads is None:
            object.__setattr__(self, "kv_heads", self.heads)
        check_dimension("seq_len_kv", self.seq_len_kv)
        check_dimension("kv_heads", self.kv_heads)
        if self.heads % self.kv_heads:
            raise TunerError(
                f"Problem.kv_heads={self.kv_heads} does not divide heads={self.heads}: each KV "
                "head serves a whole group of query heads; use a divisor of heads "
                "(kv_heads == heads is plain multi-head attention)"
            )

    @property
    def seq_len_q(self) -> int:
        return self.seq_len

    @property
    def group(self) -> int:
        """Query heads per KV head (1: multi-head attention)."""
        return self.heads // self.kv_heads

    @property
    def self_attention(self) -> bool:
        """Keys and values as long as the queries (they may still have fewer heads)."""
        return self.seq_len_kv == self.seq_len

    def key(self) -> str:
        """Stable text key: the same problem always maps to the same string, across versions
        (a self-attention problem over all heads keeps the key it had before kv_heads and
        seq_len_kv existed)."""
        mask = "causal" if self.causal else "full"
        key = f"b{self.batch}-h{self.heads}-s{self.seq_len}-d{self.head_dim}-{mask}"
        if self.kv_heads != self.heads:
            key += f"-kvh{self.kv_heads}"
        if self.seq_len_kv != self.seq_len:
            key += f"-kv{self.seq_len_kv}"
        return key

    @classmethod
    def from_key(cls, key: str) -> Problem:
        """The problem of key(); only the canonical text is accepted (a field at its default
        spelled out, say -kvh56 for 56 heads, is another string for the same problem, and
        would split one problem's rows in the database)."""
        match = _KEY.fullmatch(key) if isinstance(key, str) else None
        if match is None:
            raise TunerError(f"malformed problem key {key!r}; expected e.g. "
                             "'b1-h56-s4096-d128-full' or 'b1-h32-s8192-d128-causal-kvh8-kv512'")
        b, h, s, d, mask, kv_heads, seq_len_kv = match.groups()
        problem = cls(int(b), int(h), int(s), int(d), mask == "causal",
                      seq_len_kv=int(seq_len_kv) if seq_len_kv else None,
                      kv_heads=int(kv_heads) if kv_heads else None)
        if problem.key() != key:
            raise TunerError(f"problem key {key!r} is not in canonical form; it is written "
                             f"{problem.key()!r}")
        return problem

    @property
    def visible_pairs(self) -> float:
        """(query, key) pairs a head computes, in the convention FLOP counts use: the full
        seq_len x seq_len_kv, or with the causal mask the area of the visible region
        {(x, y) in [0, Sq] x [0, Skv]: y <= x + Skv - Sq} of the continuous square:
          Sq <= Skv: Sq * Skv - Sq^2 / 2   (Sq = Skv: exactly half the square, FA's "causal
                                            halves the count"; FA3's benchmark formula
                                            Sq * (Skv + max(0, Skv - Sq)) / 2 is the same here)
          Sq >  Skv: Skv^2 / 2             (only the last Skv rows see keys; FA3's formula
                                            gives Sq * Skv / 2, counting the empty rows)
        The discrete count of pairs with j <= i + Skv - Sq (0-based) exceeds this by
        min(Sq, Skv) / 2: the diagonal's half cells, 1 / (2 S) relative at equal lengths
        (0.006% at S = 8192), left out so that TFLOP/s compare with FlashAttention's."""
        sq, skv = self.seq_len, self.seq_len_kv
        if not self.causal:
            return float(sq) * skv
        if sq <= skv:
            return float(sq) * skv - sq * sq / 2
        return skv * skv / 2

    @property
    def flops(self) -> float:
        """Matmul FLOPs of the forward: 2 GEMMs of 2 * D FLOPs per visible (query, key) pair and
        query head, 4 * B * H * Sq * Skv * D without a mask (the usual FA count)."""
        return 4.0 * self.batch * self.heads * self.head_dim * self.visible_pairs

    def tflops(self, ms: float) -> float:
        return self.flops / (ms * 1e-3) / 1e12

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class StoredTime:
    """What ranks one problem's winners of several family sets against each other: the winner's
    time, when its search decided, and the code that measured it (records.code_version: a hash
    of the family's source and the measuring code; None where nothing recorded it)."""

    median_ms: float | None
    decided_at: dt.datetime | None = None
    code_version: str | None = None


def preferred_per_problem(items, problem_key, stored_time) -> list:
    """The winner that runs of each problem, in the order the problems first appear, where a
    problem holds winners of several family sets (a search over wgmma alone beside one over both
    families). `problem_key(item)` names the problem, `stored_time(item)` is its StoredTime.

    Times of two searches are compared only where the same code measured both: a kernel edited
    since an earlier search runs at another speed than the time stored for it. So the newest
    decision's code version ranks: the fastest winner measured by that code (a missing time
    last); a winner measured by other code is not ranked by a time that code no longer gives.
    Where the newest decision records no code version (a table exported before the field), only
    winners decided at the same moment are compared with it, and undated ones with each other."""
    groups: dict = {}
    for item in items:
        groups.setdefault(problem_key(item), []).append(item)
    preferred = []
    for group in groups.values():
        times = [stored_time(item) for item in group]
        newest = max(times, key=lambda t: _date_rank(t.decided_at))
        comparable = [
            item for item, t in zip(group, times, strict=True)
            if (t.code_version == newest.code_version if newest.code_version is not None
                else t.decided_at == newest.decided_at)
        ]
        preferred.append(min(comparable, key=lambda item: _speed_rank(stored_time(item).median_ms)))
    return preferred


def _date_rank(decided_at: dt.datetime | None) -> tuple[bool, dt.datetime]:
    return decided_at is not None, decided_at or dt.datetime.min


def _speed_rank(ms: float | None) -> tuple[bool, float]:
    return ms is None, ms if ms is not None else 0.0
