"""How the benchmark scripts hand back a run: the markdown table on stdout and, with --out DIR,
DIR/<stem>.md (the table) and DIR/<stem>.json (the raw results it was made from)."""

from __future__ import annotations

import json
from pathlib import Path


def publish(out: Path | None, stem: str, md: str, results) -> None:
    print(md)
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{stem}.md").write_text(md + "\n")
        (out / f"{stem}.json").write_text(json.dumps(results, indent=1))
