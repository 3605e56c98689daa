"""`tuner import`: validate a YAML tuning table completely, then store it in one transaction."""

from __future__ import annotations

import contextlib
from pathlib import Path

from tuner.dburl import display_url, engine_url

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
    from tuner.store import Store, default_db_url, sqlite_path
    from tuner.tables import check_import

    # The whole table first, without a database: a table that cannot be imported creates none.
    checked = check_import(args.file, force=args.force, local_fingerprint=_local_fingerprint())
    url = engine_url(args.db or default_db_url())
    with _removed_on_failure(sqlite_path(url)):
        store = Store(url)
        try:
            present = store.import_winners(checked.device_id, checked.device, checked.entries)
        finally:
            store.close()
    total, where = len(checked.entries), display_url(url)
    if present == total:
        print(f"nothing new from {args.file}: its {total} tuned problems are already in {where}")
    else:
        already = f" ({present} already there)" if present else ""
        print(f"imported {total - present} tuned problems from {args.file} into {where}{already}")
    return 0


@contextlib.contextmanager
def _removed_on_failure(path: Path | None):
    """A SQLite database (and its lock, WAL and shared-memory files) that did not exist before
    is removed again if the import into it fails: a failed import leaves nothing behind."""
    files = [] if path is None else [Path(f"{path}{s}") for s in ("", "-wal", "-shm", ".lock")]
    new = [f for f in files if not f.exists()]
    try:
        yield
    except BaseException:
        for f in new:
            f.unlink(missing_ok=True)
        raise
