"""The correctness gate's arithmetic: its own FP8 quantization, the fp32 reference, the metrics.

Independence. The gate never trusts a candidate's `prepare`: `quantize_reference` quantizes the
original bf16/fp16 inputs with the one plain formula README documents (per (batch, head):
code = round_e4m3(x * 448 / amax), descale = amax / 448), the reference is computed from those
codes, and `prepare_mismatch` separately checks that the candidate's prepared inputs decode to
exactly the same numbers. A prepare that permutes keys or mis-scales a head is then a failure
that names `prepare`, instead of a blind spot the kernel and its reference share.

Metrics. A global relative RMS hides an error confined to a few rows, one head or a small
systematic scale inside the FP8 rounding noise, so beside it the gate checks the worst row,
the least-squares output scale of every (batch, head), and LSE against a bound that grows with
the score magnitude. Every threshold lives in the block below, with its derivation.

The error of FP8 quantization itself is reported by `end_to_end_error` (kernel vs fp32
attention on the original inputs), never gated: it measures the format, not the kernel.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

E4M3_MAX = 448.0
DESCALE_PER_AMAX = 1.0 / E4M3_MAX  # descale = amax * fl32(1 / 448), the rounding prepare uses
# An all-zero (batch, head) slice gets amax 1e-12 instead of a division by zero (as prepare).
TINY_AMAX = 1e-12

# ---- Acceptance thresholds: the only place they live -------------------------------------------
# The kernel rounds P = 256 * exp(s - m) to e4m3 before P @ V. e4m3 keeps 3 mantissa bits, so a
# normal value is off by at most half an ulp: a relative error of 2^-4 (uniform rounding error
# has an RMS of 2^-4/sqrt(3) = 3.6%). Each output element O_j = sum_i p_i v_ij / l is then off by
# a p-weighted average of per-key errors each within 2^-4 |p_i v_ij|: relative RMS over the whole
# output is at most 2^-4.
REL_RMS_MAX = 2.0**-4
# Per query row, the error vector e = sum_i d_i p_i v_i / l (|d_i| <= 2^-4, independent roundings)
# has E|e|^2 <= 2^-8 sum_i p_i^2 |v_i|^2 / l^2: its scale is the `noise` norm
# sqrt(sum_i p_i^2 |v_i|^2) of the normalized weights, which equals |O_row| for a row peaked on
# one key and exceeds it for a diffuse row, whose output averages V rows that cancel. So the row
# error is measured relative to max(|ref row|, noise, floor) and may reach 2x the per-element
# 2^-4: the margin covers P values in e4m3's subnormal range (absolute spacing 2^-17 in units of
# the row maximum, so an incoherent sum over S keys of at most sqrt(S) 2^-18 max|v|: the floor
# below), the QK^T accumulator error of LSE_QK_REL (scores off by at most a few percent of a
# unit in the gate's inputs) and bf16 output rounding (2^-9). A row mix-up, a masking bug or an
# unwritten row is an O(1) error on this scale.
ROW_REL_MAX = 2.0**-3
ROW_FLOOR_PER_SQRT_KEY = 2.0**-16  # x sqrt(S) x RMS of |v_i|: 4x the subnormal bound above
# The least-squares slope of a head's output on its reference, sum(o r) / sum(r r), is 1 up to
# unbiased rounding (round-to-nearest-even P and bf16; their mean over S x D elements vanishes
# like 1/sqrt(S D)) plus the systematic part of the accumulators' error (< 2^-10 measured on the
# H200, benchmarks/RESULTS.md). A wrong descale, a missing 1/l term or a dropped tile of keys
# scales a head by a few percent or more; 2^-6 = 1.6% catches a 3% error with 2x margin.
HEAD_SLOPE_MAX = 2.0**-6
# LSE = m + log(l) with m from the QK^T accumulator and l an fp32 sum of exp2.approx values
# (relative error 2^-22 each; a sum of S <= 2^17 terms loses at most ~S 2^-24 relative, in
# practice sqrt(S) 2^-24): 2^-8 absolute covers that and lg2.approx. On top of it comes the error
# of the scores, which LSE averages with the row's own weights (d LSE / d s_j = p_j). The FP8
# wgmma accumulator is no fp32 accumulator: it truncates (benchmarks/RESULTS.md, "QK^T
# accumulator", H200): a score's error grows with sum_d |q_d k_d| (cuBLAS FP8 GEMM with the
# tensor core accumulating alone: -6.1e-4 mean, 1.9e-3 max of it at K = 128 on same-sign
# operands, 10x less at K = 32), and the wgmma kernel's LSE on peaked rows is off by up to
# 1.47e-3 of that magnitude at head_dim 128 (0.125 at LSE = 111; 2.0 at LSE = 1856), 8.8e-4 at
# head_dim 64, while mma_sync (fp32 accumulation) stays at 3e-7. So the bound grows with the
# row's p-weighted score magnitude sum_j p_j scale sum_d |q_d k_jd|, with a 2.7x margin over the
# H200 measurement. A masking bug moves LSE by O(0.1 .. 1) at any magnitude.
LSE_ABS_MAX = 2.0**-8
LSE_QK_REL = 2.0**-8


@dataclass(frozen=True)
class ReferenceInputs:
    """The gate's own quantization of q, k, v: e4m3 codes (batch, seq_len, heads, head_dim) in
    the natural layout, no padding, and the per-(batch, head) descales (batch, heads, 3)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    descale: torch.Tensor
    softmax_scale: float

    @property
    def seq_len(self) -> int:
        return self.q.shape[1]

    def dequantized(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return tuple(x.float() * self.descale[:, None, :, i, None]
                     for i, x in enumerate((self.q, self.k, self.v)))


def quantize_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       softmax_scale: float | None = None) -> ReferenceInputs:
    """The documented per-(batch, head) FP8 formula, written plainly (no fused kernel, no
    layout): amax over (seq_len, head_dim) in fp32, code = e4m3(clamp(x * (448 / amax)))."""
    codes, descales = [], []
    for x in (q, k, v):
        x32 = x.float()
        amax = x32.abs().amax(dim=(1, 3)).clamp_min(TINY_AMAX)  # (batch, heads)
        scale = amax.reciprocal() * E4M3_MAX  # fl(fl(1 / amax) * 448), as prepare
        # Rounding can land a hair above 448 and e4m3fn has no Inf: clamp before the cast.
        codes.append((x32 * scale[:, None, :, None]).clamp(-E4M3_MAX, E4M3_MAX)
                     .to(torch.float8_e4m3fn))
        descales.append(amax * DESCALE_PER_AMAX)
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else float(softmax_scale)
    return ReferenceInputs(*codes, descale=torch.stack(descales, dim=-1), softmax_scale=scale)


