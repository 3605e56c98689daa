"""The correctness gate a candidate passes before it is timed (runs inside the sandbox).

Three input sets per candidate, each run into NaN-poisoned outputs and compared with the fp32
reference of variants/reference.py on the gate's own quantization of the inputs (docs/gate.md
has the why of each):

- `random`: the problem's own shape, standard normal (diffuse attention).
- `structured`: 2+ batches, 2 to 8 heads (>= 2 KV heads), odd lengths next to the problem's (every
  tile ragged on both axes): batch 0 peaked (key j is c q_{n-1-j} of its KV head's first query
  head), batch 1 a sink at key 0, the last KV head's group 1000x the amax of q and v.
- `realistic`: the structured case's shape, tuner.activations' "realistic" kind (a K channel bias,
  Q/K outlier channels): large scores, and a large LSE shift under K smoothing.
Every argument the runtime passes a kernel runs at a default and another value: the softmax scale
(STRUCTURED_SCALE x head_dim^-0.5 in structured), the q dtype (fp16 in structured where the config
reads it; a wgmma q_quant=kernel kernel reads bf16 only), want_lse (False in structured, where
either LSE passes), and the problem's mask, group size and lengths in every case. The transforms
the config asks for are checked against what prepare declares (variants/prepare_check.py).

Above ALL_ROWS_UP_TO a case checks the first and last EDGE_ROWS rows and every ROW_STRIDE-th row
between, from an offset the seed picks (~30x less reference at S = 30272); the NaN poison is
checked over every element. One compiled kernel serves every case (shapes are run time).
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
# The structured case's softmax scale, x head_dim^-0.5: a kernel that ignores the caller's scale
# is off by 1/0.7 in every logit there. Its peak and sink are built for this scale, so their
# logits are the ones derived above.
STRUCTURED_SCALE = 0.7


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
    activations: str | None = None  # a tuner.activations kind: the inputs are drawn from it
    scale_factor: float = 1.0  # the softmax scale, x head_dim^-0.5 (1: the kernel's default)
    fp16: bool = False  # fp16 inputs where the kernel's config reads them (else bf16)
    # run(..., want_lse=): False accepts the LSE of the transformed scores too (no shift added)
    want_lse: bool = True

    def softmax_scale(self, head_dim: int) -> float | None:
        """What the gate passes prepare: None (the default, head_dim^-0.5) or the case's."""
        return None if self.scale_factor == 1.0 else self.scale_factor * head_dim**-0.5

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
        if self.scale_factor != 1.0:
            mask += f" scale={self.scale_factor:g}/sqrt(d)"
        return f"{self.name} inputs (B={self.batch} H={self.heads} S={self.seq_len}{extra}{mask})"


def _odd(n: int) -> int:
    return n if n % 2 else n + 1


