"""Argument types, argument groups and console setup shared by subcommands.

The types check every value when argparse reads it, so a bad argument is named (exit 2) before
a command looks for a GPU or opens a database.
"""

from __future__ import annotations

import argparse
import errno
import math

from rich.console import Console

from tuner.errors import TunerError
from tuner.problem import MAX_DIMS, SUPPORTED_HEAD_DIMS, check_dimension


def _int(text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def dimension(name: str):
    """An argparse type for one problem dimension (batch, heads, seq_len, head_dim), in the
    bounds tuner.problem.check_dimension states."""

    def parse(text: str) -> int:
        value = _int(text)
        try:
            check_dimension(name, value)
        except TunerError as exc:
            # "Problem.seq_len must be >= 1, got 0; ..." -> "must be >= 1, got 0; ..."
            raise argparse.ArgumentTypeError(str(exc).replace(f"Problem.{name} ", "")) from None
        return value

    parse.__name__ = name  # argparse names the type in its "invalid <type> value" message
    return parse


def int_list(text: str, item=_int) -> list[int]:
    """'4096,8192, 30272' -> [4096, 8192, 30272] (blanks around an item are allowed); an empty
    item, a repeated value or an item that is no integer is a usage error naming the list."""
    items = _items(text, "4096,8192")
    try:
        values = [item(x) for x in items]
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(
            f"{exc} (in {text!r}; expected comma-separated integers)") from None
    repeated = sorted({v for v in values if values.count(v) > 1})
    if repeated:
        raise argparse.ArgumentTypeError(
            f"{', '.join(map(str, repeated))} given more than once in {text!r}; give each value "
            "once")
    return values


def _items(text: str, example: str) -> list[str]:
    """The comma-separated items of `text`, stripped; a list with an empty item (',,', a
    leading or trailing comma) or none at all is refused with an example of a good one."""
    items = [x.strip() for x in text.split(",")]
    if not any(items):
        raise argparse.ArgumentTypeError(f"expected at least one value, e.g. {example}")
    if not all(items):
        raise argparse.ArgumentTypeError(
            f"empty item in {text!r} (item {items.index('') + 1}); separate values by single "
            f"commas, e.g. {example}")
    return items


def seq_lens(text: str) -> list[int]:
    return int_list(text, dimension("seq_len"))


def name_list(example: str):
    """An argparse type for a comma-separated list of names ('default,sdpa'): the same text,
    stripped, once no item is empty or repeated; the command checks the names themselves."""

    def parse(text: str) -> str:
        items = _items(text, example)
        repeated = sorted({x for x in items if items.count(x) > 1})
        if repeated:
            raise argparse.ArgumentTypeError(
                f"{', '.join(repeated)} given more than once in {text!r}; name each once")
        return ",".join(items)

    parse.__name__ = "list"
    return parse


def at_least(minimum: int):
    """An argparse type: an integer >= minimum."""

    def parse(text: str) -> int:
        value = _int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    parse.__name__ = f"integer >= {minimum}"
    return parse


_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}


def duration(text: str) -> float:
    """'90', '90s', '10m', '1.5h' -> seconds, > 0 (a budget of nothing would stop at once)."""
    raw = text.strip().lower()
    scale = _UNITS.get(raw[-1:])
    try:
        value = float(raw[:-1] if scale else raw) * (scale or 1.0)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"bad duration {text!r}; use e.g. 600, 90s, 10m or 1.5h") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(
            f"must be a positive duration, got {text!r}; use e.g. 600, 90s, 10m or 1.5h")
    return value


