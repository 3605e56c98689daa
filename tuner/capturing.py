"""`tuner.capture(path)`: record the q, k, v of a model's attention calls into one calibration file
(tuner/calibration.py) for `tuner search --calibration`.

    with tuner.capture("calib.safetensors", max_bytes=256 * 2**20):
        model(inputs)  # eager mode

Inside the block, calls of tuner.attention (and so tuner.scaled_dot_product_attention and
diffusers' attention routed through it) and of torch.nn.functional.scaled_dot_product_attention
(wrapped for the duration, restored after, also on an exception; it still computes) are recorded,
and written when the block exits without an exception. A call torch's SDPA makes that
the kernels cannot run (an attn_mask, dropout, a top-left causal mask over unequal lengths,
tuner.sdpa.unsupported) or whose head_dim no kernel supports is counted, not recorded. Code that
bound torch's function before the block (`from torch.nn.functional import
scaled_dot_product_attention`) calls the unwrapped one. Calls inside torch.compile'd code are
not recorded (capture eagerly); outside a capture the hook is one global check, so compiled code
sees no graph break.

Subsampling, so the file stays under `max_bytes` whatever the run's length. The accuracy check
needs whole sequences (a row's softmax runs over every key), so a call keeps up to
`slices_per_call` of its (batch, KV head) slices, chosen at random, each with its whole q of the
group of query heads and its whole k and v. Calls are reservoir-sampled per problem (Algorithm
R, up to `calls_per_problem`): each call of a problem is kept with equal probability, whatever
its position in the run. When the kept tensors would pass max_bytes, the problem holding the
most bytes drops one of its calls at random and keeps the smaller reservoir from then on (a
random subset of a uniform sample is a uniform sample); a call whose single slice is over
max_bytes is counted, not recorded.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import threading
from dataclasses import dataclass, field
from pathlib import Path

import torch

from tuner.errors import TunerError

log = logging.getLogger("tuner.capture")

DEFAULT_MAX_BYTES = 256 * 2**20
_DTYPES = {torch.bfloat16, torch.float16, torch.float32}


@dataclass
class _Kept:
    index: int  # the call's position among its problem's calls
    slices: list[tuple[int, int]]
    scale: float | None
    tensors: tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # CPU copies

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors)


@dataclass
class _Reservoir:
    capacity: int
    seen: int = 0
    kept: list[_Kept] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return sum(k.nbytes for k in self.kept)


class Recorder:
    """What a capture holds: one reservoir per problem key, and the calls it could not record
    (reason -> count). `record` is the hook of tuner.attention and of the wrapped SDPA."""

    def __init__(self, max_bytes: int, calls_per_problem: int, slices_per_call: int,
                 seed: int) -> None:
        self.max_bytes, self.calls_per_problem = max_bytes, calls_per_problem
        self.slices_per_call = slices_per_call
        self.problems: dict[str, _Reservoir] = {}
        self.skipped: dict[str, int] = {}
        self._rng = random.Random(seed)
        self._lock = threading.Lock()

    def _skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1

    def record(self, q, k, v, softmax_scale, causal: bool) -> None:
        """One call: q (batch, seq_len, heads, head_dim), k, v (batch, seq_len_kv, kv_heads,
        head_dim)."""
        if torch.compiler.is_compiling():
            return
        from tuner.problem import Problem

        with self._lock:
            if q.dtype not in _DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
                self._skip(f"dtype {q.dtype} (calls hold {', '.join(map(str, _DTYPES))})")
                return
            try:
                problem = Problem(q.shape[0], q.shape[2], q.shape[1], q.shape[3], causal,
                                  k.shape[1], k.shape[2])
            except TunerError as exc:
                self._skip(str(exc).split(";")[0])
                return
            pairs = [(b, g) for b in range(problem.batch) for g in range(problem.kv_heads)]
            one = (problem.seq_len * problem.group + 2 * problem.seq_len_kv) * \
                problem.head_dim * q.element_size()
            count = min(self.slices_per_call, len(pairs), self.max_bytes // one)
            if count < 1:
                self._skip(f"{problem.key()}: one (batch, KV head) slice is {one} bytes, over "
                           f"max_bytes={self.max_bytes}")
                return
            res = self.problems.setdefault(problem.key(), _Reservoir(self.calls_per_problem))
            res.seen += 1
            if len(res.kept) < res.capacity:
                at = len(res.kept)
            else:
                at = self._rng.randrange(res.seen)
                if at >= res.capacity:
                    return
            slices = sorted(self._rng.sample(pairs, count))
            kept = _Kept(res.seen - 1, slices, softmax_scale, _slices(q, k, v, slices, problem))
            if at < len(res.kept):
                res.kept[at] = kept
            else:
                res.kept.append(kept)
            self._fit()

    def _fit(self) -> None:
        """Drop calls until the total fits: from the problem holding the most bytes among those
        with two calls or more (every problem keeps one while it can), else the largest."""
        while sum(r.nbytes for r in self.problems.values()) > self.max_bytes:
            held = [r for r in self.problems.values() if r.kept]
            res = max(held, key=lambda r: (len(r.kept) > 1, r.nbytes))
            res.kept.pop(self._rng.randrange(len(res.kept)))
            res.capacity = len(res.kept)

    def write(self, path: Path) -> int:
        """Write the kept calls as a calibration file (atomically); returns how many."""
        from safetensors.torch import save_file

        from tuner.calibration import FORMAT, FORMAT_VERSION
        from tuner.problem import Problem

        tensors, calls = {}, []
        for key, res in sorted(self.problems.items()):
            for kept in sorted(res.kept, key=lambda c: c.index):
                name = f"c{len(calls)}"
                calls.append({"name": name, "problem": key, "softmax_scale": kept.scale,
                              "causal": Problem.from_key(key).causal,
                              "slices": kept.slices, "call_index": kept.index,
                              "calls_seen": res.seen})
                tensors.update({f"{name}.{p}": t for p, t in zip("qkv", kept.tensors,
                                                                 strict=True)})
        metadata = {"format": FORMAT, "format_version": FORMAT_VERSION,
                    "calls": json.dumps(calls)}
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            save_file(tensors, str(tmp), metadata=metadata)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        return len(calls)


def _slices(q, k, v, slices, problem) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """CPU copies of the (batch, KV head) `slices`: q (n, seq_len, group, head_dim), k and v
    (n, seq_len_kv, 1, head_dim)."""
    g = problem.group
    qs = torch.stack([q[b, :, h * g:(h + 1) * g] for b, h in slices])
    ks, vs = (torch.stack([x[b, :, h:h + 1] for b, h in slices]) for x in (k, v))
    return tuple(t.detach().to("cpu", copy=True).contiguous() for t in (qs, ks, vs))


def _sdpa_hook(original, recorder: Recorder):
    """torch's SDPA, recording the calls the kernels could run, then computing as before."""
    import functools

    from tuner.integrations.routing import routes
    from tuner.sdpa import unsupported

    @functools.wraps(original)
    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
             enable_gqa=False, **kwargs):
        why = (f"arguments {sorted(kwargs)}" if kwargs else
               unsupported(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa))
        if why is None and routes(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa):
            pass  # a model integration sends it to tuner.attention, which records it
        elif why is None:
            recorder.record(*(t.transpose(1, 2) for t in (query, key, value)), scale,
                            bool(is_causal))
        else:
            with recorder._lock:
                recorder._skip(f"torch SDPA: {why.split(';')[0].split(':')[0]}")
        return original(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                        is_causal=is_causal, scale=scale, enable_gqa=enable_gqa, **kwargs)

    return sdpa


