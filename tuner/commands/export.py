"""`tuner export`: write the stored winners of one device as a YAML tuning table."""

from __future__ import annotations

import sys

from tuner.commands._args import add_shape_arguments, shape_filter
from tuner.dburl import display_url
from tuner.errors import TunerError

NAME = "export"
HELP = "write the stored winners of a device as a YAML tuning table"


def add_arguments(parser) -> None:
    parser.add_argument(
        "--gpu", default="auto", help="profile of the device to export (default: the local GPU)"
    )
    parser.add_argument(
        "--device-id",
        default=None,
        help="export this stored device (see `tuner show --json`) instead",
    )
    parser.add_argument("--db", default=None, help="results database URL")
    parser.add_argument("--out", default="-", help="output file (default: stdout)")
    add_shape_arguments(parser, as_filter=True)


def _pick_device(store, gpu: str, device_id: str | None) -> tuple[str, str]:
    from tuner.gpus import (
        PROFILES,
        device_fingerprint,
        fingerprint_id,
        profile_for_device_name,
        resolve_gpu,
    )

    devices = store.devices()
    if device_id is not None:
        if device_id not in devices:
            raise TunerError(
                f"no device {device_id} in {display_url(store.url)}; stored: {', '.join(devices)}"
            )
        profile = profile_for_device_name(devices[device_id].get("name", ""))
        return device_id, profile.name if profile else devices[device_id].get("name", "?")
    if gpu == "auto":
        profile = resolve_gpu("auto")
        return fingerprint_id(device_fingerprint()), profile.name
    if gpu not in PROFILES:
        raise TunerError(f"unknown GPU {gpu!r}; known profiles: {', '.join(PROFILES)}")
    matches = [
        i
        for i, fp in devices.items()
        if profile_for_device_name(fp.get("name", "")) is PROFILES[gpu]
    ]
    if len(matches) != 1:
        raise TunerError(
            f"{len(matches)} stored devices match --gpu {gpu}; pick one with "
            f"--device-id (stored: {', '.join(devices) or 'none'})"
        )
    return matches[0], gpu


def run(args) -> int:
    from tuner.store import Store
    from tuner.tables import build_table, dump_table

    store = Store(args.db, readonly=True)
    try:
        device_id, gpu_name = _pick_device(store, args.gpu, args.device_id)
        text = dump_table(build_table(store, device_id, gpu_name, keep=shape_filter(args)))
    finally:
        store.close()
    if args.out == "-":
        sys.stdout.write(text)
    else:
        try:
            with open(args.out, "w") as fh:
                fh.write(text)
        except OSError as exc:
            raise TunerError(f"cannot write {args.out}: {exc.strerror or exc}") from None
        print(f"wrote {args.out}", file=sys.stderr)
    return 0
