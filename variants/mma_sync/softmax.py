"""The online softmax of the mma_sync kernel, with the block-scale fold, in the m16n8 C
fragment's layout: a thread holds rows g and g + 8 of each of its m16 tiles, keys 8n + 2t + e
of quad lane t, and a row's max is exact across the quad after two shuffles (its sum stays
lane-local until the epilogue).

Per strip, each 64-key block b of a row folds its scales into the exponent (variants/
block_scales.py): x' = s * q_coef * ks[b] + log2(sv[b]), P' = 2^(x' - m' + shift) rounded to
e4m3 (shift: config.p_shift_log2, 8 with pv_accum=fp32), and the row sum counts P' / sv[b]; V's
scales are then inside P', so the epilogue divides O by l alone. A strip narrower than 64 keys
lies inside one block. The formulas are common/softmax.py's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import cutlass
import cutlass.cute as cute

from variants.block_scales import KV_BLOCK
from variants.common.softmax import (
    block_exp2_argument,
    max_to_subtract,
    quad_max,
    rescale_factor,
)


@dataclass(frozen=True)
class Softmax:
    """Running max m and sum l of each of the thread's 2 * m_tiles rows, and Q's scale of each
    times softmax_scale * log2(e) (q_coef)."""

    row_max: Any
    row_sum: Any
    q_coef: Any
    m_tiles: int
    block_n: int
    causal: bool
    p_shift: float

    @cute.jit
    def online(self, acc_S, acc_O, strip, mScales, batch, kv_head):
        """Strip `strip` in place: S -> P' (the module docstring), m and l updated, O rescaled
        by 2^(m_old - m_new). K's and V's scales of the strip's blocks are read here."""
        bn = self.block_n
        q_coef, row_max, row_sum = self.q_coef, self.row_max, self.row_sum
        # A thread's values of a row are keys 8n + 2t + e (n < block_n / 8, e < 2): the
        # strip's b-th scale block holds n = span b .. span (b + 1) - 1 (a strip narrower
        # than a 64-key block lies inside one).
        keys_per_scale = min(bn, KV_BLOCK)
        nb = bn // keys_per_scale
        span = keys_per_scale // 8
        # 1 / sv is taken as 2^-log2(sv) where it is used (one ex2 a row and block), not
        # kept: the seed's spill-free configs have no register to spare on sm_120a.
        ks = cute.make_rmem_tensor((nb,), cutlass.Float32)
        lsv = cute.make_rmem_tensor((nb,), cutlass.Float32)
        for b in cutlass.range_constexpr(nb):
            block = strip * bn // KV_BLOCK + b
            ks[b] = mScales[1][batch, kv_head, block]
            lsv[b] = mScales[2][batch, kv_head, block]
        coef = cute.make_rmem_tensor((nb,), cutlass.Float32)
        for mt_i in cutlass.range_constexpr(self.m_tiles):
            for r in cutlass.range_constexpr(2):
                st = mt_i * 2 + r
                s_row = acc_S[(None, r), mt_i, None]
                tile_max = -cutlass.Float32.inf
                for b in cutlass.range_constexpr(nb):
                    coef[b] = q_coef[st] * ks[b]
                    raw_max = -cutlass.Float32.inf
                    for n in cutlass.range_constexpr(span * b, span * (b + 1)):
                        for e in cutlass.range_constexpr(2):
                            raw_max = cute.arch.fmax(raw_max, s_row[e, n])
                    # max commutes with the positive coef; a masked block stays -inf.
                    tile_max = cute.arch.fmax(tile_max, raw_max * coef[b] + lsv[b])
                tile_max = quad_max(tile_max)
                m_new = cute.arch.fmax(row_max[st], tile_max)
                m_use = max_to_subtract(m_new, self.causal)
                alpha = rescale_factor(row_max[st], m_use)
                # 2^shift * 2^(x' - m'): P' in [0, 2^shift] (256 with pv_accum=fp32).
                total = cutlass.Float32(0.0)
                for b in cutlass.range_constexpr(nb):
                    part = cutlass.Float32(0.0)
                    for n in cutlass.range_constexpr(span * b, span * (b + 1)):
                        for e in cutlass.range_constexpr(2):
                            p = cute.math.exp2(block_exp2_argument(
                                s_row[e, n], coef[b], lsv[b], m_use, self.p_shift),
                                fastmath=True)
                            s_row[e, n] = p
                            part = part + p
                    total = total + part * cute.math.exp2(-lsv[b], fastmath=True)
                row_sum[st] = row_sum[st] * alpha + total
                row_max[st] = m_new
                o_row = acc_O[(None, r), mt_i, None]
                o_row.store(o_row.load() * alpha)
