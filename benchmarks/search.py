"""search: the cost of a search. `tuner search` runs as a user runs it, once per group of --shapes
that differ only in S (one command searches a list of lengths), twice: cold (an empty compile
cache) and warm (the cache the cold run filled; a fresh results database either way, so both
measure the same candidates: --seed fixes the sampler). Reported: the command's wall time, and
from the trials it stored the sums of its stages: compile (in the compile pool, overlapping the
GPU), validate and time (on the GPU worker, one candidate at a time).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import common
from benchmarks.common import cell, markdown_table, shape_text

REPO = Path(__file__).resolve().parents[1]
HELP = "wall time of `tuner search` for a list of lengths, cold and with a warm compile cache"
DEFAULT_SHAPES = ("1,4096/8192,56,128",)
QUICK_SHAPES = ("1,4096,56,128",)


def add_arguments(parser) -> None:
    parser.add_argument("--trials", type=int, default=None,
                        help="candidates per length (tuner search --trials; default 24, "
                        "--quick 8); patience 0, so every search measures as many")
    parser.add_argument("--families", default="auto", help="tuner search --families")
    parser.add_argument("--timeout", type=float, default=540.0,
                        help="seconds allowed to each tuner search command (default 540)")
    parser.add_argument("--max-error", type=float, default=None,
                        help="tuner search --max-error (default: the search's own budget)")


def groups(problems) -> list[list]:
    """Problems that differ only in seq_len, together, in first-seen order."""
    found: dict[tuple, list] = {}
    for p in problems:
        cross = None if p.self_attention else p.seq_len_kv
        found.setdefault((p.batch, p.heads, p.head_dim, p.causal, p.kv_heads, cross),
                         []).append(p)
    return list(found.values())


def search_command(group: list, trials: int, db: str, families: str, seed: int,
                   max_error: float | None = None) -> list[str]:
    """The `tuner search` command line of one group."""
    p = group[0]
    cmd = [sys.executable, "-m", "tuner", "search", "--gpu", "auto",
           "--seq-lens", ",".join(str(q.seq_len) for q in group), "--batch", str(p.batch),
           "--heads", str(p.heads), "--head-dim", str(p.head_dim), "--families", families,
           "--trials", str(trials), "--patience", "0", "--seed", str(seed), "--db", db]
    if p.causal:
        cmd.append("--causal")
    if p.kv_heads != p.heads:
        cmd += ["--kv-heads", str(p.kv_heads)]
    if not p.self_attention:
        cmd += ["--kv-len", str(p.seq_len_kv)]
    if max_error is not None:
        cmd += ["--max-error", str(max_error)]
    return cmd


def stage_sums(trials) -> dict:
    """Measured candidates and the summed seconds of their stages, from stored TrialRecords
    (rows of `tuner bench` left out)."""
    mine = [t for t in trials if str(t.role) != "bench"]
    timed = [t for t in mine if t.timing and "validate_s" in t.timing]
    return {"trials": len(mine), "ok": sum(str(t.outcome) == "ok" for t in mine),
            "compile_s": sum(t.compile_s or 0.0 for t in mine),
            "validate_s": sum(t.timing["validate_s"] for t in timed),
            "accuracy_s": sum(t.timing.get("accuracy_s", 0.0) for t in timed),
            "time_s": sum(t.timing.get("time_s", 0.0) for t in timed)}


def _stored(db: str, group: list) -> dict:
    """stage_sums over the group's problems in the database (zeros where none was written)."""
    from tuner.errors import TunerError
    from tuner.store import Store

    try:
        store = Store(db, readonly=True)
    except TunerError:
        return stage_sums([])
    try:
        return stage_sums([t for p in group for t in store.trials(p)])
    finally:
        store.close()


def run(args, gpu) -> str:
    trials = common.sized(args.trials, 24, 8, args)
    rows, notes = [], []
    with tempfile.TemporaryDirectory(prefix="bench-search-") as tmp:
        for g, group in enumerate(groups(common.shapes_of(args))):
            cache = Path(tmp) / f"cache-{g}"
            env = {k: v for k, v in os.environ.items() if k != "TUNER_DB_URL"}
            env.update(TUNER_CACHE_DIR=str(cache), CUTE_DSL_CACHE_DIR=str(cache / "cute_dsl"),
                       TUNER_HOME=tmp)
            label = " ".join(shape_text(p) for p in group)
            for phase in ("cold", "warm"):
                db = f"sqlite:///{tmp}/{phase}-{g}.sqlite"
                cmd = search_command(group, trials, db, args.families, args.seed,
                                     args.max_error)
                t0 = time.perf_counter()
                try:
                    done = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True,
                                          text=True, timeout=args.timeout)
                    failed = done.returncode and (done.stderr.strip().splitlines() or ["?"])[-1]
                except subprocess.TimeoutExpired:
                    failed = f"stopped after {args.timeout:.0f} s"
                wall = time.perf_counter() - t0
                print(f"  {label} {phase}: {wall:.1f} s", flush=True)
                if failed:
                    notes.append(f"- {label} {phase}: {failed}")
                total = _stored(db, group)
                rows.append([label, phase, cell(wall, ".1f"), f"{total['ok']} of "
                             f"{total['trials']}", cell(total["compile_s"], ".1f"),
                             cell(total["validate_s"], ".1f"), cell(total["accuracy_s"], ".1f"),
                             cell(total["time_s"], ".1f")])
    parts = [f"`tuner search --trials {trials} --patience 0 --seed {args.seed}` per group "
             "(module docstring of benchmarks/search.py); stage sums over the stored trials.", "",
             markdown_table(["shapes", "compile cache", "wall s", "trials ok", "compile s (sum)",
                             "validate s (sum)", "accuracy s (sum)", "time s (sum)"], rows)]
    if notes:
        parts += ["", "Failed:", *notes]
    return "\n".join(parts)
