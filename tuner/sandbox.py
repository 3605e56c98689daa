"""Isolated evaluation of candidates: one subprocess per role, reused, restarted after a crash.

A candidate's kernel can fault (illegal address poisons the CUDA context for good), hang, or take
the whole process down; none of that may reach the search. So each candidate is compiled,
validated, held to the accuracy budget (tuner/budget.py) and timed in a `Sandbox`: a
multiprocessing *spawn* child (fork after CUDA init would copy a context the child cannot use)
that serves tasks over a pipe, one at a time (what the child runs: tuner/sandbox_task.py). The
parent enforces a deadline per task and kills the child on timeout; a child that dies is seen as EOF
and reported as a crash; either way the next task starts a fresh child.

Why not concurrent.futures.ProcessPoolExecutor for the compile pool: it cannot kill one hung task,
and one dead child breaks the whole pool. A list of Sandboxes is the pool (tuner/search/pool.py).

("Sandbox", not "worker": `tuner search --workers N` names the search processes, one per GPU,
each of which runs its own sandboxes.)

Outcomes come back as `CandidateResult` values; an exception in the tuner's own code inside the
child comes back as a traceback and is raised in the parent as `SandboxBug`, never stored as the
candidate's fault.
"""

from __future__ import annotations

import multiprocessing as mp
import signal
import time
from typing import Any

from tuner.outcomes import Outcome
from tuner.sandbox_task import CandidateResult, Task, serve

__all__ = ["CandidateResult", "Sandbox", "SandboxBug", "Task", "poll"]

# A child that is not ready after this long (imports hang, a broken environment) is killed.
STARTUP_TIMEOUT_S = 300.0


class SandboxBug(RuntimeError):
    """The tuner's own code failed inside a sandbox (not the candidate's fault)."""


# ---- parent side ---------------------------------------------------------------------------------

class Sandbox:
    """A spawn-context child serving Tasks one at a time, with a deadline per task."""

    def __init__(self, name: str, preload: tuple[str, ...] = ()) -> None:
        self.name = name
        self.preload = preload
        self.ready = False
        self._ctx = mp.get_context("spawn")
        self._proc = None
        self._conn = None
        self.task: Task | None = None
        self.payload: Any = None  # the caller's handle for the task in flight
        self.deadline = 0.0
        self.starts = 0

    @property
    def busy(self) -> bool:
        return self.task is not None

    @property
    def connection(self):
        return self._conn

    @property
    def restarts(self) -> int:
        return max(0, self.starts - 1)

    def _start(self) -> None:
        self._reap()
        self.starts += 1
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=serve, args=(child, self.preload),
                                 name=f"tuner-{self.name}", daemon=True)
        self.ready = False
        # Held only once started: a Ctrl-C inside start() must leave nothing close() would join.
        try:
            proc.start()
        except BaseException:
            parent.close()
            raise
        finally:
            child.close()
        self._proc, self._conn = proc, parent

    def submit(self, task: Task, payload: Any = None) -> None:
        if self.busy:
            raise RuntimeError(f"sandbox {self.name} is busy")
        if self._proc is None or not self._proc.is_alive():
            self._start()
        self.task, self.payload = task, payload
        # A fresh child gets its start-up on top; the clock restarts when it says ready.
        startup = 0.0 if self.ready else STARTUP_TIMEOUT_S
        self.deadline = time.monotonic() + startup + task.timeout_s
        self._conn.send(task)

    def _finish(self, result: CandidateResult) -> tuple[Any, CandidateResult]:
        payload = self.payload
        self.task = self.payload = None
        return payload, result

    def collect(self) -> tuple[Any, CandidateResult] | None:
        """Read what the child sent (call when the connection is readable): the finished task's
        (payload, result), or None for the start-up handshake."""
        try:
            kind, value = self._conn.recv()
        except (EOFError, OSError):
            self._proc.join(timeout=5)
            code = self._proc.exitcode
            if code is not None and code < 0:
                how = f"signal {signal.Signals(-code).name}"
            else:
                how = f"exit code {code}"
            self._reap()
            return self._finish(CandidateResult(Outcome.CRASH, f"sandbox died ({how})"))
        if kind == "ready":
            self.ready = True
            if self.busy:
                self.deadline = time.monotonic() + self.task.timeout_s
            return None
        if kind == "bug":
            self._finish(CandidateResult(Outcome.CRASH))
            raise SandboxBug(f"tuner bug inside sandbox {self.name}:\n{value}")
        if value.outcome == Outcome.CRASH:
            # The child exits after a crash (its CUDA context is poisoned). Wait for it here:
            # a submit() racing its exit would hand the next candidate to a dying process and
            # record a second, false crash.
            self._reap()
        return self._finish(value)

    def expire(self, now: float | None = None) -> tuple[Any, CandidateResult] | None:
        """Kill the child if its task is past the deadline; returns the timeout result."""
        if not self.busy or (now or time.monotonic()) < self.deadline:
            return None
        timeout = self.task.timeout_s
        self.kill()
        killed = CandidateResult(Outcome.TIMEOUT, f"no result after {timeout:g} s; killed")
        return self._finish(killed)

    def _reap(self) -> None:
        if self._conn is not None:
            self._conn.close()
        if self._proc is not None:
            self._proc.join(timeout=5)
        self._proc = self._conn = None

    def kill(self) -> None:
        if self._proc is not None and self._proc.is_alive():
            self._proc.kill()
            self._proc.join(timeout=5)
        if self._proc is not None:
            self._reap()

    def close(self) -> None:
        """Ask an idle child to exit; kill a busy one (its task is abandoned)."""
        if self._proc is None:
            return
        if not self.busy and self._proc.is_alive():
            try:
                self._conn.send(None)
                self._proc.join(timeout=5)
            except (OSError, BrokenPipeError):
                pass
        self.kill()
        self.task = self.payload = None


def poll(sandboxes, timeout_s: float) -> list[tuple[Sandbox, tuple[Any, CandidateResult]]]:
    """Wait up to timeout_s for the busy ones of `sandboxes`; returns (sandbox, (payload, result))
    for each that finished: answered, died (a crash result) or ran past its deadline (killed,
    a timeout result). The one scheduling loop of the search's pipeline and `tuner space`."""
    from multiprocessing.connection import wait

    busy = [w for w in sandboxes if w.busy]
    if not busy:
        return []
    readable = wait([w.connection for w in busy], timeout=timeout_s)
    finished = []
    for sandbox in busy:
        got = sandbox.collect() if sandbox.connection in readable else sandbox.expire()
        if got is not None:
            finished.append((sandbox, got))
    return finished