def _first_mismatch(name: str, got: torch.Tensor, want: torch.Tensor, dims: str) -> str | None:
    bad = ~(got == want)  # NaN counts as a mismatch
    count = int(bad.sum())
    if not count:
        return None
    where = [int(i) for i in bad.nonzero()[0]]
    place = ", ".join(f"{d} {i}" for d, i in zip(dims.split(), where, strict=True))
    first = tuple(where)
    return (f"{name} differs from the gate's quantization at {count} of {bad.numel()} elements "
            f"(first at {place}: {float(got[first]):.6g} vs {float(want[first]):.6g})")


def prepare_mismatch(prepared, ref: ReferenceInputs) -> str | None:
    """None when the candidate's prepared inputs (variants.prepare.Fp8Inputs) decode, through the
    layout and key order they declare, to exactly the gate's codes and descales, with zero
    padding; else what differs, naming prepare."""
    batch, seq_len, heads, head_dim = ref.q.shape
    if prepared.seq_len != seq_len or tuple(prepared.q.shape[::2]) != (batch, heads):
        return (f"prepare: prepared inputs are for seq_len {prepared.seq_len}, shape "
                f"{tuple(prepared.q.shape)}; the inputs were {tuple(ref.q.shape)}")
    if not math.isclose(prepared.softmax_scale, ref.softmax_scale, rel_tol=1e-6):
        return (f"prepare: softmax_scale {prepared.softmax_scale:.6g}, expected "
                f"{ref.softmax_scale:.6g} (head_dim^-0.5)")
    for i, name in enumerate(("q", "k", "v")):
        problem = _first_mismatch(f"{name} descale", prepared.descale[..., i].float(),
                                  ref.descale[..., i], "batch head")
        if problem:
            return f"prepare: {problem}"
    got = prepared.dequantized()
    for name, g, want in zip("qkv", got, ref.dequantized(), strict=True):
        problem = _first_mismatch(name, g, want, "batch token head dim")
        if problem:
            return (f"prepare: {problem}; the prepared codes are not what the layout and key "
                    "order they declare say")
    padding = prepared.padding()
    for name, pad in zip("qkv", padding, strict=True):
        if pad.numel() and bool((pad != 0).any()):
            return (f"prepare: {name}'s padding past seq_len {seq_len} is not zero "
                    f"({int((pad != 0).sum())} nonzero codes)")
    return None


