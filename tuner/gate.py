"""The correctness gate a candidate passes before it is timed (runs inside the sandbox).

Two input sets per candidate, each run into NaN-poisoned outputs and compared with the fp32
reference of variants/reference.py on the gate's own quantization of the inputs:

- `random`: the problem's own shape, standard normal (diffuse attention), every row checked.
- `structured`: 2 or more batches and 2 to 8 heads (the random case covers the problem's own
  head count) at an odd length next to the problem's (so every
  tile size, a multiple of 16, is ragged on both axes). Batch 0 is peaked: key j is c q_{L-1-j},
  so query i is dominated by key L-1-i (the first rows by the last keys, the last rows by the
  first) and a row, key or tail mix-up is an O(1) error. Batch 1 has an attention sink: key 0
  takes ~30% of every row's weight, so a kernel that drops the first keys or tile is visible.
  Further batches are random. The last head has 1000x the amax of q and v and 1/1000 of k's
  (logits unchanged): a per-tensor scale or a head-index bug shows there.

Above ALL_ROWS_UP_TO, both cases check the first and last EDGE_ROWS rows whole and every
ROW_STRIDE-th row in between, from an offset the seed picks: every query tile (64 rows or more)
then has checked rows, successive candidates see different rows, and the fp32 reference, most of
the gate's cost, shrinks ~30x at S = 30272 (benchmarks/RESULTS.md). The NaN poison is still
checked over every element.

Kernels take batch, heads and seq_len at run time (variants/build.py), so one compiled kernel
serves both input sets.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Rows checked at long lengths: the first and last EDGE_ROWS (longer than any tile) whole, and
# every ROW_STRIDE-th row in between (half the smallest query tile, 64). Up to ALL_ROWS_UP_TO
# every row.
ALL_ROWS_UP_TO = 8192
EDGE_ROWS = 256
ROW_STRIDE = 32
# Peaked rows: the diagonal logit is c |q|^2 scale = c sqrt(head_dim) for unit-variance q; c = 1
# gives ~11 at head_dim 128 (the key holds ~90% of the row at L = 4097, ~60% at 30271) while
# keeping scores far from where the FP8 QK^T accumulator's error matters (see reference.py).
PEAK_GAIN = 1.0
# The sink key's logit: 8 +- 2 for every query (natural-log units).
SINK_LOGIT = 8.0
SINK_OFFSET = 4.0  # q's component along the sink direction, in units of its noise
OUTLIER_GAIN = 1000.0
# Structure needs no more heads than this; the reference costs one pass per (batch, head), and at
# H = 56 the structured case would otherwise cost 2x the random one.
MAX_STRUCTURED_HEADS = 8


@dataclass(frozen=True)
class GateCase:
    name: str
    batch: int
    heads: int
    seq_len: int
    structured: bool

    @property
    def label(self) -> str:
        return f"{self.name} inputs (B={self.batch} H={self.heads} S={self.seq_len})"


def gate_cases(problem) -> list[GateCase]:
    odd = problem.seq_len if problem.seq_len % 2 else problem.seq_len + 1
    heads = min(max(2, problem.heads), MAX_STRUCTURED_HEADS)
    return [
        GateCase("random", problem.batch, problem.heads, problem.seq_len, False),
        GateCase("structured", max(2, problem.batch), heads, odd, True),
    ]


def checked_rows(case: GateCase, device, seed: int = 0):
    """Query rows the reference computes (None: all)."""
    import torch

    s = case.seq_len
    if s <= ALL_ROWS_UP_TO:
        return None
    middle = torch.arange(EDGE_ROWS + seed % ROW_STRIDE, s - EDGE_ROWS, ROW_STRIDE, device=device)
    return torch.cat([torch.arange(EDGE_ROWS, device=device), middle,
                      torch.arange(s - EDGE_ROWS, s, device=device)])


def case_inputs(case: GateCase, head_dim: int, device, seed: int, dtype=None):
    """q, k, v (batch, seq_len, heads, head_dim) for one gate case, from a seeded generator."""
    import torch

    from tuner.measure import random_inputs
    from tuner.problem import Problem

    if not case.structured:  # the timing inputs' draw, in the target dtype (no fp32 copy)
        return random_inputs(Problem(case.batch, case.heads, case.seq_len, head_dim), device,
                             seed, dtype)
    dtype = dtype or torch.bfloat16
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(int(seed))
    shape = (case.batch, case.seq_len, case.heads, head_dim)
    # fp32 construction, cast once at the end: the structure must survive in the caller's dtype.
    q, k, v = (torch.randn(shape, generator=gen, device=device) for _ in range(3))
    scale = head_dim**-0.5
    # Batch 0, peaked: key j is PEAK_GAIN q_{L-1-j}.
    k[0] = PEAK_GAIN * q[0].flip(0)
    # Batch 1, a sink at key 0 along a random unit direction u per head:
    # s_i0 = scale (z_i . u + SINK_OFFSET) b = SINK_LOGIT +- SINK_LOGIT / SINK_OFFSET.
    u = torch.randn((case.heads, head_dim), generator=gen, device=device)
    u = u / u.norm(dim=-1, keepdim=True)
    q[1] += SINK_OFFSET * u
    k[1, 0] = (SINK_LOGIT / (SINK_OFFSET * scale)) * u
    # The last head: 1000x amax of q and v, 1/1000 of k's: logits unchanged.
    q[..., -1, :] *= OUTLIER_GAIN
    k[..., -1, :] /= OUTLIER_GAIN
    v[..., -1, :] *= OUTLIER_GAIN
    return tuple(x.to(dtype) for x in (q, k, v))


@dataclass
class GateReport:
    """What the gate found: `reason` names the case and the check that failed (None: passed).
    `rel_rms` is the random case's, the number stored with a trial."""

    reason: str | None
    rel_rms: float | None
    cases: list[dict] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.reason is None

    def to_dict(self) -> dict:
        return {"passed": self.passed, "reason": self.reason, "rel_rms": self.rel_rms,
                "cases": self.cases}


def validate_kernel(kernel, problem, device, seed: int) -> GateReport:
    """Every gate case in turn on fresh inputs; stops at the first failure."""
    import torch

    from tuner.measure import guarded, poisoned_outputs, synchronizer
    from variants.reference import (
        accuracy,
        prepare_mismatch,
        quantize_reference,
        reference_attention,
    )

    device = torch.device(device)
    sync = synchronizer(device)
    report = GateReport(reason=None, rel_rms=None)
    for index, case in enumerate(gate_cases(problem)):
        q, k, v = case_inputs(case, problem.head_dim, device, seed + 7919 * index)
        prepared = guarded("prepare", kernel.prepare, q, k, v, sync=sync)
        ref_inputs = quantize_reference(q, k, v)
        mismatch = prepare_mismatch(prepared, ref_inputs)
        if mismatch:
            report.reason = f"{case.label}: {mismatch}"
            report.cases.append({"case": case.name, "passed": False, "reason": mismatch})
            return report
        out, lse = poisoned_outputs(case.batch, case.heads, case.seq_len, problem.head_dim,
                                    device)
        out, lse = guarded("run", kernel.run, prepared, out=out, lse=lse, sync=sync)
        del prepared
        ref = reference_attention(ref_inputs, checked_rows(case, device, seed))
        metrics = accuracy(out, lse, ref)
        report.cases.append({"case": case.name, **metrics.to_dict()})
        if case.name == "random":
            report.rel_rms = metrics.rel_rms
        if not metrics.passed:
            report.reason = f"{case.label}: {metrics.reason}"
            return report
    return report
