"""Argument types, argument groups and console setup shared by subcommands."""

from __future__ import annotations

import argparse


def int_list(text: str) -> list[int]:
    """'4096,8192, 30272' -> [4096, 8192, 30272]; argparse turns the error into a usage line."""
    try:
        values = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one value")
    return values


def add_problem_arguments(parser: argparse.ArgumentParser, *, seq_lens_example: str,
                          heads_default: int | None) -> None:
    """--seq-lens, --heads, --batch, --head-dim: the problems a command works on.
    heads_default=None makes --heads required."""
    parser.add_argument("--seq-lens", type=int_list, required=True,
                        help=f"e.g. {seq_lens_example}")
    if heads_default is None:
        parser.add_argument("--heads", type=int, required=True)
    else:
        parser.add_argument("--heads", type=int, default=heads_default)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--head-dim", type=int, default=128)


def wide_console(width_when_piped: int):
    """A rich Console that keeps wide tables on one line when output is piped (rich assumes 80
    columns without a terminal)."""
    from rich.console import Console

    return Console(width=None if Console().is_terminal else width_when_piped)
