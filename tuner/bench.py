"""`tuner bench` logic: time the stored winner, the family default and peers side by side.

Everything for one seq_len is timed in one process, one after another, with the search's timing
protocol (tuner.measure.time_kernel), so the ratios are side-by-side measurements. Our kernels
are validated against the fp32 reference before they are timed; a peer is timed as it is.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass

from tuner.peers import PEERS
from tuner.problem import Problem


@dataclass
class BenchRow:
    seq_len: int
    system: str  # tuned, default, head-scales, sdpa-cudnn, sdpa-flash, cudnn-fp8, fa3-fp8
    detail: str  # config (short) or backend; where the tuned config came from
    median_ms: float | None = None
    iqr_ms: float | None = None
    tflops: float | None = None
    pct_of_fp8_peak: float | None = None
    tuned_speedup: float | None = None  # this system's ms / tuned ms: > 1 means tuned is faster
    rel_rms: float | None = None
    note: str = ""
    prepare_ms: float | None = None  # what the caller pays before the kernel (its prepare)

    def to_dict(self) -> dict:
        return asdict(self)


def _time(kernel, problem, gpu, repeats: int, seed: int):
    import torch

    from tuner.measure import time_kernel

    return time_kernel(kernel, problem, torch.device("cuda"), seed, gpu.l2_bytes, repeats=repeats)


# What --against may name: "sdpa" is both SDPA backends; "head-scales" is the tuned config
# with one K and one V scale per (batch, KV head) (wgmma's kv_scales), FA3 FP8's convention.
AGAINST = ("default", "head-scales", "sdpa", *PEERS)


def our_systems(best, against: list[str], problem, gpu) -> list[tuple]:
    """(system, family, config or None, detail) of our rows: the tuned config, then those
    `against` names; a config None where the family cannot build that system (the detail says
    why)."""
    from variants import load_family

    family = load_family(best.family)
    ours = [("tuned", best.family, best.config, f"{best.source}")]
    if "default" in against:
        ours.append(("default", best.family, family.default(gpu.arch, problem), "family default"))
    if "head-scales" in against:
        cfg, why = None, f"skipped: {best.family} has no kv_scales knob"
        if hasattr(best.config, "kv_scales"):
            cfg = dataclasses.replace(best.config, kv_scales="head", q_quant="prepare")
            ok, reason = family.can_implement(cfg, problem, gpu)
            cfg, why = (cfg, "tuned, K/V scales per head") if ok else (None, f"skipped: {reason}")
        ours.append(("head-scales", best.family, cfg, why))
    return ours


def bench_seq_len(
    problem: Problem,
    gpu,
    against: list[str],
    *,
    repeats: int = 20,
    seed: int = 0,
    db: str | None = None,
) -> list[BenchRow]:
    import torch

    from tuner import runtime
    from tuner.gate import validate_kernel
    from tuner.measure import CandidateFailure
    from tuner.peers import PeerUnavailable, make_peer
    from variants import load_family

    rows: list[BenchRow] = []
    best = runtime.config_for_problem(problem, gpu=gpu.name, db=db)  # what attention() runs
    for system, family_name, cfg, source in our_systems(best, against, problem, gpu):
        if cfg is None:
            rows.append(BenchRow(problem.seq_len, system, family_name, note=source))
            continue
        row = BenchRow(problem.seq_len, system, f"{family_name}: {cfg.short()} [{source}]")
        try:
            kernel = load_family(family_name).compile(cfg, problem, gpu.arch)
            metrics = validate_kernel(kernel, problem, torch.device("cuda"), seed)
            row.rel_rms = metrics.rel_rms
            if not metrics.passed:
                row.note = f"WRONG RESULT: {metrics.reason}"
            else:
                timing = _time(kernel, problem, gpu, repeats, seed)
                row.median_ms, row.iqr_ms = timing.median_ms, timing.iqr_ms
                row.prepare_ms = timing.prepare_ms
        except CandidateFailure as exc:
            row.note = f"{exc.outcome}: {exc.message[:120]}"
        rows.append(row)
    peers = []
    if "sdpa" in against:
        peers += [p for p in PEERS if p.startswith("sdpa-")]
    peers += [p for p in against if p in PEERS and p not in peers]
    for name in peers:
        row = BenchRow(problem.seq_len, name, "bf16" if name.startswith("sdpa") else "fp8 in/out")
        try:
            timing = _time(make_peer(name, problem), problem, gpu, repeats, seed)
            row.median_ms, row.iqr_ms = timing.median_ms, timing.iqr_ms
            row.prepare_ms = timing.prepare_ms
        except (PeerUnavailable, ImportError) as exc:
            row.note = f"skipped: {exc}"
        except (CandidateFailure, RuntimeError) as exc:
            row.note = f"failed: {str(exc).splitlines()[0][:120]}"
        rows.append(row)
    tuned_ms = rows[0].median_ms
    for row in rows:
        if row.median_ms:
            row.tflops = problem.tflops(row.median_ms)
            row.pct_of_fp8_peak = 100 * row.tflops / gpu.fp8_tflops
            if tuned_ms:
                row.tuned_speedup = row.median_ms / tuned_ms
    return rows


def store_peer_rows(store, device_id: str, problem: Problem, rows: list[BenchRow]) -> None:
    """Peers' timings go into the trials table (role 'bench'), so `tuner show --plot` can draw
    them beside the tuned line."""
    from tuner.outcomes import Outcome, Role
    from tuner.store import TrialRecord

    for row in rows:
        if row.system in ("tuned", "default") or row.median_ms is None:
            continue
        store.record_trial(
            TrialRecord(
                id=None,
                device_id=device_id,
                problem_key=problem.key(),
                family_set="bench",
                family=row.system,
                config={"detail": row.detail},
                config_hash=row.system,
                outcome=Outcome.OK,
                role=Role.BENCH,
                median_ms=row.median_ms,
                iqr_ms=row.iqr_ms,
                tflops=row.tflops,
            )
        )


def markdown_table(rows: list[BenchRow], gpu_label: str) -> str:
    lines = [
        f"Measured on {gpu_label}. Tuned speedup = system ms / tuned ms, one run, side by side.",
        "",
        "| S | system | config | ms | IQR ms | TFLOP/s | % FP8 peak | tuned speedup | rel RMS "
        "| note |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]

    def f(x, spec):
        return "" if x is None else format(x, spec)

    for r in rows:
        lines.append(
            f"| {r.seq_len} | {r.system} | {r.detail} | {f(r.median_ms, '.3f')} | "
            f"{f(r.iqr_ms, '.3f')} | {f(r.tflops, '.0f')} | {f(r.pct_of_fp8_peak, '.1f')} | "
            f"{f(r.tuned_speedup, '.2f')} | {f(r.rel_rms, '.4f')} | {r.note} |"
        )
    return "\n".join(lines)
