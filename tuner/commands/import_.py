"""`tuner import`: validate a YAML tuning table completely, then store it in one transaction."""

from __future__ import annotations

from tuner.dburl import display_url

NAME = "import"
HELP = "import a YAML tuning table (all or nothing; --force for another device's table)"


def add_arguments(parser) -> None:
    parser.add_argument("file", help="tuning table written by `tuner export`")
    parser.add_argument("--db", default=None, help="results database URL")
    parser.add_argument(
        "--force", action="store_true", help="import even if the table was tuned on another device"
    )


def _local_fingerprint() -> dict | None:
    from tuner.errors import TunerError
    from tuner.gpus import device_fingerprint, local_profile

    try:
        local_profile()
    except TunerError:
        return None
    return device_fingerprint()


def run(args) -> int:
    from tuner.store import Store
    from tuner.tables import import_table

    store = Store(args.db)
    try:
        count = import_table(
            store, args.file, force=args.force, local_fingerprint=_local_fingerprint()
        )
    finally:
        store.close()
    print(f"imported {count} tuned problems from {args.file} into {display_url(store.url)}")
    return 0