def gate_cases(problem) -> list[GateCase]:
    group = problem.group
    # 2 to 8 query heads at group 1; else 2 KV heads or more.
    kv_heads = min(max(2, problem.kv_heads), max(2, MAX_STRUCTURED_HEADS // group))
    small = (max(2, problem.batch), kv_heads * group, _odd(problem.seq_len))
    return [
        GateCase("random", problem.batch, problem.heads, problem.seq_len, False,
                 problem.seq_len_kv, problem.kv_heads, problem.causal),
        GateCase("structured", *small, True, _odd(problem.seq_len_kv), kv_heads, problem.causal,
                 scale_factor=STRUCTURED_SCALE, fp16=True, want_lse=False),
        GateCase("realistic", *small, False, _odd(problem.seq_len_kv), kv_heads,
                 problem.causal, activations="realistic"),
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

    from tuner.activations import activations
    from tuner.measure import random_inputs

    problem = case.problem(head_dim)
    if case.activations is not None:
        return activations(case.activations, problem, device, seed, dtype)
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
    # The case's softmax scale: the peak's and the sink's logits are those derived above at it.
    scale = case.scale_factor * head_dim**-0.5
    group = problem.group
    lead = q[:, :, ::group]  # the first query head of every KV head's group (a view)
    # Batch 0, peaked: key j is PEAK_GAIN q_{L-1-j} (of its group's first query head), in
    # units of the default scale.
    n = min(problem.seq_len, problem.seq_len_kv)
    k[0, :n] = (PEAK_GAIN / case.scale_factor) * lead[0, :n].flip(0)
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


def _prepare_knobs(kernel) -> tuple[str, str, object]:
    """(k_smoothing, qk_rotation, config) of the kernel's config: the transforms its prepare
    must apply ("off", "none" for a kernel without those knobs)."""
    cfg = getattr(kernel, "config", None)
    return (getattr(cfg, "k_smoothing", "off"), getattr(cfg, "qk_rotation", "none"), cfg)


def case_dtype(case: GateCase, cfg):
    """The case's q, k, v dtype for a kernel of this config: fp16 where the case asks for it
    and the config reads it (its for_q_dtype("float16") is itself), else bf16."""
    import torch

    if case.fp16 and (cfg is None or cfg.for_q_dtype("float16") == cfg):
        return torch.float16
    return torch.bfloat16


def validate_kernel(kernel, problem, device, seed: int) -> GateReport:
    """Every gate case in turn on fresh inputs; stops at the first failure."""
    import torch

    from tuner.measure import guarded, poisoned_outputs, synchronizer
    from variants.prepare_check import declared_transforms, prepare_mismatch
    from variants.reference import accuracy, quantize_reference, reference_attention

    device = torch.device(device)
    sync = synchronizer(device)
    k_smoothing, qk_rotation, cfg = _prepare_knobs(kernel)
    report = GateReport(reason=None, rel_rms=None)

    def failed(case, reason):
        report.reason = f"{case.label}: {reason}"
        report.cases.append({"case": case.name, "passed": False, "reason": reason})
        return report

    for index, case in enumerate(gate_cases(problem)):
        q, k, v = case_inputs(case, problem.head_dim, device, seed + 7919 * index,
                              case_dtype(case, cfg))
        scale = case.softmax_scale(problem.head_dim)
        prepared = guarded("prepare", kernel.prepare, q, k, v, scale, sync=sync)
        k_mean, mismatch = declared_transforms(prepared, k, k_smoothing, qk_rotation)
        if mismatch:
            return failed(case, mismatch)
        # P.V in 16 bits: V unquantized in the reference, the bf16 thresholds; an integer
        # QK^T: int8 q and k codes; per-head K/V scales: the gate's amax per head.
        ref_inputs = quantize_reference(q, k, v, scale, k_mean=k_mean,
                                        rotate=qk_rotation == "hadamard",
                                        v_unquantized=getattr(cfg, "v_unquantized", False),
                                        qk_int8=getattr(cfg, "qk_int8", False),
                                        kv_scales=getattr(cfg, "kv_scales", "block"))
        del q, k, v
        mismatch = prepare_mismatch(prepared, ref_inputs)
        if mismatch:
            return failed(case, mismatch)
        out, lse = poisoned_outputs(case.batch, case.heads, case.seq_len, problem.head_dim,
                                    device)
        out, lse = guarded("run", kernel.run, prepared, out=out, lse=lse,
                           want_lse=case.want_lse, sync=sync)
        del prepared
        ref = reference_attention(ref_inputs, checked_rows(case, device, seed),
                                  causal=case.causal)
        metrics = accuracy(out, lse, ref)
        if not case.want_lse and not metrics.passed and ref.lse_shift is not None:
            # Nobody reads this LSE: it may also be the transformed scores' own (no shift).
            unshifted = accuracy(out, lse, ref.unshifted())
            metrics = unshifted if unshifted.passed else metrics
        report.cases.append({"case": case.name, **metrics.to_dict()})
        if case.name == "random":
            report.rel_rms = metrics.rel_rms
        if not metrics.passed:
            report.reason = f"{case.label}: {metrics.reason}"
            return report
    return report
