"""The exception types of the tuner. TunerError, the one users see at the public boundary (its
message names the problem and the fix; the CLI prints it as one line), is defined beside the
kernels in variants/errors.py, which raise it too, and re-exported here."""

from variants.errors import TunerError

__all__ = ["PeerUnavailable", "TunerError"]


class PeerUnavailable(RuntimeError):
    """A peer of `tuner bench` cannot run here (missing package or backend); bench prints the
    note and goes on."""


def peer_module(name: str, missing: str):
    """The optional module a peer runs on, or PeerUnavailable saying `missing` (how to get it)."""
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise PeerUnavailable(missing) from exc
