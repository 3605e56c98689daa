"""The exception types of the tuner. TunerError, the one users see at the public boundary (its
message names the problem and the fix; the CLI prints it as one line), is defined beside the
kernels in variants/errors.py, which raise it too, and re-exported here. A message names an
argument as its caller wrote it (argument()): the flag under the `tuner` command, the keyword
argument from Python."""

import contextlib
import contextvars

from variants.errors import TunerError

__all__ = ["PeerUnavailable", "TunerError", "argument", "cli_arguments"]

_CLI = contextvars.ContextVar("tuner_cli_arguments", default=False)


@contextlib.contextmanager
def cli_arguments():
    """While a `tuner` command runs: messages name its flags (tuner.cli.main)."""
    token = _CLI.set(True)
    try:
        yield
    finally:
        _CLI.reset(token)


def argument(name: str, value=None) -> str:
    """The public API's keyword argument `name` as the caller gave it, for a message: its CLI
    flag (--name, underscores as dashes) under `tuner`, the keyword from Python; with `value`,
    as written (`--gpu h200` / `gpu='h200'`, `--force` / `force=True`)."""
    if _CLI.get():
        flag = "--" + name.replace("_", "-")
        return flag if value is None or value is True else f"{flag} {value}"
    return f"{name}=" if value is None else f"{name}={value!r}"


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
