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

Other shapes and masks: both cases keep the problem's group size (query heads per KV head) and
mask. The structured case's key/value length is odd next to the problem's too, with at least 2
KV heads (so a wrong KV-head mapping has another head to land on), and as many query heads as
the group needs (2 x group when 8 // group < 2). Peaking and the outlier are per KV head: key
j < n = min(Sq, Skv) of KV head g is c q_{n-1-j} of the first query head of g's group (the other
query heads of a group see random scores), the sink is key 0 of every KV head, and the outlier
is the last KV head with every query head of its group. Under a causal mask the peak of an
early row can be a key it may not see; those rows are diffuse over what they see instead.

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
    seq_len_kv: int | None = None  # None: seq_len
    kv_heads: int | None = None  # None: heads
    causal: bool = False

    def problem(self, head_dim: int):
        from tuner.problem import Problem

        return Problem(self.batch, self.heads, self.seq_len, head_dim, self.causal,
                       self.seq_len_kv, self.kv_heads)

    @property
    def label(self) -> str:
        extra = ""
        if self.seq_len_kv not in (None, self.seq_len):
            extra += f" Skv={self.seq_len_kv}"
        if self.kv_heads not in (None, self.heads):
            extra += f" Hkv={self.kv_heads}"
        mask = " causal" if self.causal else ""
        return f"{self.name} inputs (B={self.batch} H={self.heads} S={self.seq_len}{extra}{mask})"


def _odd(n: int) -> int:
    return n if n % 2 else n + 1


def gate_cases(problem) -> list[GateCase]:
    group = problem.group
    # 2 to 8 query heads at group 1 (as before KV heads existed); else 2 KV heads or more.
    kv_heads = min(max(2, problem.kv_heads), max(2, MAX_STRUCTURED_HEADS // group))
    return [
        GateCase("random", problem.batch, problem.heads, problem.seq_len, False,
                 problem.seq_len_kv, problem.kv_heads, problem.causal),
        GateCase("structured", max(2, problem.batch), kv_heads * group, _odd(problem.seq_len),
                 True, _odd(problem.seq_len_kv), kv_heads, problem.causal),
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
    """q (batch, seq_len, heads, head_dim) and k, v (batch, seq_len_kv, kv_heads, head_dim) for
    one gate case, from a seeded generator."""
    import torch

    from tuner.measure import random_inputs

    problem = case.problem(head_dim)
    if not case.structured:  # the timing inputs' draw, in the target dtype (no fp32 copy)
        return random_inputs(problem, device, seed, dtype)
    dtype = dtype or torch.bfloat16
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(int(seed))
    q_shape = (case.batch, problem.seq_len, problem.heads, head_dim)
    kv_shape = (case.batch, problem.seq_len_kv, problem.kv_heads, head_dim)
    # fp32 construction, cast once at the end: the structure must survive in the caller's dtype.
    q, k, v = (torch.randn(shape, generator=gen, device=device)
               for shape in (q_shape, kv_shape, kv_shape))
    scale = head_dim**-0.5
    group = problem.group
    lead = q[:, :, ::group]  # the first query head of every KV head's group (a view)
    # Batch 0, peaked: key j is PEAK_GAIN q_{L-1-j} (of its group's first query head).
    n = min(problem.seq_len, problem.seq_len_kv)
    k[0, :n] = PEAK_GAIN * lead[0, :n].flip(0)
    # Batch 1, a sink at key 0 along a random unit direction u per KV head:
    # s_i0 = scale (z_i . u + SINK_OFFSET) b = SINK_LOGIT +- SINK_LOGIT / SINK_OFFSET.
    u = torch.randn((problem.kv_heads, head_dim), generator=gen, device=device)
    u = u / u.norm(dim=-1, keepdim=True)
    q[1] += SINK_OFFSET * u.repeat_interleave(group, dim=0)
    k[1, 0] = (SINK_LOGIT / (SINK_OFFSET * scale)) * u
    # The last KV head and its group of query heads: 1000x amax of q and v, 1/1000 of k's:
    # logits unchanged.
    q[..., -group:, :] *= OUTLIER_GAIN
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
        ref = reference_attention(ref_inputs, checked_rows(case, device, seed),
                                  causal=case.causal)
        metrics = accuracy(out, lse, ref)
        report.cases.append({"case": case.name, **metrics.to_dict()})
        if case.name == "random":
            report.rel_rms = metrics.rel_rms
        if not metrics.passed:
            report.reason = f"{case.label}: {metrics.reason}"
            return report
    return report
