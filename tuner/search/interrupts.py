"""Ctrl-C held back while the Store and the study are written together."""

from __future__ import annotations

import contextlib
import signal
import threading


@contextlib.contextmanager
def sigint_deferred():
    """A SIGINT inside is raised as KeyboardInterrupt right after the block, so that a write to
    both the Store and the study happens whole or not at all, and the study stays resumable.
    Signal handlers can only be set from the main thread; elsewhere the block runs as is. So
    does it where SIGINT is ignored (a process started in the background by a shell, or under
    a parent that ignores it): a handler here would turn the ignored signal into an interrupt
    inside these blocks only, so that whether Ctrl-C stopped a search hung on its timing."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is signal.SIG_IGN):
        yield
        return
    pending = []
    previous = signal.signal(signal.SIGINT, lambda *_: pending.append(True))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if pending:
        raise KeyboardInterrupt
