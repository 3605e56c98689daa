"""What a repeated tuner.attention call reuses: its CallPlan, found by one dict lookup.

A CallPlan holds the compiled kernel of one signature (the shapes, dtypes and devices of q, k and
v, the mask, the config or the lookup's arguments), its LaunchPlan (variants/launch_plan.py: the
launches with everything the shapes decide computed once, made by the first call that runs), and
for a looked-up config the database URL and stamp it was looked up under.

Three maps lead to it. `CALLS` is tuner.attention's: keyed by the whole signature, filled by a
call that passed every check (tuner/api.py), so a repeated call skips the checks, the lookup and
prepare's per-call decisions. `SDPA_CALLS` is the SDPA drop-in's (tuner/sdpa.py), keyed by its
own arguments: a repeated drop-in call also skips its argument checks and the transposes to the
kernels' layout. tuner.runtime's map (keyed as its lookup needs) serves the custom op and
attention_fp8 and makes the plans.

Staleness: a hot call never stats the database. A looked-up plan is fresh for STAMP_INTERVAL_S
after its database stamp (the SQLite file and WAL sizes and times) and $TUNER_DB_URL were last
read; the first call after that takes the checked path, which re-reads both and re-plans if
either changed. So a changed database, or $TUNER_DB_URL, is seen by tuner.attention within
STAMP_INTERVAL_S, and at once after tuner.runtime.clear_cache(). A pinned config never goes
stale.
"""

from __future__ import annotations

import math
import time

# How long a looked-up plan runs without re-reading its database's stamp (module docstring): two
# stat() calls once a second instead of on every call (~3 us each on the hosts measured).
STAMP_INTERVAL_S = 1.0

# tuner.attention's signature (tuner/api.py) -> CallPlan.
CALLS: dict[tuple, CallPlan] = {}
# The SDPA drop-in's signature (tuner/sdpa.py) -> the CallPlan of its transposed call.
SDPA_CALLS: dict[tuple, CallPlan] = {}

_monotonic = time.monotonic


class CallPlan:
    """`plan(q, k, v, softmax_scale, want_lse, keep_lse)` -> (out, lse or None), or None where
    the call must take `run` (no LaunchPlan yet, inputs its launches do not take, or stale)."""

    __slots__ = ("_tried", "fresh_until", "kernel", "launch", "stamp", "url")

    def __init__(self, kernel, url: str | None = None, stamp: tuple | None = None,
                 launch=None) -> None:
        self.kernel, self.url, self.stamp, self.launch = kernel, url, stamp, launch
        self._tried = launch is not None
        self.fresh_until = math.inf if url is None else _monotonic() + STAMP_INTERVAL_S

    def __call__(self, q, k, v, softmax_scale, want_lse: bool, keep_lse: bool):
        launch = self.launch
        if launch is None or _monotonic() >= self.fresh_until:
            return None
        return launch(q, k, v, softmax_scale, want_lse, keep_lse)

    def heads_first(self, query, key, value, softmax_scale):
        """The SDPA drop-in's call on (batch, heads, seq_len, head_dim) tensors
        (LaunchPlan.heads_first): the output in that layout, or None as for __call__."""
        launch = self.launch
        if launch is None or _monotonic() >= self.fresh_until:
            return None
        return launch.heads_first(query, key, value, softmax_scale)

    def fresh(self) -> bool:
        """Whether the plan may run without re-reading its database's stamp."""
        return _monotonic() < self.fresh_until

    def refresh(self) -> None:
        """The stamp was read again and matched: fresh for another STAMP_INTERVAL_S."""
        self.fresh_until = _monotonic() + STAMP_INTERVAL_S

    def run(self, q, k, v, softmax_scale, want_lse: bool, keep_lse: bool = True):
        """The call: the launch plan where it takes the inputs, else prepare + run (whose first
        call makes the launch plan). (out, lse); lse None only for keep_lse=False."""
        result = self(q, k, v, softmax_scale, want_lse, keep_lse)
        if result is not None:
            return result
        kernel = self.kernel
        prepared = kernel.prepare(q, k, v, softmax_scale, validate=False)
        out, lse = kernel.run(prepared, want_lse=want_lse)
        if not self._tried and q.is_cuda:
            from variants.launch_plan import LaunchPlan

            self._tried = True
            self.launch = LaunchPlan.make(kernel, prepared, q, k)
        return out, lse
