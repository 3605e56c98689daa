"""sigint_deferred: a SIGINT inside the block is raised after it, and an ignored SIGINT stays
ignored (a search started in the background must not stop only when Ctrl-C lands in a block)."""

import os
import signal

import pytest

from tuner.search.interrupts import sigint_deferred


@pytest.fixture
def sigint_restored():
    previous = signal.getsignal(signal.SIGINT)
    yield
    signal.signal(signal.SIGINT, previous)


def test_a_sigint_inside_is_raised_after_the_block(sigint_restored):
    signal.signal(signal.SIGINT, signal.default_int_handler)
    finished = []
    with pytest.raises(KeyboardInterrupt):
        with sigint_deferred():
            os.kill(os.getpid(), signal.SIGINT)
            finished.append(True)  # the block runs to its end first
    assert finished == [True]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_an_ignored_sigint_stays_ignored(sigint_restored):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with sigint_deferred():
            os.kill(os.getpid(), signal.SIGINT)
    except KeyboardInterrupt:
        pytest.fail("an ignored SIGINT was raised as KeyboardInterrupt after the block")
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
