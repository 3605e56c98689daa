"""Argument types shared by subcommands."""

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
