"""Ctrl-C held back while the Store and the study are written together."""

from __future__ import annotations

import contextlib
import signal
import threading


@contextlib.contextmanager
def sigint_deferred():
    """A SIGINT inside is raised as KeyboardInterrupt right after the block, so that a write to
    both the Store and the study happens whole or not at all, and the study stays resumable.
    Signal handlers can only be set from the main thread; elsewhere the block runs as is."""
    if threading.current_thread() is not threading.main_thread():
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
