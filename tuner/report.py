"""Plots of stored results (matplotlib, imported only when a plot is asked for)."""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from pathlib import Path

from tuner.errors import TunerError
from tuner.problem import Problem, StoredTime, preferred_per_problem

Series = dict[str, list[tuple[int, float]]]


def _plot_tflops(series: Series, path: str, title: str) -> Path:
    """TFLOP/s against seq_len (log2 axis), one line per series; 'default' lines dashed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise TunerError("plots need matplotlib: pip install matplotlib") from exc
    fig, ax = plt.subplots(figsize=(8, 5))
    for label, points in sorted(series.items()):
        points.sort()
        ax.plot([s for s, _ in points], [t for _, t in points], marker="o",
                linestyle="--" if label.startswith("default") else "-", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("seq_len (tokens)")
    ax.set_ylabel("TFLOP/s (4*S*S*D*H / time)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    out = Path(path)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def _row_time(row: dict) -> StoredTime:
    decided = row.get("decided_at")
    return StoredTime(row["median_ms"], dt.datetime.fromisoformat(decided) if decided else None,
                      row.get("code_version"))


def plot_winners(rows: list[dict], path: str, peers: list[dict] | None = None) -> Path:
    """Stored winners: one line per (device, batch, heads, KV heads and length, head_dim, mask)
    for the tuned config and one for the family default; `peers` (stored by `tuner bench`) add a
    line per system. A label names head_dim and heads always, batch where the rows hold more
    than one, KV heads, KV length and the mask where they are not those of self-attention.
    GPU and date in the title."""
    if not rows:
        raise TunerError("nothing to plot: no stored winners (run `tuner search` first)")
    # The winner that runs of each problem (several family sets may have one), as a line shows it.
    rows = preferred_per_problem(rows, lambda r: (r["device"], r["problem"]), _row_time)
    shape = {r["problem"]: Problem.from_key(r["problem"]) for r in rows}
    shape.update({p["problem"]: Problem.from_key(p["problem"]) for p in peers or []})
    several_batches = len({p.batch for p in shape.values()}) > 1

    def group(device: str, key: str) -> str:
        # The x axis is the query length: a key/value length, KV heads or a mask of its own is
        # another line.
        p = shape[key]
        batch = f" B={p.batch}" if several_batches else ""
        kv = (f" Hkv={p.kv_heads}" if p.kv_heads != p.heads else "") + \
            (f" Skv={p.seq_len_kv}" if not p.self_attention else "")
        return f"{device}{batch} H={p.heads}{kv} D={p.head_dim}{' causal' if p.causal else ''}"

    series: Series = defaultdict(list)
    for r in rows:
        label = group(r["device"], r["problem"])
        if r["tflops"]:
            series[f"tuned ({label})"].append((r["seq_len"], r["tflops"]))
        if r.get("default_tflops"):
            series[f"default ({label})"].append((r["seq_len"], r["default_tflops"]))
    for p in peers or []:
        series[f"{p['system']} ({group(p['device'], p['problem'])})"].append(
            (p["seq_len"], p["tflops"]))
    devices = sorted({r["device"] for r in rows})
    dates = sorted(r["decided_at"][:10] for r in rows if r.get("decided_at"))
    title = f"FP8 attention on {', '.join(devices)} (measured {dates[-1] if dates else '?'})"
    return _plot_tflops(series, path, title)


def plot_bench(rows, path: str, title: str) -> Path:
    """One line per system of a `tuner bench` run (BenchRow objects)."""
    series: Series = defaultdict(list)
    for r in rows:
        if r.tflops:
            series[r.system].append((r.seq_len, r.tflops))
    return _plot_tflops(series, path, title)
