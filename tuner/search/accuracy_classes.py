"""Accuracy classes: configs that round alike share their end-to-end error, so a measured member
far over the search's accuracy budget rules out every other member of its class, without a
compile or a GPU evaluation.

A class is a family and its values of ACCURACY_KNOBS: what prepare transforms (k_smoothing,
qk_rotation), which types QK^T's operands and P.V round to and accumulate in (qk_dtype, pv_dtype,
pv_accum). The other knobs (tiles, stages, pipelining, tile order, where Q is quantized: the
same codes either way) move
only the order of fp32 sums, far below FP8's rounding: the members of a class measured on an
H100 differ in end-to-end error by at most 0.0001 (docs/tables-and-database.md). A class is ruled
out only where a member's error is at least RULE_OUT_FACTOR times the budget, a margin hundreds of
times that spread.

A ruled-out proposal is told to the study as over the budget (TPE learns the class is bad) with
the hash of the member that ruled it out, and is never stored: the Store holds measurements
only, the trial budget and the patience count measured candidates, and a resumed search rules
the class out again from the same stored member.
"""

from __future__ import annotations

from collections.abc import Iterable

from tuner.outcomes import Outcome
from tuner.store import TrialRecord

ACCURACY_KNOBS = ("k_smoothing", "qk_rotation", "qk_dtype", "pv_dtype", "pv_accum")
RULE_OUT_FACTOR = 1.25


def accuracy_class(family: str, config: dict) -> tuple:
    """The family and its values of ACCURACY_KNOBS (those it has), the key of a class."""
    return (family, *((k, config[k]) for k in ACCURACY_KNOBS if k in config))


def ruled_out_classes(stored: Iterable[TrialRecord], max_error: float | None) -> dict[tuple, str]:
    """Class -> the hash of its worst stored member measured at least RULE_OUT_FACTOR times over
    max_error; empty without a budget."""
    if max_error is None:
        return {}
    worst: dict[tuple, TrialRecord] = {}
    for record in stored:
        error = record.e2e_error
        if (record.outcome != Outcome.TOO_INACCURATE or error is None
                or not error >= RULE_OUT_FACTOR * max_error):
            continue
        key = accuracy_class(record.family, record.config)
        if key not in worst or error > worst[key].e2e_error:
            worst[key] = record
    return {key: record.config_hash for key, record in worst.items()}


def ruled_out_lines(stored: dict[str, TrialRecord], max_error: float | None) -> list[str]:
    """The ruled-out classes as a search reports them, one line each: "wgmma k_smoothing=off
    qk_rotation=none pv_dtype=e4m3: 0.705 (a measured member)"."""
    lines = []
    for key, digest in ruled_out_classes(stored.values(), max_error).items():
        family, *knobs = key
        lines.append(" ".join([family, *(f"{k}={v}" for k, v in knobs)])
                     + f": {stored[digest].e2e_error:.3g} (a measured member)")
    return sorted(lines)
