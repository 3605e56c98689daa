"""`tuner gpus`: the known target profiles, and the local device with its fingerprint."""

from __future__ import annotations

import json

from tuner.commands._args import wide_console
from tuner.errors import TunerError
from tuner.gpus import PROFILES, device_fingerprint, fingerprint_id, local_profile

NAME = "gpus"
HELP = "list the known GPU profiles and the local device"


def add_arguments(parser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def _local() -> dict | None:
    try:
        profile = local_profile()
    except TunerError as exc:
        return {"error": str(exc)}
    fp = device_fingerprint()
    return {"profile": profile.name, "fingerprint_id": fingerprint_id(fp), "fingerprint": fp}


def run(args) -> int:
    local = _local()
    if args.json:
        profiles = {name: p.to_dict() for name, p in PROFILES.items()}
        print(json.dumps({"profiles": profiles, "local": local}, indent=2, default=list))
        return 0
    from rich.table import Table

    table = Table(title="Known GPU profiles (datasheet figures, dense TFLOP/s)")
    for col in (
        "--gpu",
        "GPU",
        "arch",
        "SMs",
        "smem/block",
        "L2",
        "FP8 (fp32 acc)",
        "FP8 full",
        "BF16",
        "GB/s",
    ):
        table.add_column(col, justify="right" if col not in ("--gpu", "GPU", "arch") else "left")
    local_name = local.get("profile") if local else None
    for p in PROFILES.values():
        mark = " *" if p.name == local_name else ""
        table.add_row(
            p.name + mark,
            p.marketing_name,
            p.arch,
            str(p.sm_count),
            f"{p.smem_per_block // 1024} KiB",
            f"{p.l2_bytes // 2**20} MiB",
            f"{p.fp8_tflops:g}",
            f"{p.fp8_full_tflops:g}",
            f"{p.bf16_tflops:g}",
            f"{p.mem_bandwidth_gbs:g}",
        )
    console = wide_console()
    console.print(table)
    if "error" in local:
        console.print(f"local device: none usable ({local['error']})")
    else:
        fp = local["fingerprint"]
        console.print(f"local device (*): {fp['name']}, fingerprint {local['fingerprint_id']}")
        console.print("  " + ", ".join(f"{k}={v}" for k, v in fp.items()))
    return 0