@contextlib.contextmanager
def capture(path, *, max_bytes: int = DEFAULT_MAX_BYTES, calls_per_problem: int = 16,
            slices_per_call: int = 4, seed: int = 0):
    """Record attention calls made inside the block into the calibration file `path` (module
    docstring); yields the Recorder (its `problems` and `skipped` say what was kept)."""
    from tuner import api

    path = Path(path)
    for name, value in (("max_bytes", max_bytes), ("calls_per_problem", calls_per_problem),
                        ("slices_per_call", slices_per_call)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise TunerError(f"tuner.capture: {name} must be a positive int, got {value!r}")
    if not path.parent.is_dir():
        raise TunerError(f"tuner.capture: no directory {path.parent} to write {path.name} into; "
                         "create it first")
    if api._CAPTURE is not None:
        raise TunerError("tuner.capture: a capture is already active; nest no captures (one "
                         "file per run)")
    recorder = Recorder(max_bytes, calls_per_problem, slices_per_call, seed)
    # torch lists its overridable functions by name once per process (cached): listed while the
    # hook stands in, torch's SDPA would be missing for good, and torch.compile would stop
    # handing its calls to torch function modes (a model integration's router).
    torch.overrides.get_overridable_functions()
    functional = torch.nn.functional
    original = functional.scaled_dot_product_attention
    functional.scaled_dot_product_attention = _sdpa_hook(original, recorder)
    api._CAPTURE = recorder
    try:
        yield recorder
    finally:
        api._CAPTURE = None
        functional.scaled_dot_product_attention = original
    skipped = "; ".join(f"{n} x {why}" for why, n in recorder.skipped.items())
    if not any(r.kept for r in recorder.problems.values()):
        raise TunerError(
            f"tuner.capture: no attention call recorded, {path} not written"
            + (f" (not recordable: {skipped})" if skipped else "")
            + ": run the model inside the block, eagerly (calls inside torch.compile'd code are "
            "not recorded)")
    written = recorder.write(path)
    log.info("tuner.capture: %d calls of %d problems written to %s%s", written,
             len(recorder.problems), path, f" (not recorded: {skipped})" if skipped else "")
