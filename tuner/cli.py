"""`tuner` command line: one module per subcommand under tuner/commands/.

Each command module defines `NAME`, `HELP`, `add_arguments(parser)` and `run(args) -> int`.
Errors a user can fix (TunerError) and usage errors print as one line and exit 2; anything else
prints one line and exits 1; `--debug` shows the traceback. A reader of stdout that goes away
(`| head`) ends the command quietly with exit 141, as SIGPIPE ends other tools, whether print or
rich was writing (commands print through _args.wide_console). Messages name the flags the user
typed (tuner.errors.argument); database URLs in them are masked (tuner.dburl.display_url).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from tuner.errors import TunerError, cli_arguments

# Subcommands in the order `tuner --help` lists them.
COMMAND_MODULES = ("search", "show", "table", "export", "import_", "bench", "space", "gpus")


def _available_commands():
    for module_name in COMMAND_MODULES:
        try:
            yield importlib.import_module(f"tuner.commands.{module_name}")
        except ModuleNotFoundError as exc:
            # A subcommand whose module has not landed yet is simply not offered.
            if exc.name != f"tuner.commands.{module_name}":
                raise


class _Parser(argparse.ArgumentParser):
    """argparse, with its usage errors on one line like every other error (the usage block it
    prints by default is what --help is for)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {_one_line(message)} (see {self.prog} --help)\n")


def _one_line(text: str) -> str:
    # A message may quote what the user gave (a YAML key, a file name) and that may hold a
    # line break: it must not split the one line a script greps.
    return " ".join(part.strip() for part in str(text).splitlines() if part.strip())


# What a shell reports for a command killed by SIGPIPE (128 + 13), as `yes | head` gives.
EXIT_BROKEN_PIPE = 141


def _reader_gone() -> int:
    """The reader of stdout has gone (`tuner show --json | head`): stop quietly. Python flushes
    stdout again at exit, which would fail and print a message of its own; pointing stdout at
    devnull first is the recipe of the Python docs (signal module, "Note on SIGPIPE")."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return EXIT_BROKEN_PIPE


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="tuner", description="Autotune FP8 flash-attention CuTe-DSL kernels for this GPU."
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in _available_commands():
        cmd = sub.add_parser(module.NAME, help=module.HELP, description=module.HELP)
        module.add_arguments(cmd)
        cmd.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # What `tuner search --workers N` hands on to the processes it starts.
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        with cli_arguments():  # messages name the flags the user typed
            code = int(args._run(args) or 0)
        sys.stdout.flush()  # inside the try: a reader gone by now is a broken pipe here too
        return code
    except BrokenPipeError:
        return _reader_gone()
    except TunerError as exc:
        if args.debug:
            raise
        print(f"tuner {args.command}: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"tuner {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - the CLI's last line of defence: one line, exit 1
        if args.debug:
            raise
        first = (str(exc).strip().splitlines() or [""])[0]
        print(f"tuner {args.command}: internal error: {type(exc).__name__}: {first} "
              "(re-run with --debug for the traceback)", file=sys.stderr)
        return 1
