"""The typed values a trial carries: what happened to a candidate (Outcome) and why it was
measured (Role).

StrEnum members are str: a row stores, and `--json` prints, the plain value ("ok", "retime"),
so databases and tables written before these enums existed read back unchanged, and a value read
from the database compares equal to its member.
"""

from __future__ import annotations

from enum import StrEnum


class Outcome(StrEnum):
    OK = "ok"
    INFEASIBLE = "infeasible"  # rejected by can_implement; never reached a compiler
    COMPILE_ERROR = "compile_error"
    LAUNCH_ERROR = "launch_error"  # the launch failed, the CUDA context is still usable
    CRASH = "crash"  # the process died or the CUDA context is poisoned
    TIMEOUT = "timeout"
    WRONG_RESULT = "wrong_result"  # ran, and failed the correctness gate
    # Passed the gate, and its end-to-end error on the accuracy data is over the search's budget
    # (tuner/budget.py): correct, but not accurate enough for this data. Never timed.
    TOO_INACCURATE = "too_inaccurate"


class Role(StrEnum):
    DEFAULT = "default"  # the family default, enqueued first
    SEARCH = "search"  # proposed by the study
    # A config known near the problem (a shipped table's row, a tuned neighbour's winner),
    # measured right after the default: tuner/search/known.py
    KNOWN = "known"
    RETIME = "retime"  # the final side-by-side re-time that decides the winner
    IMPORTED = "imported"  # a winner read from a tuning table, not measured here
    BENCH = "bench"  # a `tuner bench` row: ours or a peer's, for the dashboard
