"""fp32 reference attention on the dequantized FP8 inputs, and the acceptance metrics.

The reference sees exactly the numbers the kernel sees (q, k, v after e4m3 rounding and descale),
so its difference from a kernel measures the kernel alone: P rounding, accumulation order,
masking, layout bugs. The error of FP8 quantization itself is reported beside it by
`end_to_end_error` (kernel vs fp32 attention on the original bf16/fp16 inputs), never gated.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

from variants.prepare import Fp8Inputs

# ---- Acceptance thresholds: the only place they live -------------------------------------------
# The kernel rounds P = exp(s - m) * 256 to e4m3 before P @ V. e4m3 keeps 3 mantissa bits, so a
# normal value is off by at most half an ulp: a relative error of 2^-4. Each output element is a
# p-weighted average of V rows, O_j = sum_i p_i v_ij / l, so its error sum_i p_i d_i v_ij / l is a
# p-weighted average of per-key errors each within 2^-4 * |v_ij|: relative RMS over the output
# is at most 2^-4 (about 2^-4/sqrt(3) = 3.6% is typical for uniform rounding error).
REL_RMS_MAX = 2.0**-4
# Per element the same argument gives |dO_j| <= 2^-4 * max|v|; the x4 margin covers P values in
# e4m3's subnormal range (absolute spacing 2^-9 / 256 in P units), whose error adds up over very
# long rows (S = 30272) without being relative to p. A layout or masking bug is O(max|v|).
MAX_ABS_OVER_VMAX = 2.0**-2
# LSE = m + log(l) comes from fp32 scores and fp32 sums; a kernel that sums the *rounded* P into l
# is off by at most log(1 + 2^-4) ~ 2^-4 in the worst case. A masking bug that lets padded keys
# into l moves LSE by O(0.1..1).
LSE_ABS_MAX = 2.0**-4


@dataclass(frozen=True)
class AccuracyMetrics:
    rel_rms: float
    max_abs: float
    max_abs_limit: float
    lse_max_err: float
    nonfinite: int  # NaN/Inf in out and lse (outputs are poisoned with NaN, so unwritten counts)
    written_share: float  # share of output elements that are finite

    @property
    def reason(self) -> str | None:
        """None when every threshold holds, else the first one broken."""
        if self.nonfinite:
            return f"{self.nonfinite} NaN/Inf outputs (written share {self.written_share:.4f})"
        if not self.rel_rms <= REL_RMS_MAX:
            return f"relative RMS {self.rel_rms:.4f} > {REL_RMS_MAX:.4f}"
        if not self.max_abs <= self.max_abs_limit:
            return f"max abs error {self.max_abs:.4g} > {self.max_abs_limit:.4g}"
        if not self.lse_max_err <= LSE_ABS_MAX:
            return f"LSE error {self.lse_max_err:.4g} > {LSE_ABS_MAX:.4g}"
        return None

    @property
    def passed(self) -> bool:
        return self.reason is None

    def to_dict(self) -> dict:
        return {**asdict(self), "passed": self.passed}


def _chunk_rows(seq_len: int, budget_bytes: int) -> int:
    # One chunk holds a (rows, seq_len) fp32 score block plus its exp.
    return max(1, min(seq_len, budget_bytes // (8 * seq_len)))


def reference_attention(
    prepared: Fp8Inputs, *, score_budget_bytes: int = 1 << 29
) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 attention on the dequantized inputs: out (B, S, H, D) fp32, lse (B, H, S) fp32.

    One (batch, head) at a time and `score_budget_bytes` of scores per query chunk, so that
    B=1, H=56, S=30272 peaks at well under 2 GB besides the inputs and outputs.
    """
    s = prepared.seq_len
    batch, _, heads, head_dim = prepared.q.shape
    device = prepared.q.device
    out = torch.empty(batch, s, heads, head_dim, dtype=torch.float32, device=device)
    lse = torch.empty(batch, heads, s, dtype=torch.float32, device=device)
    rows = _chunk_rows(s, score_budget_bytes)
    for b in range(batch):
        for h in range(heads):
            dq, dk, dv = prepared.descale[b, h].tolist()
            q = prepared.q[b, :s, h].float() * (dq * prepared.softmax_scale)
            k = prepared.k[b, :s, h].float() * dk
            v = prepared.v_codes(b, h)[:, :s].float().t() * dv  # (S, D)
            for r0 in range(0, s, rows):
                scores = q[r0 : r0 + rows] @ k.t()
                row_lse = torch.logsumexp(scores, dim=-1)
                out[b, r0 : r0 + rows, h] = torch.exp(scores - row_lse[:, None]) @ v
                lse[b, h, r0 : r0 + rows] = row_lse
    return out, lse


def accuracy(
    out: torch.Tensor,
    lse: torch.Tensor,
    ref_out: torch.Tensor,
    ref_lse: torch.Tensor,
    v_absmax: float,
) -> AccuracyMetrics:
    """Compare a kernel's (out, lse) with the reference; `v_absmax` = max |dequantized v|."""
    if out.shape != ref_out.shape or lse.shape != ref_lse.shape:
        raise ValueError(
            f"shape mismatch: out {tuple(out.shape)} vs {tuple(ref_out.shape)}, "
            f"lse {tuple(lse.shape)} vs {tuple(ref_lse.shape)}"
        )
    out32, lse32 = out.float(), lse.float()
    finite_out = torch.isfinite(out32)
    nonfinite = int((~finite_out).sum()) + int((~torch.isfinite(lse32)).sum())
    written_share = float(finite_out.float().mean())
    diff = torch.where(finite_out, out32 - ref_out, torch.zeros_like(out32))
    ref_norm = float(torch.linalg.vector_norm(ref_out))
    rel_rms = float(torch.linalg.vector_norm(diff)) / max(ref_norm, 1e-30)
    lse_diff = torch.where(torch.isfinite(lse32), lse32 - ref_lse, torch.zeros_like(lse32))
    return AccuracyMetrics(
        rel_rms=rel_rms,
        max_abs=float(diff.abs().max()) if diff.numel() else 0.0,
        max_abs_limit=MAX_ABS_OVER_VMAX * max(v_absmax, 1e-30),
        lse_max_err=float(lse_diff.abs().max()) if lse_diff.numel() else 0.0,
        nonfinite=nonfinite,
        written_share=written_share,
    )


def dequantized_v_absmax(prepared: Fp8Inputs) -> float:
    # The descale is amax/448 per head and the largest code is 448: max|v| = max descale * 448
    # only if a code hits 448, so take the real maximum of the stored codes instead.
    # (B, H): over head_dim and keys, in either V layout.
    codes = prepared.v.float().abs().amax(dim=(2, 3) if prepared.v_feature_major else (1, 3))
    return float((codes * prepared.descale[..., 2]).max())


def validate(prepared: Fp8Inputs, out: torch.Tensor, lse: torch.Tensor) -> AccuracyMetrics:
    """Reference + metrics in one call: what the tuner's worker and the GPU tests use."""
    ref_out, ref_lse = reference_attention(prepared)
    return accuracy(out, lse, ref_out, ref_lse, dequantized_v_absmax(prepared))


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
