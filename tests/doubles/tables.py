"""A shipped tuning table for tests: entries (the YAML's dicts) written as <gpu>.yaml in a
folder, with the header and digest `tuner import` and the runtime lookup validate."""

from __future__ import annotations

from pathlib import Path

from tuner.tables import KIND, SCHEMA_VERSION, dump_table, entries_digest


def write_table(folder: Path, entries: list[dict], gpu: str = "h200",
                device: str = "NVIDIA H200") -> Path:
    doc = {"kind": KIND, "schema_version": SCHEMA_VERSION, "gpu": gpu,
           "device": {"name": device, "compute_capability": "9.0", "sm_count": 132},
           "entry_count": len(entries), "entries_sha256": entries_digest(entries),
           "entries": entries}
    path = Path(folder) / f"{gpu}.yaml"
    path.write_text(dump_table(doc))
    return path
