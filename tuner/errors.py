"""The exception types of the tuner. TunerError, the one users see at the public boundary (its
message names the problem and the fix; the CLI prints it as one line), is defined beside the
kernels in variants/errors.py, which raise it too, and re-exported here."""

from variants.errors import TunerError

__all__ = ["PeerUnavailable", "TunerError"]


class PeerUnavailable(RuntimeError):
    """A peer of `tuner bench` cannot run here (missing package or backend); bench prints the
    note and goes on."""
