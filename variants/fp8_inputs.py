"""Fp8Inputs: the prepared inputs a kernel reads (e4m3 codes, the packed block scales, V's layout
and key order, the exact transforms prepare applied), and the helpers that lay codes out.

q, k and v are held in the layouts the kernels load (variants/prepare.py writes them); the
methods describe what a kernel sees, for the reference, the gate and the tests: `dequantized`
gives the fp32 values of the transformed inputs (k - m, q and k rotated, where prepare did so:
variants/transforms.py), and `restore_lse` adds back the LSE shift of K smoothing.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from variants import block_scales, transforms
from variants.block_scales import BlockScales, PackedLayout
from variants.key_order import inverse_key_order, register_p_key_order

# Query rows per step of the lazily computed q . m: an fp32 copy of this many rows of q at a
# time (56 heads x 128 x 4 bytes x 4096 rows = 117 MB), not of all of them.
SHIFT_ROWS = 4096


@dataclass
class Fp8Inputs:
    """Quantized inputs in the layouts the kernels read."""

    # (batch, padded_len, heads, head_dim) float8_e4m3fn (int8 for an integer QK^T, qk_int8);
    # or, for a kernel that quantizes Q itself (q_in_kernel), the caller's bf16 (batch, seq_len,
    # heads, head_dim), contiguous.
    q: torch.Tensor
    k: torch.Tensor  # (batch, padded_len_kv, kv_heads, head_dim) float8_e4m3fn, or int8
    # v_feature_major: (batch, kv_heads, head_dim, padded_len_kv), keys permuted if
    # key_permuted; otherwise (batch, padded_len_kv, kv_heads, head_dim) like k, natural order;
    # or, for a kernel that reads V unquantized (v_unquantized), the caller's V in bf16 (batch,
    # seq_len_kv, kv_heads, head_dim), contiguous, its packed block scales neutral.
    v: torch.Tensor
    # The descales (variants/block_scales.py: q's per token and head, k's and v's per 64 keys of
    # a KV head) packed in the kernels' layout (block_scales.PackedLayout), the one buffer the
    # kernels read; `scales` views it. q_in_kernel: q's part is left unwritten (the kernel
    # computes q's scales itself and reads none of it).
    packed: torch.Tensor
    seq_len: int  # q's real length; rows at or past it are padding (zeros)
    key_permuted: bool
    softmax_scale: float
    v_feature_major: bool = True
    seq_len_kv: int | None = None  # k's and v's real length (None: seq_len); keys past: zeros
    # The padded length of q's tiles (None: q's own length, the codes are padded); set when q is
    # the caller's bf16, which the kernel reads unpadded.
    q_padded_len: int | None = None
    # K smoothing (k_smoothing="mean"): m, fp32 (batch, kv_heads, head_dim); k's codes are those
    # of k - m for every real key (padding stays zero). None: k as it came.
    k_mean: torch.Tensor | None = None
    # The caller's q . m per query row (head h with KV head h // group), fp32 (batch, heads,
    # seq_len), unscaled: what restore_lse adds back times softmax_scale. None without k_mean,
    # and for q_in_kernel (raw_lse_shift reads q when asked).
    q_dot_mean: torch.Tensor | None = None
    # q's and k's codes are those of q R and k R (qk_rotation="hadamard"): QK^T unchanged.
    qk_rotated: bool = False
    # Prepared for a caller that drops the LSE (prepare's want_lse=False): K smoothing's q . m
    # was not computed, so the smoothed LSE cannot be restored.
    lse_dropped: bool = False
    # K's and V's packed scales are one per (batch, KV head), every block of a head holding its
    # head's (block_scales.KV_SCALES "head"): what a kv_scales="head" kernel reads.
    kv_head_scales: bool = False

    def __post_init__(self) -> None:
        if self.seq_len_kv is None:
            self.seq_len_kv = self.seq_len

    @property
    def q_in_kernel(self) -> bool:
        """q is bf16 for a kernel that quantizes it (block_scales.quantize_rows' formula per
        row); its part of `packed` is left unwritten."""
        return self.q.dtype not in (torch.float8_e4m3fn, torch.int8)

    @property
    def qk_int8(self) -> bool:
        """q's and k's codes are int8 (block_scales: amax / 127 scales) for an integer QK^T."""
        return self.k.dtype == torch.int8

    @property
    def v_unquantized(self) -> bool:
        """v is bf16 for a 16-bit P.V kernel; its block scales are 1 (log2 0), so every formula
        that reads V's codes times their scales reads V itself."""
        return self.v.dtype != torch.float8_e4m3fn

    @property
    def scale_layout(self) -> PackedLayout:
        return PackedLayout(self.q.shape[0], self.q.shape[2], self.padded_len, self.k.shape[2],
                            self.padded_len_kv)

    @functools.cached_property
    def scales(self) -> BlockScales:
        """The descales as (batch, heads, seq_len) and (batch, kv_heads, blocks) views of
        `packed`, made on first use only (the launch needs the buffer alone, and every view
        costs host time on each call)."""
        scales = BlockScales.from_packed(self.packed, self.scale_layout, self.seq_len,
                                         self.seq_len_kv)
        if self.q_in_kernel:  # the kernel computes q's, by this formula
            scales.q = self.q_codes_and_descales()[1]
        return scales

    def q_codes_and_descales(self) -> tuple[torch.Tensor, torch.Tensor]:
        """q's e4m3 codes (batch, seq_len, heads, head_dim) and descales (batch, heads, seq_len)
        as the kernel reads them: the stored codes, or for q_in_kernel the block-scale formula
        the kernel applies (for the reference and the gate; the launch needs neither)."""
        if self.q_in_kernel:
            codes, descale = block_scales.quantize_rows(self.q)
            return codes, descale.permute(0, 2, 1)
        return self.q[:, :self.seq_len], self.scales.q

    def raw_lse_shift(self) -> torch.Tensor | None:
        """q . m per query row (batch, heads, seq_len), unscaled; None without K smoothing. For
        q_in_kernel (the quantization launch does not read q) it is computed here from the
        caller's q on each call, one read of q: only a caller that wants the LSE pays it, and
        a timed run on reused inputs pays it as every call does."""
        if self.k_mean is None:
            return None
        if self.lse_dropped:
            raise ValueError("these inputs were prepared with want_lse=False (K smoothing's "
                             "q . m not computed): prepare them with want_lse=True to read "
                             "the LSE")
        if self.q_dot_mean is None:
            return q_dot(self.q, self.k_mean)
        return self.q_dot_mean

    def lse_shift(self) -> torch.Tensor | None:
        """softmax_scale * q . m per query row: LSE of the caller's inputs minus that of the
        smoothed ones the kernel computes (variants/transforms.py). None without smoothing."""
        raw = self.raw_lse_shift()
        return None if raw is None else raw * self.softmax_scale

    def restore_lse(self, lse: torch.Tensor) -> torch.Tensor:
        """The kernel's LSE (batch, heads, seq_len) of the smoothed scores made that of the
        caller's, in place: + softmax_scale * q . m per row (a row that sees no key keeps
        -inf). Without smoothing nothing changes."""
        raw = self.raw_lse_shift()
        if raw is not None:
            lse.add_(raw, alpha=self.softmax_scale)
        return lse

    @property
    def group(self) -> int:
        """Query heads per KV head."""
        return self.q.shape[2] // self.k.shape[2]

    def v_codes(self, b: int, h: int) -> torch.Tensor:
        """V's fp8 codes (bf16 values where v_unquantized) of one (batch, KV head) as
        (head_dim, padded_len_kv), keys in natural order, whatever layout the kernel asked for
        (the reference and the metrics read V through it)."""
        if not self.v_feature_major:
            return self.v[b, :, h].t()
        return self.v[b, h][:, self.natural_key_slots()]

    @property
    def padded_len(self) -> int:
        return self.q.shape[1] if self.q_padded_len is None else self.q_padded_len

    @property
    def padded_len_kv(self) -> int:
        return self.k.shape[1]

    def padding(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The codes of q at rows >= seq_len and of k, v at keys >= seq_len_kv (fp32; zeros by
        contract, since a kernel that multiplies a masked P of 0 by a NaN code of V would still
        produce NaN). A bf16 V is unpadded: TMA fills the keys past it with zeros."""
        s, skv = self.seq_len, self.seq_len_kv
        v = self.v.float()
        v_pad = v[:, skv:] if not self.v_feature_major else \
            v[..., self.natural_key_slots()[skv:]]
        # A bf16 q is unpadded: the kernel reads no row past seq_len.
        return self.q[:, s:].float(), self.k[:, skv:].float(), v_pad

    def natural_key_slots(self) -> torch.Tensor:
        """The stored position of every key, in natural key order (feature-major V: the last
        axis of v indexed by this is in natural order)."""
        n = self.v.shape[-1]
        if self.key_permuted:
            return inverse_key_order_on(n, self.v.device)
        return torch.arange(n, device=self.v.device)

    def dequantized(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """fp32 q (batch, seq_len, heads, head_dim), k and v (batch, seq_len_kv, kv_heads,
        head_dim) exactly as the kernel sees them: the transformed inputs where prepare
        transformed them (k - m with k_mean, q R and k R with qk_rotated)."""
        s, skv = self.seq_len, self.seq_len_kv
        q_codes, q_descale = self.q_codes_and_descales()
        dq = q_descale[..., :s].permute(0, 2, 1)[..., None]  # (batch, seq_len, heads, 1)
        dk, dv = (self.scales.per_key(n)[:, :skv] for n in ("k", "v"))
        # In place after one fp32 copy each: at B=1 H=56 S=30272 a temporary is 0.9 GB.
        q = q_codes.float().mul_(dq)
        k = self.k[:, :skv].float().mul_(dk)
        if not self.v_feature_major:
            return q, k, self.v[:, :skv].float().mul_(dv)
        # The key gather on the 1-byte codes, then one fp32 copy.
        codes = self.v.view(torch.uint8)[..., self.natural_key_slots()[:skv]]
        v = codes.view(torch.float8_e4m3fn).float().permute(0, 3, 1, 2)
        return q, k, v.mul_(dv)


def q_dot(q: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """transforms.lse_shift(q, m, 1.0), the raw q . m (batch, heads, seq_len) in fp32, over
    SHIFT_ROWS query rows at a time (an fp32 copy of the whole q would be 0.9 GB at B=1 H=56
    S=30272)."""
    batch, seq_len, heads, _ = q.shape
    if seq_len <= SHIFT_ROWS:
        return transforms.lse_shift(q, m, 1.0)
    out = torch.empty((batch, heads, seq_len), dtype=torch.float32, device=q.device)
    for r0 in range(0, seq_len, SHIFT_ROWS):
        rows = slice(r0, r0 + SHIFT_ROWS)
        out[:, :, rows] = transforms.lse_shift(q[:, rows], m, 1.0)
    return out


def round_up(n: int, multiple: int) -> int:
    return (n + multiple - 1) // multiple * multiple


@functools.lru_cache(maxsize=64)
def key_order_on(length: int, device: torch.device) -> torch.Tensor:
    """The permutation index, built once per (length, device): a host-to-device copy inside a
    CUDA-graph capture would be illegal, so captured calls must find it cached."""
    return register_p_key_order(length).to(device)


@functools.lru_cache(maxsize=64)
def inverse_key_order_on(length: int, device: torch.device) -> torch.Tensor:
    return inverse_key_order(length).to(device)


def lay_out(natural: torch.Tensor, seq_len: int, *, feature_major: bool,
            permute_keys: bool) -> torch.Tensor:
    """Codes (batch, padded, heads, head_dim) with rows < seq_len written: zero the padding, then
    (feature_major) the transposing, key-permuting copy to (batch, heads, head_dim, padded)."""
    batch, padded, heads, head_dim = natural.shape
    if padded > seq_len:
        natural[:, seq_len:].view(torch.uint8).zero_()
    if not feature_major:
        return natural
    out = torch.empty((batch, heads, head_dim, padded), dtype=torch.float8_e4m3fn,
                      device=natural.device)
    codes = natural.view(torch.uint8).permute(0, 2, 3, 1)
    if permute_keys:
        codes = codes[..., key_order_on(padded, codes.device)]
    out.view(torch.uint8).copy_(codes)
    return out
