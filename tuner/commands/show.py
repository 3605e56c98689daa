"""`tuner show`: the stored winners with the default's times beside each, a problem's trial
history, and a TFLOP/s-vs-seq_len plot.

A winner's speedup over the default is what the search ranked by: (kernel + prepare) of the
default over (kernel + prepare) of the winner (tuner/search/cost.py), so a winner whose kernel is
slower than the default's can still be ahead; the table labels the ratio and shows the four
times it is made of. One problem searched with several family sets has a winner of each, told
apart by the family set column; the runtime runs the one problem.preferred_per_problem picks.
"""

from __future__ import annotations

import json
from collections import Counter

from tuner.commands._args import add_shape_arguments, shape_filter, wide_console
from tuner.dburl import display_url
from tuner.errors import TunerError
from tuner.outcomes import Role
from tuner.problem import Problem

NAME = "show"
HELP = "show stored winners (--trials SEQ_LEN for one problem's history, --plot FILE)"


def add_arguments(parser) -> None:
    parser.add_argument(
        "--db",
        default=None,
        help="results database URL (default: TUNER_DB_URL or the embedded SQLite file)",
    )
    parser.add_argument(
        "--gpu", default=None,
        help="only devices whose name matches this profile (e.g. h200; auto: the local GPU's)"
    )
    parser.add_argument(
        "--trials",
        type=int,
        metavar="SEQ_LEN",
        default=None,
        help="list the trials of one seq_len (outcomes by kind)",
    )
    parser.add_argument("--heads", type=int, default=None, help="with --trials: heads")
    add_shape_arguments(parser, as_filter=True)
    parser.add_argument(
        "--plot",
        metavar="FILE",
        default=None,
        help="write TFLOP/s against seq_len (tuned vs default) as an image",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def _devices(store, gpu_name: str | None) -> dict[str, dict]:
    devices = store.devices()
    if gpu_name is None:
        return devices
    from tuner.gpus import profile_for_device_name, resolve_gpu

    # A filter, not a target: any profile, not only the local GPU's ('auto' is that one).
    profile = resolve_gpu(gpu_name, require_local=False)
    return {
        i: fp
        for i, fp in devices.items()
        if profile_for_device_name(fp.get("name", "")) is profile
    }


def winner_rows(store, devices: dict[str, dict], keep=None) -> list[dict]:
    """One row per stored winner of `devices` (with `keep`, a predicate on the Problem, those it
    keeps)."""
    rows = []
    for device_id, fp in devices.items():
        for w in store.winners(device_id):
            p = Problem.from_key(w.problem_key)
            if keep is not None and not keep(p):
                continue
            d = w.default_trial
            t = w.trial
            rows.append(
                {
                    "device": fp.get("name"),
                    "device_id": device_id,
                    "problem": w.problem_key,
                    "seq_len": p.seq_len,
                    "heads": p.heads,
                    "seq_len_kv": p.seq_len_kv,
                    "kv_heads": p.kv_heads,
                    "causal": p.causal,
                    "family_set": w.family_set,
                    "family": w.family,
                    "config": w.config,
                    "median_ms": t.median_ms,
                    "prepare_ms": t.prepare_ms,
                    "iqr_ms": t.iqr_ms,
                    "tflops": t.tflops,
                    "default_ms": d.median_ms if d else None,
                    "default_prepare_ms": d.prepare_ms if d else None,
                    "default_tflops": d.tflops if d else None,
                    # (default kernel + prepare) / (winner kernel + prepare), what the search
                    # ranked by.
                    "speedup_over_default": w.speedup_over_default,
                    "rel_rms": t.rel_rms,
                    "e2e_error": t.e2e_error,
                    "e2e_data": t.e2e_data,
                    "max_error": t.max_error,
                    "decided_at": w.decided_at.isoformat() if w.decided_at else None,
                    "code_version": t.code_version,
                }
            )
    return sorted(rows, key=lambda r: (r["device"] or "", r["causal"], r["heads"], r["kv_heads"],
                                       r["seq_len"], r["seq_len_kv"], r["family_set"]))


def peer_rows(store, devices: dict[str, dict], rows: list[dict]) -> list[dict]:
    """The latest `tuner bench` timing of each peer system for the problems in `rows`."""
    latest: dict[tuple, dict] = {}
    for r in rows:
        problem = Problem.from_key(r["problem"])
        for t in store.trials(problem, device_id=r["device_id"], family_set="bench"):
            if t.role == Role.BENCH and t.tflops:
                latest[(r["device_id"], r["problem"], t.family)] = {
                    "system": t.family, "device": devices[r["device_id"]].get("name"),
                    "problem": r["problem"],
                    "heads": problem.heads, "seq_len": problem.seq_len, "tflops": t.tflops,
                }
    return list(latest.values())


def _fmt(x, spec=".3f") -> str:
    return "-" if x is None else format(x, spec)


def _e2e(error, data) -> str:
    """The accuracy budget's error and its data ("0.0663 realistic", or the error and
    "calibration:" with the file's sha256 prefix)."""
    if error is None:
        return "-"
    return f"{error:.4f} " + (data or "?").replace("calibration:", "calib:")[:14]


def _print_winners(rows: list[dict]) -> None:
    from rich.table import Table

    table = Table(title="Stored winners (times hold on the device they were measured on; the "
                  "speedup compares kernel + prepare, what the search ranks by)")
    for col in ("device", "problem", "family set", "family", "config", "kernel ms", "prepare ms",
                "default kernel ms", "default prepare ms", "speedup (kernel+prepare)", "TFLOP/s",
                "gate rel err", "e2e err"):
        table.add_column(col)
    for r in rows:
        cfg = " ".join(f"{k}={v}" for k, v in r["config"].items())
        table.add_row(
            r["device"],
            r["problem"],
            r["family_set"],
            r["family"],
            cfg,
            _fmt(r["median_ms"]),
            _fmt(r["prepare_ms"]),
            _fmt(r["default_ms"]),
            _fmt(r["default_prepare_ms"]),
            _fmt(r["speedup_over_default"], ".3f"),
            _fmt(r["tflops"], ".0f"),
            _fmt(r["rel_rms"], ".4f"),
            _e2e(r["e2e_error"], r["e2e_data"]),
        )
    wide_console().print(table)


def _trials(store, devices, seq_len: int, heads: int | None, as_json: bool, keep) -> int:
    shown = []
    for device_id, fp in devices.items():
        for w in store.winners(device_id):
            p = Problem.from_key(w.problem_key)
            if p.seq_len == seq_len and (heads is None or p.heads == heads) and keep(p):
                shown.append((fp, p))
    problems = {p for _, p in shown}
    if not problems:
        # A problem searched but never decided still has trials: look it up by key directly.
        raise TunerError(f"no stored winner for seq_len {seq_len} with the filters given; "
                         "`tuner show` lists them")
    out = []
    for p in sorted(problems, key=lambda p: p.key()):
        trials = [t for d in devices for t in store.trials(p, device_id=d)]
        out.append((p, trials))
    if as_json:
        print(
            json.dumps(
                [
                    {
                        "problem": p.key(),
                        "outcomes": Counter(t.outcome for t in ts),
                        "trials": [
                            {
                                "id": t.id,
                                "family": t.family,
                                "config": t.config,
                                "outcome": t.outcome,
                                "median_ms": t.median_ms,
                                "prepare_ms": t.prepare_ms,
                                "e2e_error": t.e2e_error,
                                "e2e_data": t.e2e_data,
                                "max_error": t.max_error,
                                "message": t.message,
                            }
                            for t in ts
                        ],
                    }
                    for p, ts in out
                ],
                indent=1,
                default=str,
            )
        )
        return 0
    from rich.table import Table

    console = wide_console()
    for p, ts in out:
        counts = Counter(t.outcome for t in ts)
        table = Table(
            title=f"{p.key()}: {len(ts)} trials, "
            + ", ".join(f"{k} {v}" for k, v in counts.most_common())
        )
        for col in ("#", "role", "family", "config", "outcome", "kernel ms", "prepare ms",
                    "TFLOP/s", "e2e err", "message"):
            table.add_column(col)
        for t in ts:
            cfg = " ".join(f"{k}={v}" for k, v in t.config.items())
            table.add_row(
                str(t.id),
                t.role,
                t.family,
                cfg,
                t.outcome,
                _fmt(t.median_ms),
                _fmt(t.prepare_ms),
                _fmt(t.tflops, ".0f"),
                _e2e(t.e2e_error, t.e2e_data),
                (t.message or "")[:80],
            )
        console.print(table)
    return 0


def run(args) -> int:
    from tuner.store import Store

    store = Store(args.db, readonly=True)
    try:
        devices = _devices(store, args.gpu)
        keep = shape_filter(args)
        if args.trials is not None:
            return _trials(store, devices, args.trials, args.heads, args.json, keep)
        rows = winner_rows(store, devices, keep)
        if args.plot:
            from tuner.report import plot_winners

            peers = peer_rows(store, devices, rows)
            print(f"wrote {plot_winners(rows, args.plot, peers=peers)}")
        if args.json:
            print(json.dumps(rows, indent=1, default=str))
        elif not rows:
            print(f"no stored winners in {display_url(store.url)}; run `tuner search` first")
        else:
            _print_winners(rows)
    finally:
        store.close()
    return 0
