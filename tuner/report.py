"""Plots of stored results (matplotlib, imported only when a plot is asked for)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path


def plot_winners(rows: list[dict], path: str, peers: list[dict] | None = None) -> Path:
    """TFLOP/s against seq_len: one line per (device, heads) for the tuned winner and one for the
    family default; `peers` (from `tuner bench`) add a line per system. GPU and date in the title.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        from tuner.errors import TunerError

        raise TunerError("plots need matplotlib: pip install matplotlib") from exc
    if not rows:
        from tuner.errors import TunerError

        raise TunerError("nothing to plot: no stored winners (run `tuner search` first)")
    series: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for r in rows:
        group = f"{r['device']} H={r['heads']}"
        if r["tflops"]:
            series[f"tuned ({group})"].append((r["seq_len"], r["tflops"]))
        if r.get("default_tflops"):
            series[f"default ({group})"].append((r["seq_len"], r["default_tflops"]))
    for p in peers or []:
        series[f"{p['system']} ({p['device']} H={p['heads']})"].append((p["seq_len"], p["tflops"]))
    fig, ax = plt.subplots(figsize=(8, 5))
    for label, points in sorted(series.items()):
        points.sort()
        ax.plot(
            [s for s, _ in points],
            [t for _, t in points],
            marker="o",
            linestyle="--" if label.startswith("default") else "-",
            label=label,
        )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("seq_len (tokens)")
    ax.set_ylabel("TFLOP/s (4*S*S*D*H / time)")
    devices = sorted({r["device"] for r in rows})
    dates = sorted(r["decided_at"][:10] for r in rows if r.get("decided_at"))
    ax.set_title(f"FP8 attention on {', '.join(devices)} (measured {dates[-1] if dates else '?'})")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    out = Path(path)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def plot_bench(rows, path: str, title: str) -> Path:
    """TFLOP/s against seq_len, one line per system of a `tuner bench` run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for r in rows:
        if r.tflops:
            series[r.system].append((r.seq_len, r.tflops))
    fig, ax = plt.subplots(figsize=(8, 5))
    for label, points in series.items():
        points.sort()
        ax.plot([s for s, _ in points], [t for _, t in points], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("seq_len (tokens)")
    ax.set_ylabel("TFLOP/s (4*S*S*D*H / time)")
    ax.set_title(title, fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    out = Path(path)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
