"""Block scales (one pass over each input): the quantization formula, the packed
layout the kernels read them in, and a torch emulation of the arithmetic the kernels fold the
scales into. prepare quantizes by this formula (on a GPU variants/block_quantize_kernel.py
computes the same codes in one launch); docs/family-wgmma.md has the design.

Why these granularities: every scale must be decided by the block of input that is being cast,
so that one read of that block both measures and casts it (no amax pass over a whole head first),
and must fold into arithmetic the kernels already do per row or per strip:
  Q  per (token, head): amax over head_dim. It folds into the per-row factor of the softmax
     exponent (raw * c_row - m), so the inner loop does not grow.
  K  per (64 keys, KV head): a strip of block_n = 64 b keys has b of them. They fold into that
     factor per (row, 64-key block): c = sq_row * sk_block * softmax_scale * log2(e).
  V  per (64 keys, KV head), folded into the exponent: x' = raw * c + log2(sv_block), the row
     maximum taken over x'. P' = 2^(x' - m' + shift) is then P * sv, so the P @ V accumulator
     sums P' * V_codes. The row sum l sums P' / sv_block (per 64-key block, one multiply). Then
     O = acc / l and LSE = ln 2 * (m' - shift + log2 l).
     P' <= 2^shift still holds (e4m3's range is kept), and no maximum over the whole head is
     needed, which is what makes V one pass too.
A scale is amax / 448 (code = round_e4m3(x * 448 / amax)); with int8 Q and K codes (wgmma's
qk_dtype="int8") amax / 127 (code = round-half-even(x * 127 / amax), in [-127, 127]), the same
granularities, so the kernels fold them alike. An all-zero block gets amax 1e-12 instead of a
division by zero.

K's and V's scales may also be one per (batch, KV head) (kv_scales="head", FA3's convention, what
the FP8 entry point's per-head descales are): the kernels that read them fold K's into the row
factor and V's into the epilogue, no per-block arithmetic. Quantizing that way takes an amax
pass over the whole head first (prepare does it in torch), and one outlier key sets the scale of
all of them; the packed layout stays the same, every block of a head holding its head's value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# The format's constants, stated here: prepare quantizes with this module's formula.
E4M3_MAX = 448.0
# descale = amax * fl32(1 / 448): one rounding of a product, the same in torch and the kernels.
DESCALE_PER_AMAX = 1.0 / E4M3_MAX
# int8 codes of Q and K (qk_dtype="int8"): symmetric, -128 unused.
INT8_MAX = 127.0
DESCALE_PER_AMAX_INT8 = 1.0 / INT8_MAX
# An all-zero row or block gets scale 1e-12 instead of a division by zero.
TINY_AMAX = 1e-12
# The codes' torch dtype of each QK^T operand type.
QK_CODE_DTYPES = {"e4m3": torch.float8_e4m3fn, "int8": torch.int8}

KV_BLOCK = 64  # keys per K and V scale: divides every block_n of the wgmma space
# K's and V's scale granularity: one per 64 keys of a KV head, or one per (batch, KV head).
KV_SCALES = ("block", "head")
# variants/common/softmax.py's two constants, restated: that module imports the CuTe DSL, which
# this torch emulation does without.
P_SHIFT_LOG2 = 8.0  # P scaled by 2^8 before it is rounded to e4m3, as the kernels do
LOG2_E = 1.4426950408889634


@dataclass
class BlockScales:
    """The descales of one set of inputs: q (batch, heads, seq_len) per token, k and v (batch,
    kv_heads, ceil(seq_len_kv / 64)) per 64-key block, fp32 (x ~= code * descale)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor

    def per_key(self, which: str) -> torch.Tensor:
        """k's or v's descale of every key, (batch, seq_len_kv, kv_heads, 1), for a length of
        `blocks * 64` keys or fewer (cut by the caller)."""
        d = getattr(self, which)
        return d.repeat_interleave(KV_BLOCK, dim=2).permute(0, 2, 1)[..., None]

    def packed(self, padded_len: int, padded_len_kv: int) -> torch.Tensor:
        """One fp32 buffer in the kernels' layout (PackedLayout; the one-pass GPU quantization
        writes it itself): q's (batch, heads, padded_len), then K's, log2 of V's, 1 / V's and
        V's, each (batch, kv_heads, ceil(padded_len_kv / 64)). Padding rows and blocks get
        finite neutral values (scale 1, log2 0): their codes are zero and the kernels mask
        them, but a NaN would still spread."""
        batch, heads, seq_len = self.q.shape
        _, kv_heads, blocks = self.k.shape
        layout = PackedLayout(batch, heads, padded_len, kv_heads, padded_len_kv)
        if layout.blocks < blocks or padded_len < seq_len:
            raise ValueError(f"padded lengths {padded_len}, {padded_len_kv} do not hold "
                             f"{seq_len} rows and {blocks} blocks of {KV_BLOCK} keys")
        out = torch.ones(layout.size, dtype=torch.float32, device=self.q.device)
        q, k, log2_v, inv_v, v = layout.views(out)
        q[..., :seq_len] = self.q
        k[..., :blocks] = self.k
        log2_v.zero_()
        log2_v[..., :blocks] = self.v.log2()
        inv_v[..., :blocks] = self.v.reciprocal()
        v[..., :blocks] = self.v
        return out

    @classmethod
    def from_packed(cls, buffer: torch.Tensor, layout: PackedLayout, seq_len: int,
                    seq_len_kv: int) -> BlockScales:
        """The descales as views into a packed buffer (no copy): q's rows below seq_len, K's
        and V's blocks that hold a key below seq_len_kv."""
        q, k, _, _, v = layout.views(buffer)
        blocks = -(-seq_len_kv // KV_BLOCK)
        return cls(q[..., :seq_len], k[..., :blocks], v[..., :blocks])


@dataclass(frozen=True)
class PackedLayout:
    """Where each part of the packed scales lies (the kernels' views:
    variants/common/abi.block_scale_views)."""

    batch: int
    heads: int
    padded_len: int
    kv_heads: int
    padded_len_kv: int

    @property
    def blocks(self) -> int:
        return -(-self.padded_len_kv // KV_BLOCK)

    @property
    def q_size(self) -> int:
        return self.batch * self.heads * self.padded_len

    @property
    def kv_size(self) -> int:
        return self.batch * self.kv_heads * self.blocks

    @property
    def size(self) -> int:
        return self.q_size + 4 * self.kv_size

    def views(self, buffer: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(q (batch, heads, padded_len), then k, log2 v, 1 / v, v (batch, kv_heads, blocks))."""
        if buffer.numel() != self.size:
            raise ValueError(f"packed scales of {buffer.numel()} values, this layout has "
                             f"{self.size}")
        q = buffer[:self.q_size].view(self.batch, self.heads, self.padded_len)
        kv = buffer[self.q_size:].view(4, self.batch, self.kv_heads, self.blocks)
        return (q, *kv.unbind(0))


def quantize(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, qk_dtype: str = "e4m3",
             kv_scales: str = "block"):
    """q, k, v -> (codes of q, k, v in their own layouts, BlockScales): the one-pass formula;
    q's and k's codes of `qk_dtype` (QK_CODE_DTYPES), v's e4m3; kv_scales="head": k's and v's
    scales one per (batch, KV head) (quantize_heads)."""
    if kv_scales not in KV_SCALES:
        raise ValueError(f"kv_scales={kv_scales!r}: one of {KV_SCALES}")
    per_kv = quantize_heads if kv_scales == "head" else quantize_key_blocks
    (q8, dq), (k8, dk) = quantize_rows(q, qk_dtype), per_kv(k, qk_dtype=qk_dtype)
    v8, dv = per_kv(v)
    return (q8, k8, v8), BlockScales(dq.permute(0, 2, 1).contiguous(),
                                     dk.permute(0, 2, 1).contiguous(),
                                     dv.permute(0, 2, 1).contiguous())


def _cast(x: torch.Tensor, amax: torch.Tensor,
          qk_dtype: str = "e4m3") -> tuple[torch.Tensor, torch.Tensor]:
    """codes = e4m3(x * 448 / amax) (amax broadcast to x), descale = amax / 448; int8: codes =
    round-half-even(x * 127 / amax) clamped to +-127, descale = amax * fl32(1 / 127)."""
    amax = amax.float().clamp_min(TINY_AMAX)
    if qk_dtype == "int8":
        scaled = x.float() * (amax.reciprocal() * INT8_MAX)
        codes = scaled.round_().clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
        return codes, amax * DESCALE_PER_AMAX_INT8
    scale = amax.reciprocal() * E4M3_MAX
    codes = (x.float() * scale).clamp_(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return codes, amax * DESCALE_PER_AMAX


def quantize_rows(q: torch.Tensor, qk_dtype: str = "e4m3") -> tuple[torch.Tensor, torch.Tensor]:
    """q (batch, seq, heads, dim) -> codes like q (of qk_dtype) and descales (batch, seq, heads),
    one per token and head."""
    amax = q.abs().amax(dim=-1, keepdim=True)
    codes, descale = _cast(q, amax, qk_dtype)
    return codes, descale[..., 0]


def quantize_key_blocks(x: torch.Tensor, block: int = KV_BLOCK, qk_dtype: str = "e4m3"):
    """k or v (batch, seq, kv_heads, dim) -> codes like x (of qk_dtype: k only) and descales
    (batch, ceil(seq / block), kv_heads), one per `block` keys of a KV head (the last block
    ragged)."""
    batch, seq, heads, dim = x.shape
    blocks = -(-seq // block)
    padded = torch.zeros(batch, blocks * block, heads, dim, dtype=x.dtype, device=x.device)
    padded[:, :seq] = x
    tiles = padded.view(batch, blocks, block, heads, dim)
    amax = tiles.abs().amax(dim=(2, 4))  # (batch, blocks, heads)
    codes, descale = _cast(tiles, amax[:, :, None, :, None], qk_dtype)
    return codes.view(batch, blocks * block, heads, dim)[:, :seq], descale[:, :, 0, :, 0]


def quantize_heads(x: torch.Tensor, qk_dtype: str = "e4m3"):
    """k or v (batch, seq, kv_heads, dim) -> codes like x and descales (batch, ceil(seq / 64),
    kv_heads) as quantize_key_blocks' are shaped, every block of a (batch, KV head) holding that
    head's one descale: amax over all its keys and features."""
    batch, seq, heads, _ = x.shape
    amax = x.abs().amax(dim=(1, 3), keepdim=True)  # (batch, 1, heads, 1)
    codes, descale = _cast(x, amax, qk_dtype)
    blocks = -(-seq // KV_BLOCK)
    return codes, descale[:, :, :, 0].expand(batch, blocks, heads).contiguous()


def dequantize(q8, dq, k8, dk, v8, dv, block: int = KV_BLOCK):
    """fp32 q, k, v as a kernel reading these codes and block descales sees them."""
    seq_kv = k8.shape[1]

    def per_key(d):  # (batch, blocks, heads) -> (batch, seq_kv, heads, 1)
        return d.repeat_interleave(block, dim=1)[:, :seq_kv, :, None]

    return (q8.float() * dq[..., None], k8.float() * per_key(dk), v8.float() * per_key(dv))


def folded_attention(q8, dq, k8, dk, v8, dv, *, softmax_scale: float, block_n: int = 128,
                     causal: bool = False, block: int = KV_BLOCK,
                     p_dtype: torch.dtype = torch.float8_e4m3fn):
    """The kernels' arithmetic with block scales, emulated in fp32 torch, strip by strip:
    scores from the codes, the folded exponent x' = raw * sq * sk * scale * log2(e) + log2(sv),
    an online softmax over x', P' rounded to p_dtype (e4m3; torch.bfloat16 for P.V in 16 bits,
    where v8 is the bf16 V itself and dv is 1) before P' @ V_codes, l summing P' / sv. Returns
    (out (batch, seq, heads, dim), lse (batch, heads, seq), natural log). Causal is aligned to
    the bottom right; a row that sees no key gets 0 and -inf. Grouped KV heads: query head h
    reads KV head h // (heads // kv_heads). q8 and k8 may be int8 codes (qk_dtype="int8"):
    their fp32 dot products are the s32 accumulator's, exactly (|S| <= 128 * 127^2 < 2^24)."""
    if block_n % block and block % block_n:
        raise ValueError(f"block_n={block_n} must be a multiple of the {block}-key scale block "
                         "or divide it")
    batch, seq, heads, dim = q8.shape
    seq_kv, kv_heads = k8.shape[1], k8.shape[2]
    group = heads // kv_heads
    q = q8.float().permute(0, 2, 1, 3)  # (batch, heads, seq, dim)
    k = k8.float().permute(0, 2, 1, 3).repeat_interleave(group, dim=1)
    v = v8.float().permute(0, 2, 1, 3).repeat_interleave(group, dim=1)

    def per_key(d):  # (batch, blocks, kv_heads) -> (batch, heads, seq_kv)
        return (d.repeat_interleave(block, dim=1)[:, :seq_kv].permute(0, 2, 1)
                .repeat_interleave(group, dim=1))

    sk, lsv, inv_sv = per_key(dk), per_key(dv).log2(), per_key(dv).reciprocal()
    c_row = dq.permute(0, 2, 1)[..., None] * (softmax_scale * LOG2_E)  # (batch, heads, seq, 1)
    rows = torch.arange(seq)[:, None]
    m = torch.full((batch, heads, seq, 1), -math.inf)
    total = torch.zeros(batch, heads, seq, 1)  # l: the sum of P' / sv
    acc = torch.zeros(batch, heads, seq, dim)
    for start in range(0, seq_kv, block_n):
        keys = slice(start, min(start + block_n, seq_kv))
        raw = q @ k[:, :, keys].transpose(-1, -2)
        x = raw * (c_row * sk[:, :, None, keys]) + lsv[:, :, None, keys]
        if causal:
            hidden = torch.arange(keys.start, keys.stop)[None, :] > rows + (seq_kv - seq)
            x = x.masked_fill(hidden, -math.inf)
        m_new = torch.maximum(m, x.amax(dim=-1, keepdim=True))
        m_use = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)  # no key yet
        alpha = torch.exp2(m - m_use)
        p = torch.exp2(x - m_use + P_SHIFT_LOG2)
        p8 = p.to(p_dtype).float()
        acc = acc * alpha + p8 @ v[:, :, keys]
        total = total * alpha + (p * inv_sv[:, :, None, keys]).sum(dim=-1, keepdim=True)
        m = m_new
    seen = total > 0
    safe = torch.where(seen, total, torch.ones_like(total))
    out = torch.where(seen, acc / safe, torch.zeros_like(acc))
    # LSE of the scores x = x' - log2(sv): m is the maximum of x', and l already counts P' / sv.
    lse = torch.where(seen, (m - P_SHIFT_LOG2 + torch.log2(safe)) * math.log(2.0),
                      torch.full_like(total, -math.inf))
    return out.permute(0, 2, 1, 3), lse[..., 0]
