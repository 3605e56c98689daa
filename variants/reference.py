"""The correctness gate's arithmetic: its own FP8 quantization, the fp32 reference, the metrics.

Independence. The gate never trusts a candidate's `prepare`: `quantize_reference` quantizes the
original inputs with the one plain block formula (amax per token of q and per 64 keys of k and v,
or per (batch, KV head) of k and v for a config that reads them so: code = round_e4m3(x * 448 /
amax), descale = amax / 448; int8 q and k: round-half-even(x * 127 / amax) in [-127, 127], descale
= amax / 127), after the exact transforms the config asks for, written here from their spec's
constants (variants/transforms.py: sign bits, butterfly order, fl32(d^-0.5), the key sample of the
mean); variants/prepare_check.py checks that the candidate's prepared inputs decode to exactly
these numbers. A prepare that permutes keys, mis-scales a head or smooths with another head's mean
then fails naming `prepare`. With K smoothing the reference LSE adds softmax_scale * q . m from the
caller's q.

Metrics. A global relative RMS hides an error confined to a few rows, one head or a small
systematic scale inside the FP8 rounding noise, so beside it the gate checks the worst row,
the least-squares output scale of every (batch, head), and LSE against a bound that grows with
the score magnitude. Every threshold lives in variants/reference_bounds.py, with its derivation.

Shapes and masks. q is (batch, seq_len, heads, head_dim), k and v (batch, seq_len_kv, kv_heads,
head_dim); query head h reads KV head h // (heads // kv_heads), as a view. Causal masks align to
the bottom right (FlashAttention's): query i sees keys j <= i + seq_len_kv - seq_len; a query that
sees no key has output 0 and LSE -inf, exactly, and `accuracy` demands exactly that.

The error of FP8 quantization itself, `end_to_end_error` (kernel vs fp32 attention on the
original inputs), is not part of the gate: it measures the format, not the kernel. The accuracy
budget of a search (tuner/budget.py) holds candidates to it, as a separate check.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass

import torch

from variants.block_scales import KV_BLOCK, BlockScales
from variants.reference_bounds import (
    HEAD_SLOPE_MAX,
    LSE_ABS_MAX,
    LSE_QK_REL,
    LSE_SHIFT_REL,
    ROW_FLOOR_PER_SQRT_KEY,
    ROW_QK_COVERED,
    ROW_SCALE_NOISE,
    thresholds,
)
from variants.transforms import HADAMARD_SIGN_BITS, MEAN_SAMPLE_KEYS

E4M3_MAX = 448.0
# descale = amax * fl32(1 / 448) (int8 q and k codes, qk_dtype="int8": fl32(1 / 127)), the
# rounding prepare uses
DESCALE_PER_AMAX = {448.0: 1.0 / 448.0, 127.0: 1.0 / 127.0}
INT8_MAX = 127.0
# An all-zero (batch, head) slice gets amax 1e-12 instead of a division by zero (as prepare).
TINY_AMAX = 1e-12

@dataclass(frozen=True)
class ReferenceInputs:
    """The gate's own quantization of q, k, v: e4m3 codes in the natural layout, no padding (q
    (batch, seq_len, heads, head_dim), k and v (batch, seq_len_kv, kv_heads, head_dim)), and
    their block scales (q's (batch, heads, seq_len), k's and v's (batch, kv_heads, blocks of
    64 keys)), the values a candidate's packed scales must hold. For P.V in 16 bits v is the
    caller's V in bf16 and its scales are 1 (v_unquantized)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    scales: BlockScales
    softmax_scale: float
    # The transforms applied before quantizing (as a candidate's Fp8Inputs declares them): k's
    # codes are of k - k_mean, q's and k's of q R and k R with qk_rotated.
    k_mean: torch.Tensor | None = None
    qk_rotated: bool = False
    # softmax_scale * q . m per row (batch, heads, seq_len), the gate's own from the caller's q,
    # and scale * sum_d |q_d m_d| (its rounding scale); None without smoothing.
    lse_shift: torch.Tensor | None = None
    lse_shift_magnitude: torch.Tensor | None = None

    @property
    def seq_len(self) -> int:
        return self.q.shape[1]

    @property
    def seq_len_kv(self) -> int:
        return self.k.shape[1]

    @property
    def group(self) -> int:
        return self.q.shape[2] // self.k.shape[2]

    @property
    def v_unquantized(self) -> bool:
        return self.v.dtype != torch.float8_e4m3fn

    def entry_descales(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The descales as tuner.attention_fp8 takes them at the fine granularity: q's (batch,
        seq_len, heads), k's and v's (batch, blocks of 64 keys, kv_heads)."""
        return tuple(d.permute(0, 2, 1) for d in (self.scales.q, self.scales.k, self.scales.v))

    def dequantized(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """fp32 q, k, v in their own shapes: q's scale per token, k's and v's per 64 keys."""
        skv = self.seq_len_kv
        return (self.q.float() * self.scales.q.permute(0, 2, 1)[..., None],
                self.k.float() * self.scales.per_key("k")[:, :skv],
                self.v.float() * self.scales.per_key("v")[:, :skv])