@dataclass
class ReferenceResult:
    """fp32 reference of the rows checked: out (batch, rows, heads, head_dim); lse, noise and
    score magnitude (batch, heads, rows); `rows` the query indices (None: all)."""

    out: torch.Tensor
    lse: torch.Tensor
    noise: torch.Tensor  # sqrt(sum_i p_i^2 |v_i|^2): the scale of a row's rounding error
    score_magnitude: torch.Tensor  # sum_i p_i scale sum_d |q_d k_id|: what LSE's error scales by
    v_row_rms: torch.Tensor  # (batch, heads): RMS over keys of |v_i|
    rows: torch.Tensor | None
    seq_len: int


def _chunk_rows(seq_len: int, budget_bytes: int) -> int:
    # One chunk holds a (rows, seq_len) fp32 score block (plus its exp, in end_to_end_error).
    return max(1, min(seq_len, budget_bytes // (8 * seq_len)))


def reference_attention(inputs, rows: torch.Tensor | None = None, *,
                        score_budget_bytes: int = 1 << 29) -> ReferenceResult:
    """fp32 attention on `inputs.dequantized()` (ReferenceInputs, or a family's Fp8Inputs for a
    CPU test double) for the query `rows` (all when None).

    One (batch, head) at a time and `score_budget_bytes` of scores per query chunk, so that
    B=1, H=56, S=30272 peaks at well under 2 GB besides the inputs and outputs.
    """
    q, k, v = inputs.dequantized()
    batch, seq_len, heads, head_dim = q.shape
    if rows is not None:
        q = q[:, rows.to(q.device)]
    n_rows = q.shape[1]
    device = q.device
    out = torch.empty(batch, n_rows, heads, head_dim, dtype=torch.float32, device=device)
    lse, noise, magnitude = (torch.empty(batch, heads, n_rows, dtype=torch.float32,
                                         device=device) for _ in range(3))
    v_rms = torch.empty(batch, heads, dtype=torch.float32, device=device)
    chunk = _chunk_rows(seq_len, score_budget_bytes)
    for b in range(batch):
        for h in range(heads):
            qh = q[b, :, h] * inputs.softmax_scale
            kh, vh = k[b, :, h], v[b, :, h]
            v_norm2 = (vh * vh).sum(-1)
            k_abs = kh.abs()
            v_rms[b, h] = v_norm2.mean().sqrt()
            for r0 in range(0, n_rows, chunk):
                qc = qh[r0 : r0 + chunk]
                # The softmax in place in the score block: one (rows, seq_len) temporary.
                p = qc @ kh.t()
                row_max = p.amax(dim=-1)
                p.sub_(row_max[:, None]).exp_()
                row_sum = p.sum(dim=-1)
                p.div_(row_sum[:, None])
                out[b, r0 : r0 + chunk, h] = p @ vh
                lse[b, h, r0 : r0 + chunk] = row_max + row_sum.log()
                magnitude[b, h, r0 : r0 + chunk] = (qc.abs() * (p @ k_abs)).sum(-1)
                noise[b, h, r0 : r0 + chunk] = (p.square_() @ v_norm2).sqrt()  # p is spent
    return ReferenceResult(out, lse, noise, magnitude, v_rms, rows, seq_len)


@dataclass(frozen=True)
class AccuracyMetrics:
    rel_rms: float
    worst_row: float  # max over checked rows of |o - r| / max(|r|, noise, floor)
    worst_row_at: str
    head_slope_error: float  # max over (batch, head) of |slope - 1|
    head_slope_at: str
    lse_max_err: float
    lse_excess: float  # max over rows of |lse error| / its bound (<= 1 passes)
    lse_excess_at: str
    nonfinite: int  # NaN/Inf in out and lse (outputs are poisoned with NaN, so unwritten counts)
    written_share: float  # share of output elements that are finite

    @property
    def reason(self) -> str | None:
        """None when every threshold holds, else the first one broken, named."""
        if self.nonfinite:
            return (f"non-finite: {self.nonfinite} NaN/Inf outputs "
                    f"(written share {self.written_share:.4f})")
        if not self.worst_row <= ROW_REL_MAX:
            return (f"worst row: error {self.worst_row:.4g} of the row's scale > "
                    f"{ROW_REL_MAX:.4g} at {self.worst_row_at}")
        if not self.head_slope_error <= HEAD_SLOPE_MAX:
            return (f"head scale: output/reference slope off by {self.head_slope_error:.4g} > "
                    f"{HEAD_SLOPE_MAX:.4g} at {self.head_slope_at}")
        if not self.lse_excess <= 1.0:
            return (f"LSE: error {self.lse_excess:.3g}x its bound (max error "
                    f"{self.lse_max_err:.4g}) at {self.lse_excess_at}")
        if not self.rel_rms <= REL_RMS_MAX:
            return f"relative RMS {self.rel_rms:.4f} > {REL_RMS_MAX:.4f}"
        return None

    @property
    def passed(self) -> bool:
        return self.reason is None

    def to_dict(self) -> dict:
        return {**asdict(self), "passed": self.passed}


def _where(index: int, shape: tuple[int, ...], names: str, rows=None) -> str:
    coords = list(torch.unravel_index(torch.tensor(index), shape))
    parts = []
    for name, c in zip(names.split(), coords, strict=True):
        value = int(c)
        if name == "row" and rows is not None:
            value = int(rows[value])
        parts.append(f"{name} {value}")
    return " ".join(parts)


def accuracy(out: torch.Tensor, lse: torch.Tensor, ref: ReferenceResult) -> AccuracyMetrics:
    """Compare a kernel's whole (out, lse) with the reference rows it holds."""
    batch, seq_len, heads, head_dim = out.shape
    if seq_len != ref.seq_len or lse.shape != (batch, heads, seq_len) or \
            (batch, heads, head_dim) != (ref.out.shape[0], ref.out.shape[2], ref.out.shape[3]):
        raise ValueError(f"shape mismatch: out {tuple(out.shape)}, lse {tuple(lse.shape)} vs "
                         f"reference of seq_len {ref.seq_len}, out {tuple(ref.out.shape)}")
    out32, lse32 = out.float(), lse.float()
    # Every element, also of rows the reference skips: an unwritten row anywhere fails.
    finite_out = torch.isfinite(out32)
    nonfinite = int((~finite_out).sum()) + int((~torch.isfinite(lse32)).sum())
    written_share = float(finite_out.float().mean())
    if ref.rows is not None:
        rows = ref.rows.to(out.device)
        out32, lse32 = out32[:, rows], lse32[:, :, rows]
    diff = torch.nan_to_num(out32 - ref.out, nan=0.0, posinf=0.0, neginf=0.0)
    rel_rms = float(diff.norm()) / max(float(ref.out.norm()), 1e-30)

    row_err = diff.norm(dim=-1).transpose(1, 2)  # (batch, heads, rows)
    floor = ROW_FLOOR_PER_SQRT_KEY * math.sqrt(ref.seq_len) * ref.v_row_rms[..., None]
    row_scale = torch.maximum(torch.maximum(ref.out.norm(dim=-1).transpose(1, 2), ref.noise),
                              floor.clamp_min(1e-30))
    row_ratio = row_err / row_scale
    worst = int(row_ratio.argmax())

    ref_bh = ref.out.transpose(1, 2).flatten(2)  # (batch, heads, rows * head_dim)
    out_bh = torch.nan_to_num(out32).transpose(1, 2).flatten(2)
    energy = (ref_bh * ref_bh).sum(-1)
    slope = (out_bh * ref_bh).sum(-1) / energy.clamp_min(1e-30)
    # A head whose reference is all zero (V = 0) has no scale to check.
    slope_err = torch.where(energy > 0, (slope - 1).abs(), torch.zeros_like(slope))
    worst_head = int(slope_err.argmax())

    lse_err = torch.nan_to_num((lse32 - ref.lse).abs(), nan=0.0, posinf=0.0)
    lse_ratio = lse_err / (LSE_ABS_MAX + LSE_QK_REL * ref.score_magnitude)
    worst_lse = int(lse_ratio.argmax())
    shape = tuple(row_ratio.shape)
    return AccuracyMetrics(
        rel_rms=rel_rms,
        worst_row=float(row_ratio.flatten()[worst]),
        worst_row_at=_where(worst, shape, "batch head row", ref.rows),
        head_slope_error=float(slope_err.flatten()[worst_head]),
        head_slope_at=_where(worst_head, tuple(slope_err.shape), "batch head"),
        lse_max_err=float(lse_err.max()),
        lse_excess=float(lse_ratio.flatten()[worst_lse]),
        lse_excess_at=_where(worst_lse, shape, "batch head row", ref.rows),
        nonfinite=nonfinite,
        written_share=written_share,
    )


def validate(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
             lse: torch.Tensor, rows: torch.Tensor | None = None) -> AccuracyMetrics:
    """A kernel's (out, lse) for the original q, k, v against the reference on the gate's own
    quantization of them (prepare's output is checked apart: `prepare_mismatch`)."""
    return accuracy(out, lse, reference_attention(quantize_reference(q, k, v), rows))


def end_to_end_error(
    out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: float | None = None,
) -> float:
    """Relative RMS of a kernel's output against fp32 attention on the original inputs (FP8
    quantization included): reported beside the gated metrics, never gated, since it measures
    the format, not the kernel. Chunked per head like the reference."""
    batch, s, heads, head_dim = q.shape
    scale = head_dim**-0.5 if softmax_scale is None else softmax_scale
    num = den = 0.0
    rows = _chunk_rows(s, 1 << 29)
    for b in range(batch):
        for h in range(heads):
            qh, kh, vh = (x[b, :, h].float() for x in (q, k, v))
            for r0 in range(0, s, rows):
                probs = torch.softmax((qh[r0 : r0 + rows] * scale) @ kh.t(), dim=-1)
                ref = probs @ vh
                num += float(((out[b, r0 : r0 + rows, h].float() - ref) ** 2).sum())
                den += float((ref**2).sum())
    return math.sqrt(num / max(den, 1e-30))
