"""How the benchmark scripts run their shapes and hand back a run: every shape measured in turn
(after one untimed measurement: the first shape of a cold process runs slow), its raw result
printed as a JSON line; then the markdown table on stdout and, with --out DIR, DIR/<stem>.md (the
table) and DIR/<stem>.json (the raw results it was made from)."""

from __future__ import annotations

import json
from pathlib import Path


def measure_each(shapes, measure, warmup=None) -> list:
    """measure(shape) for every shape, after one untimed measure(warmup or shapes[0])."""
    measure(shapes[0] if warmup is None else warmup)
    results = []
    for shape in shapes:
        results.append(measure(shape))
        print(json.dumps(results[-1]), flush=True)
    return results


def publish(out: Path | None, stem: str, md: str, results) -> None:
    print(md)
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{stem}.md").write_text(md + "\n")
        (out / f"{stem}.json").write_text(json.dumps(results, indent=1))