def _group(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> int:
    """Query heads per KV head, after checking the shapes the reference computes with."""
    if k.shape != v.shape or k.shape[0] != q.shape[0] or k.shape[3] != q.shape[3]:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: k and v "
                         "must match each other, and q in batch and head_dim")
    if q.shape[2] % k.shape[2]:
        raise ValueError(f"{q.shape[2]} query heads are not a multiple of {k.shape[2]} KV heads")
    return q.shape[2] // k.shape[2]


def reference_key_mean(k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The gate's own smoothing vector of k (batch, seq_len_kv, kv_heads, head_dim): the plain
    fp32 mean of keys 0, s, 2s, ... with s = max(1, seq_len_kv // MEAN_SAMPLE_KEYS) (the spec's
    sample rule), and the sample's mean |k| per feature (MEAN_SUM_REL's scale); each (batch,
    kv_heads, head_dim)."""
    stride = max(1, k.shape[1] // MEAN_SAMPLE_KEYS)
    sample = k[:, ::stride].float()
    return sample.sum(dim=1) / sample.shape[1], sample.abs().sum(dim=1) / sample.shape[1]


def reference_rotate(x: torch.Tensor) -> torch.Tensor:
    """x (..., d) times R = diag(signs) H / sqrt(d) in fp32, from the spec's constants alone:
    sign i negative where bit i of HADAMARD_SIGN_BITS is set, then for stride 1, 2, ..., d/2 the
    pairs (i, i + stride), bit `stride` of i clear, become (a + b, a - b), then one multiply by
    fl32(d^-0.5). Each step is one fp32 operation per element, so the values are prepare's to
    the bit whatever code computes them."""
    d = x.shape[-1]
    signs = torch.tensor([-1.0 if HADAMARD_SIGN_BITS >> i & 1 else 1.0 for i in range(d)],
                         device=x.device)
    y = x.float() * signs
    index = torch.arange(d, device=x.device)
    stride = 1
    while stride < d:
        low = index[(index & stride) == 0]
        a, b = y[..., low], y[..., low + stride]
        y = torch.empty_like(y)
        y[..., low], y[..., low + stride] = a + b, a - b
        stride *= 2
    return y * float(torch.tensor(d**-0.5, dtype=torch.float32))


def _per_query_head(q32: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """(batch, heads, seq_len) sum_d q_d m_d for q (batch, seq_len, heads, head_dim) and m
    (batch, kv_heads, head_dim), query head h with KV head h // group."""
    m_q = m.repeat_interleave(q32.shape[2] // m.shape[1], dim=1)  # (batch, heads, head_dim)
    return (q32.permute(0, 2, 1, 3) @ m_q[..., None])[..., 0]


def quantize_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       softmax_scale: float | None = None, *, k_mean: torch.Tensor | None = None,
                       rotate: bool = False, v_unquantized: bool = False,
                       qk_int8: bool = False, kv_scales: str = "block") -> ReferenceInputs:
    """The documented block formula, written plainly (no fused kernel, no layout, not
    variants/block_scales.py's code): amax in fp32 over head_dim of each q token and head, and
    over each 64 keys x head_dim of a k or v KV head; code = e4m3(clamp(x * (448 / amax))).
    k_mean (batch, kv_heads, head_dim): k - k_mean is quantized (every key) and the LSE shift
    softmax_scale * q . k_mean computed from the caller's q; rotate: q and k (after smoothing)
    are rotated first (reference_rotate). v_unquantized (P.V in 16 bits): V is not quantized
    but read as bf16 (the caller's bf16 V exactly; an fp16 V rounded once), its scales 1.
    qk_int8: q's and k's codes are int8, code = round-half-even(clamp(x * (127 / amax))).
    kv_scales="head": k's and v's amax over all keys and features of each (batch, KV head),
    every 64-key block's descale that head's."""
    _group(q, k, v)
    if kv_scales not in ("block", "head"):
        raise ValueError(f"kv_scales={kv_scales!r}: 'block' or 'head'")
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else float(softmax_scale)
    q32, k32 = q.float(), k.float()
    shift = magnitude = None
    if k_mean is not None:
        shift = _per_query_head(q32, k_mean) * scale
        magnitude = _per_query_head(q32.abs(), k_mean.abs()) * scale
        k32 = k32 - k_mean[:, None]
    if rotate:
        q32, k32 = reference_rotate(q32), reference_rotate(k32)
    codes, descales = [], []
    for index, x32 in enumerate((q32, k32) if v_unquantized else (q32, k32, v.float())):
        batch, length, heads, dim = x32.shape
        if index == 0:
            amax = x32.abs().amax(dim=3, keepdim=True)  # (batch, seq, heads, 1)
        elif kv_scales == "head":
            amax = x32.abs().amax(dim=(1, 3), keepdim=True).expand(batch, length, heads, 1)
        else:
            blocks = -(-length // KV_BLOCK)
            padded = torch.zeros(batch, blocks * KV_BLOCK, heads, dim, device=x32.device)
            padded[:, :length] = x32.abs()
            per_block = padded.view(batch, blocks, KV_BLOCK, heads, dim).amax(dim=(2, 4))
            amax = per_block.repeat_interleave(KV_BLOCK, dim=1)[:, :length, :, None]
        amax = amax.clamp_min(TINY_AMAX)
        top = INT8_MAX if qk_int8 and index < 2 else E4M3_MAX
        x_scale = amax.reciprocal() * top  # fl(fl(1 / amax) * 448 or 127), as prepare
        # Rounding can land a hair above 448 and e4m3fn has no Inf: clamp before the cast.
        if top == INT8_MAX:
            codes.append(torch.round(x32 * x_scale).clamp(-top, top).to(torch.int8))
        else:
            codes.append((x32 * x_scale).clamp(-top, top).to(torch.float8_e4m3fn))
        descale = amax * DESCALE_PER_AMAX[top]
        descales.append(descale[..., 0].permute(0, 2, 1) if index == 0
                        else descale[:, ::KV_BLOCK, :, 0].permute(0, 2, 1))
    if v_unquantized:
        codes.append(v.to(torch.bfloat16))
        descales.append(torch.ones_like(descales[1]))
    return ReferenceInputs(*codes, scales=BlockScales(*(d.contiguous() for d in descales)),
                           softmax_scale=scale, k_mean=k_mean, qk_rotated=rotate,
                           lse_shift=shift, lse_shift_magnitude=magnitude)


def empty_rows(seq_len: int, seq_len_kv: int, causal: bool) -> int:
    """How many leading query rows see no key: seq_len - seq_len_kv under a bottom-right causal
    mask when the queries are the longer, else none."""
    return max(0, seq_len - seq_len_kv) if causal else 0


def causal_masked(rows: torch.Tensor, seq_len: int, seq_len_kv: int) -> torch.Tensor:
    """(len(rows), seq_len_kv) bool, True where query row i may not see key j: j > i +
    seq_len_kv - seq_len (FlashAttention's bottom-right alignment)."""
    keys = torch.arange(seq_len_kv, device=rows.device)
    return keys[None, :] > (rows + (seq_len_kv - seq_len))[:, None]


@dataclass
class ReferenceResult:
    """fp32 reference of the rows checked: out (batch, rows, heads, head_dim); lse, noise, score
    magnitude and visible V norm (batch, heads, rows); `rows` the query indices (None: all).
    Rows that see no key hold out 0, LSE -inf and zero statistics."""

    out: torch.Tensor
    lse: torch.Tensor
    noise: torch.Tensor  # sqrt(sum_i p_i^2 |v_i|^2): the scale of a row's rounding error
    score_magnitude: torch.Tensor  # sum_i p_i scale sum_d |q_d k_id|: what LSE's error scales by
    visible_v_norm: torch.Tensor  # sqrt(sum over the keys the row sees of |v_i|^2): the floor's
    rows: torch.Tensor | None
    seq_len: int
    seq_len_kv: int | None = None  # None: seq_len
    causal: bool = False
    # The LSE shift added to `lse` (ReferenceInputs.lse_shift, the rows checked) and scale *
    # sum_d |q_d m_d|, the scale of its rounding (LSE_SHIFT_REL); None without one.
    lse_shift: torch.Tensor | None = None
    shift_magnitude: torch.Tensor | None = None
    # sqrt(sum_i p_i |v_i - o|^2): how far the output moves per unit of score error between
    # keys (ROW_QK_COVERED); None: no allowance for it.
    v_spread: torch.Tensor | None = None
    p16: bool = False  # P.V in 16 bits (inputs.v_unquantized): the bf16 thresholds apply

    def unshifted(self) -> ReferenceResult:
        """This reference with the LSE of the transformed scores (K smoothing's shift taken
        back out; the bound keeps its rounding term): what a kernel may return to a caller
        that does not want the LSE."""
        if self.lse_shift is None:
            return self
        return dataclasses.replace(self, lse=self.lse - self.lse_shift, lse_shift=None)

    @property
    def empty_rows(self) -> int:
        """Leading query rows (of all seq_len, checked or not) that see no key."""
        kv = self.seq_len if self.seq_len_kv is None else self.seq_len_kv
        return empty_rows(self.seq_len, kv, self.causal)


def _chunk_rows(seq_len_kv: int, budget_bytes: int) -> int:
    # One chunk holds a (rows, seq_len_kv) fp32 score block (plus its exp, in end_to_end_error)
    # and, with a causal mask, its bool mask.
    return max(1, min(seq_len_kv, budget_bytes // (9 * seq_len_kv)))


def reference_attention(inputs, rows: torch.Tensor | None = None, *, causal: bool = False,
                        score_budget_bytes: int = 1 << 29) -> ReferenceResult:
    """fp32 attention on `inputs.dequantized()` (ReferenceInputs, or a family's Fp8Inputs for a
    CPU test double) for the query `rows` (all when None), bottom-right causal if `causal`.
    A ReferenceInputs' lse_shift (K smoothing) is added to the LSE: the caller's LSE.

    One (batch, head) at a time and `score_budget_bytes` of scores per query chunk, so that
    B=1, H=56, S=30272 peaks at well under 2 GB besides the inputs and outputs; a KV head's
    K and V are read in place by each query head of its group.
    """
    q, k, v = inputs.dequantized()
    group = _group(q, k, v)
    batch, seq_len, heads, head_dim = q.shape
    seq_len_kv = k.shape[1]
    row_index = torch.arange(seq_len, device=q.device) if rows is None else rows.to(q.device)
    if rows is not None:
        q = q[:, row_index]
    n_rows = q.shape[1]
    device = q.device
    out = torch.empty(batch, n_rows, heads, head_dim, dtype=torch.float32, device=device)
    lse, noise, magnitude, v_norm, spread = (
        torch.empty(batch, heads, n_rows, dtype=torch.float32, device=device) for _ in range(5))
    chunk = _chunk_rows(seq_len_kv, score_budget_bytes)
    for b in range(batch):
        for h in range(heads):
            qh = q[b, :, h] * inputs.softmax_scale
            kh, vh = k[b, :, h // group], v[b, :, h // group]
            v_norm2 = (vh * vh).sum(-1)
            # Row i sees a prefix of the keys (or all): the floor's norm from a running sum.
            v_prefix = torch.cat([v_norm2.new_zeros(1), v_norm2.cumsum(0)])
            k_abs = kh.abs()
            for r0 in range(0, n_rows, chunk):
                at = slice(r0, r0 + chunk)
                qc = qh[at]
                # The softmax in place in the score block: one (rows, seq_len_kv) temporary.
                p = qc @ kh.t()
                if causal:
                    p.masked_fill_(causal_masked(row_index[at], seq_len, seq_len_kv),
                                   float("-inf"))
                    seen = (row_index[at] + (seq_len_kv - seq_len + 1)).clamp(0, seq_len_kv)
                else:
                    seen = torch.full_like(row_index[at], seq_len_kv)
                row_max = p.amax(dim=-1)
                # A row with no visible key is all -inf: subtract 0 there instead (exp -> 0).
                p.sub_(torch.where(seen > 0, row_max, 0.0)[:, None]).exp_()
                row_sum = p.sum(dim=-1)
                p.div_(row_sum.clamp_min(torch.finfo(torch.float32).tiny)[:, None])
                o = out[b, at, h] = p @ vh
                spread[b, h, at] = ((p @ v_norm2) - o.square().sum(-1)).clamp_min(0.0).sqrt()
                lse[b, h, at] = row_max + row_sum.log()  # -inf + log 0 = -inf: no key seen
                magnitude[b, h, at] = (qc.abs() * (p @ k_abs)).sum(-1)
                v_norm[b, h, at] = v_prefix[seen].sqrt()
                noise[b, h, at] = (p.square_() @ v_norm2).sqrt()  # p is spent
    shift = inputs.lse_shift if isinstance(inputs, ReferenceInputs) else None
    shift_magnitude = None
    if shift is not None:  # -inf (no key seen) + a finite shift stays -inf
        shift = shift[:, :, row_index]
        lse += shift
        shift_magnitude = inputs.lse_shift_magnitude[:, :, row_index]
    return ReferenceResult(out, lse, noise, magnitude, v_norm, rows, seq_len, seq_len_kv, causal,
                           shift, shift_magnitude, spread,
                           bool(getattr(inputs, "v_unquantized", False)))


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
    nonfinite: int  # NaN/Inf in out and lse (outputs are poisoned with NaN, so unwritten counts),
    # besides the -inf LSE of rows that see no key
    written_share: float  # share of output elements that are finite
    empty_row_errors: int = 0  # elements of rows that see no key other than out 0 and LSE -inf
    empty_row_at: str = ""
    p16: bool = False  # thresholds(p16): P in bf16 and V unquantized
    head_slope_max: float = HEAD_SLOPE_MAX  # head_slope_bound of the heads' checked rows

    @property
    def head_slope_excess(self) -> float:
        """head_slope_error / its bound (<= 1 passes)."""
        return self.head_slope_error / self.head_slope_max

    @property
    def reason(self) -> str | None:
        """None when every threshold holds, else the first one broken, named."""
        rel_rms_max, row_rel_max = thresholds(self.p16)
        if self.nonfinite:
            return (f"non-finite: {self.nonfinite} NaN/Inf outputs "
                    f"(written share {self.written_share:.4f})")
        if self.empty_row_errors:
            return (f"rows with no visible key: {self.empty_row_errors} values are not out 0 / "
                    f"LSE -inf, first at {self.empty_row_at}")
        if not self.worst_row <= row_rel_max:
            return (f"worst row: error {self.worst_row:.4g} of the row's scale > "
                    f"{row_rel_max:.4g} at {self.worst_row_at}")
        if not self.head_slope_error <= self.head_slope_max:
            return (f"head scale: output/reference slope off by {self.head_slope_error:.4g} > "
                    f"{self.head_slope_max:.4g} at {self.head_slope_at}")
        if not self.lse_excess <= 1.0:
            return (f"LSE: error {self.lse_excess:.3g}x its bound (max error "
                    f"{self.lse_max_err:.4g}) at {self.lse_excess_at}")
        if not self.rel_rms <= rel_rms_max:
            return f"relative RMS {self.rel_rms:.4f} > {rel_rms_max:.4f}"
        return None

    @property
    def passed(self) -> bool:
        return self.reason is None

    def to_dict(self) -> dict:
        return {**asdict(self), "head_slope_excess": self.head_slope_excess,
                "passed": self.passed}


def _where(index: int, shape: tuple[int, ...], names: str, rows=None) -> str:
    coords = list(torch.unravel_index(torch.tensor(index), shape))
    parts = []
    for name, c in zip(names.split(), coords, strict=True):
        value = int(c)
        if name == "row" and rows is not None:
            value = int(rows[value])
        parts.append(f"{name} {value}")
    return " ".join(parts)


def _empty_row_check(out32: torch.Tensor, lse32: torch.Tensor, n_empty: int) -> tuple[int, str]:
    """(count, where) of values in the leading n_empty rows (all of them, checked by the
    reference or not) other than out == 0 and lse == -inf; NaN counts (as non-finite too)."""
    if not n_empty:
        return 0, ""
    bad_out = out32[:, :n_empty] != 0  # (batch, rows, heads, head_dim)
    bad_lse = lse32[:, :, :n_empty] != float("-inf")  # (batch, heads, rows)
    count = int(bad_out.sum()) + int(bad_lse.sum())
    if not count:
        return 0, ""
    if bad_lse.any():
        b, h, r = (int(i) for i in bad_lse.nonzero()[0])
        return count, f"batch {b} head {h} row {r}: LSE {float(lse32[b, h, r]):.6g}"
    b, r, h, d = (int(i) for i in bad_out.nonzero()[0])
    return count, f"batch {b} head {h} row {r}: out[{d}] = {float(out32[b, r, h, d]):.6g}"


def head_slope_bound(rows: int) -> float:
    """The largest |slope - 1| a correct kernel's head of `rows` checked rows may show."""
    return max(HEAD_SLOPE_MAX, ROW_SCALE_NOISE / math.sqrt(max(rows, 1)))


def accuracy(out: torch.Tensor, lse: torch.Tensor, ref: ReferenceResult) -> AccuracyMetrics:
    """Compare a kernel's whole (out, lse) with the reference rows it holds; rows that see no
    key are compared exactly, all of them."""
    batch, seq_len, heads, head_dim = out.shape
    if seq_len != ref.seq_len or lse.shape != (batch, heads, seq_len) or \
            (batch, heads, head_dim) != (ref.out.shape[0], ref.out.shape[2], ref.out.shape[3]):
        raise ValueError(f"shape mismatch: out {tuple(out.shape)}, lse {tuple(lse.shape)} vs "
                         f"reference of seq_len {ref.seq_len}, out {tuple(ref.out.shape)}")
    out32, lse32 = out.float(), lse.float()
    n_empty = ref.empty_rows
    # Every element, also of rows the reference skips: an unwritten row anywhere fails. The
    # -inf LSE of a row that sees no key is its right value, not a non-finite one.
    finite_out = torch.isfinite(out32)
    lse_ok = torch.isfinite(lse32)
    lse_ok[:, :, :n_empty] |= lse32[:, :, :n_empty] == float("-inf")
    nonfinite = int((~finite_out).sum()) + int((~lse_ok).sum())
    written_share = float(finite_out.float().mean())
    empty_errors, empty_at = _empty_row_check(out32, lse32, n_empty)
    if ref.rows is not None:
        rows = ref.rows.to(out.device)
        out32, lse32 = out32[:, rows], lse32[:, :, rows]
        seeing = rows >= n_empty  # (rows,): the checked rows that see a key
    else:
        seeing = torch.arange(seq_len, device=out.device) >= n_empty
    diff = torch.nan_to_num(out32 - ref.out, nan=0.0, posinf=0.0, neginf=0.0)
    rel_rms = float(diff.norm()) / max(float(ref.out.norm()), 1e-30)

    # Rows that see no key were compared exactly above: the relative checks skip them.
    row_err = diff.norm(dim=-1).transpose(1, 2) * seeing  # (batch, heads, rows)
    floor = ROW_FLOOR_PER_SQRT_KEY * ref.visible_v_norm
    row_scale = torch.maximum(torch.maximum(ref.out.norm(dim=-1).transpose(1, 2), ref.noise),
                              floor.clamp_min(1e-30))
    if ref.v_spread is not None:  # large scores: the QK^T accumulator's share (ROW_QK_COVERED)
        excess = (ref.score_magnitude - ROW_QK_COVERED).clamp_min(0.0)
        row_scale = row_scale + (LSE_QK_REL / thresholds(ref.p16)[1]) * excess * ref.v_spread
    row_ratio = row_err / row_scale
    worst = int(row_ratio.argmax())

    ref_bh = ref.out.transpose(1, 2).flatten(2)  # (batch, heads, rows * head_dim)
    out_bh = torch.nan_to_num(out32).transpose(1, 2).flatten(2)
    energy = (ref_bh * ref_bh).sum(-1)
    slope = (out_bh * ref_bh).sum(-1) / energy.clamp_min(1e-30)
    # A head whose reference is all zero (V = 0) has no scale to check.
    slope_err = torch.where(energy > 0, (slope - 1).abs(), torch.zeros_like(slope))
    worst_head = int(slope_err.argmax())

    lse_err = torch.nan_to_num((lse32 - ref.lse).abs(), nan=0.0, posinf=0.0) * seeing
    lse_bound = LSE_ABS_MAX + LSE_QK_REL * ref.score_magnitude
    if ref.shift_magnitude is not None:
        lse_bound = lse_bound + LSE_SHIFT_REL * ref.shift_magnitude
    lse_ratio = lse_err / lse_bound
    worst_lse = int(lse_ratio.argmax())
    shape = tuple(row_ratio.shape)
    return AccuracyMetrics(
        rel_rms=rel_rms,
        worst_row=float(row_ratio.flatten()[worst]),
        worst_row_at=_where(worst, shape, "batch head row", ref.rows),
        head_slope_error=float(slope_err.flatten()[worst_head]),
        head_slope_at=_where(worst_head, tuple(slope_err.shape), "batch head"),
        head_slope_max=head_slope_bound(int(seeing.sum())),
        lse_max_err=float(lse_err.max()),
        lse_excess=float(lse_ratio.flatten()[worst_lse]),
        lse_excess_at=_where(worst_lse, shape, "batch head row", ref.rows),
        nonfinite=nonfinite,
        written_share=written_share,
        empty_row_errors=empty_errors,
        empty_row_at=empty_at,
        p16=ref.p16,
    )


def validate(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
             lse: torch.Tensor, rows: torch.Tensor | None = None, *, causal: bool = False,
             softmax_scale: float | None = None, k_smoothing: str = "off",
             qk_rotation: str = "none", v_unquantized: bool = False,
             qk_int8: bool = False, kv_scales: str = "block") -> AccuracyMetrics:
    """A kernel's (out, lse) for the original q, k, v against the reference on the gate's own
    quantization of them (prepare's output is checked apart: variants/prepare_check.py), with
    the transforms the kernel's config applies (K smoothing by the gate's own mean) and V
    unquantized for P.V in 16 bits, q and k in int8 for an integer QK^T, k's and v's scales
    per head with kv_scales="head"."""
    k_mean = reference_key_mean(k)[0] if k_smoothing == "mean" else None
    ref_inputs = quantize_reference(q, k, v, softmax_scale, k_mean=k_mean,
                                    rotate=qk_rotation == "hadamard", v_unquantized=v_unquantized,
                                    qk_int8=qk_int8, kv_scales=kv_scales)
    return accuracy(out, lse, reference_attention(ref_inputs, rows, causal=causal))


def end_to_end_error(
    out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: float | None = None,
    *,
    causal: bool = False,
) -> float:
    """Relative RMS of a kernel's output against fp32 attention on the original inputs (FP8
    quantization included): the accuracy budget's measure (tuner/budget.py), not the gate's,
    since it measures the format, not the kernel. Chunked per head like the reference; rows that
    see no key count with their reference output 0."""
    group = _group(q, k, v)
    batch, s, heads, head_dim = q.shape
    s_kv = k.shape[1]
    scale = head_dim**-0.5 if softmax_scale is None else softmax_scale
    num = den = 0.0
    rows = _chunk_rows(s_kv, 1 << 29)
    for b in range(batch):
        for h in range(heads):
            qh = q[b, :, h].float()
            kh, vh = (x[b, :, h // group].float() for x in (k, v))
            for r0 in range(0, s, rows):
                scores = (qh[r0 : r0 + rows] * scale) @ kh.t()
                if causal:
                    index = torch.arange(r0, min(r0 + rows, s), device=q.device)
                    scores.masked_fill_(causal_masked(index, s, s_kv), float("-inf"))
                # A fully masked row's softmax is NaN: its reference output is 0.
                ref = torch.softmax(scores, dim=-1).nan_to_num_(0.0) @ vh
                num += float(((out[b, r0 : r0 + rows, h].float() - ref) ** 2).sum())
                den += float((ref**2).sum())
    return math.sqrt(num / max(den, 1e-30))