def add_problem_arguments(parser: argparse.ArgumentParser, *, seq_lens_example: str,
                          heads_default: int | None) -> None:
    """--seq-lens, --heads, --batch, --head-dim: the problems a command works on.
    heads_default=None makes --heads required."""
    parser.add_argument("--seq-lens", type=seq_lens, required=True,
                        help=f"sequence lengths (tokens), comma-separated, each 1 to "
                        f"{MAX_DIMS['seq_len']}, e.g. {seq_lens_example}")
    heads_help = f"attention heads of the model (1 to {MAX_DIMS['heads']})"
    if heads_default is None:
        parser.add_argument("--heads", type=dimension("heads"), required=True,
                            help=f"{heads_help}; required")
    else:
        parser.add_argument("--heads", type=dimension("heads"), default=heads_default,
                            help=f"{heads_help} (default {heads_default})")
    parser.add_argument("--batch", type=dimension("batch"), default=1,
                        help=f"batch size (1 to {MAX_DIMS['batch']}; default 1)")
    parser.add_argument("--head-dim", type=dimension("head_dim"), default=128,
                        help="head dimension, one of "
                        f"{', '.join(map(str, SUPPORTED_HEAD_DIMS))} (default 128)")


def add_shape_arguments(parser: argparse.ArgumentParser, *, as_filter: bool = False) -> None:
    """--kv-len, --kv-heads, --causal: the key/value side and the mask of the problems a command
    builds (search, bench), or with as_filter those it shows or exports (show, export: absent
    means any)."""
    kv_len, kv_heads, causal = ((
        "only problems whose keys/values have this length",
        "only problems with this many key/value heads",
        "only causal problems (default: causal or not)") if as_filter else (
        f"key/value length (tokens) of every problem, 1 to {MAX_DIMS['seq_len_kv']}, for "
        "cross-attention, e.g. 512 text tokens (default: each problem's seq_len, "
        "self-attention)",
        "key/value heads, a divisor of --heads, for grouped-query attention (default: --heads)",
        "causal mask, aligned to the bottom right when --kv-len differs (default: none)"))
    parser.add_argument("--kv-len", type=dimension("seq_len_kv"), default=None, help=kv_len)
    parser.add_argument("--kv-heads", type=dimension("kv_heads"), default=None, help=kv_heads)
    parser.add_argument("--causal", action="store_true", help=causal)


def problems_from_args(args) -> list:
    """The Problems of --seq-lens with --batch, --heads, --head-dim, --kv-len, --kv-heads and
    --causal; a combination that is no problem is named by its options."""
    return [problem_from_args(args, s, args.batch) for s in args.seq_lens]


def problem_from_args(args, seq_len: int, batch: int):
    """One Problem of seq_len and batch with --heads, --head-dim and the shape options."""
    from tuner.problem import Problem

    if args.kv_heads is not None and args.heads % args.kv_heads:
        divisors = [d for d in range(1, args.heads + 1) if args.heads % d == 0]
        shown = ", ".join(map(str, divisors[:12])) + (", ..." if len(divisors) > 12 else "")
        raise TunerError(f"--kv-heads {args.kv_heads} does not divide --heads {args.heads}: each "
                         "key/value head serves a whole group of query heads; pick one of "
                         f"{shown}")
    return Problem(batch, args.heads, seq_len, args.head_dim, args.causal, args.kv_len,
                   args.kv_heads)


def shape_filter(args):
    """A predicate on Problems from show/export's --kv-len, --kv-heads and --causal."""

    def keep(problem) -> bool:
        return ((args.kv_len is None or problem.seq_len_kv == args.kv_len)
                and (args.kv_heads is None or problem.kv_heads == args.kv_heads)
                and (not args.causal or problem.causal))

    return keep


class _Console(Console):
    """rich's Console, but a reader of stdout that goes away raises BrokenPipeError, which the
    CLI ends with exit 141 (rich's own handling exits 1, before the CLI sees it)."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError(errno.EPIPE, "the reader of stdout has gone")


# A log has no width: rows as long as their cells, never wrapped (rich assumes 80 columns).
_PIPED_WIDTH = 10_000


def wide_console() -> Console:
    """The Console a command prints its output with: in a terminal, the terminal's width;
    piped or written to a file, rows at their full length, one line each."""
    return _Console(width=None if Console().is_terminal else _PIPED_WIDTH)
