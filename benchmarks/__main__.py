"""`python -m benchmarks <suite> [options]`: run one suite on the local GPU, print its table and
write its section of benchmarks/results/<gpu>.md (docs/benchmarks.md)."""

from __future__ import annotations

import argparse
import importlib
import sys

from benchmarks import SUITES


def build_parser() -> argparse.ArgumentParser:
    from benchmarks.common import add_common_arguments

    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Benchmark suites of fp8-attn-tuner; each writes its section of "
        "benchmarks/results/<gpu>.md.")
    sub = parser.add_subparsers(dest="suite", required=True, metavar="SUITE")
    for name in SUITES:
        suite = importlib.import_module(f"benchmarks.{name}")
        sp = sub.add_parser(name, help=suite.HELP, description=suite.__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
        add_common_arguments(sp, suite.DEFAULT_SHAPES, suite.QUICK_SHAPES)
        suite.add_arguments(sp)
    return parser


def main(argv: list[str] | None = None) -> int:
    from pathlib import Path

    from benchmarks import results
    from benchmarks.common import local_gpu
    from tuner.errors import TunerError

    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    suite = importlib.import_module(f"benchmarks.{args.suite}")
    try:
        gpu = local_gpu()
        print(f"{args.suite}: {gpu.device_name} (profile {gpu.name})", flush=True)
        body = suite.run(args, gpu)
    except TunerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from tuner.gpus import software_versions

    versions = software_versions()
    software = ", ".join(f"{label} {versions[key]}" for key, label in (
        ("torch", "torch"), ("cutlass_dsl", "nvidia-cutlass-dsl")) if versions.get(key))
    stamp = results.stamp(gpu.device_name, results.command_line(argv),
                          commit=results.commit_id(), software=software)
    section = results.render_section(args.suite, stamp, body)
    print(section)
    if not args.no_write:
        path = Path(args.results or results.RESULTS_DIR) / f"{gpu.name}.md"
        results.write_section(path, args.suite, section, SUITES,
                              results.page_title(gpu.name, gpu.device_name))
        print(f"wrote section {args.suite!r} of {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
