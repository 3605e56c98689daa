"""The online softmax of the wgmma consumers, with the block-scale fold.

Per strip, each 64-key block b of a row folds its scales into the exponent (variants/
block_scales.py): x' = s * q_coef * ks[b] + log2(sv[b]), P' = 2^(x' - m' + 8) rounded to e4m3
for the PV wgmma, and the row sum counts P' / sv[b]; V's scales are then inside P', so the
epilogue divides O by l alone. A thread holds two rows (16w + l/4 and + 8 of its warp), its
values of a row are keys 8j + 2t + e of quad lane t, and a row's max and sum are reduced over
the quad by two shuffles. fma_exp2 = k computes k of every 8 exponentials of a row on the FMA
pipe (ptx._exp2_polynomial) instead of MUFU ex2. The formulas are common/softmax.py's.

With kv_scales=head there is one K and one V descale per tile: K's is inside q_coef (the loader
folds it into Q's row scales), x = s * q_coef, P = 2^(x - m + 8), l sums P, and the epilogue
multiplies O by dv / l; no per-block fold.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import cutlass
import cutlass.cute as cute

from variants.common.softmax import (
    block_exp2_argument,
    exp2_argument,
    inverse_sum,
    max_to_subtract,
    quad_max,
    quad_sum,
    rescale_factor,
)
from variants.wgmma.config import FMA_EXP2_GROUP
from variants.wgmma.fragments import acc_mn_layout
from variants.wgmma.ptx import _exp2_polynomial


@dataclass(frozen=True)
class StripScales:
    """A strip's block scales in registers, one per 64-key block: K's, log2 of V's, 1 / V's."""

    k: Any
    log2_v: Any
    inv_v: Any

    @staticmethod
    def registers(scale_blocks: int) -> StripScales:
        return StripScales(*(cute.make_rmem_tensor((scale_blocks,), cutlass.Float32)
                             for _ in range(3)))

    @cute.jit
    def read(self, sKVScales, pipe_scales, state):
        """The strip's scales from the slot the loader filled beside its K stage. Call before
        releasing that K stage: the release lets the loader overwrite the slot (the warp sync
        orders every lane's read before lane 0's release)."""
        pipe_scales.consumer_wait(state)
        nb = cute.size(self.k)
        dst = (self.k, self.log2_v, self.inv_v)
        for i in cutlass.range_constexpr(3):
            for b in cutlass.range_constexpr(nb):
                dst[i][b] = sKVScales[i * nb + b, state.index]
        cute.arch.sync_warp()


@dataclass(frozen=True)
class Softmax:
    """Running max m and sum l of the thread's two rows, and Q's scale of each times
    softmax_scale * log2(e) (q_coef), for one tile."""

    row_max: Any
    row_sum: Any
    q_coef: Any
    block_n: int
    scale_blocks: int
    causal: bool
    fma_exp2: int
    # kv_scales=head: 1 / V's descale of the tile's KV head (None: block scales per strip).
    head_inv_v: Any = None

    @staticmethod
    def create(q_coef, block_n: int, scale_blocks: int, causal: bool, fma_exp2: int,
               head_inv_v=None) -> Softmax:
        row_max = cute.make_rmem_tensor((2,), cutlass.Float32)
        row_sum = cute.make_rmem_tensor((2,), cutlass.Float32)
        row_max.fill(-cutlass.Float32.inf)
        row_sum.fill(0.0)
        return Softmax(row_max, row_sum, q_coef, block_n, scale_blocks, causal, fma_exp2,
                       head_inv_v)

    @cute.jit
    def online(self, acc_S, scales: StripScales):
        """One strip in place: S -> P' (the module docstring), m and l updated.

        Returns alpha = 2^(m_old - m_new) per row; the caller rescales O with it (with intra-WG
        overlap only after the in-flight PV wgmma that still accumulates into O has finished).
        Block b is values 16b .. 16b + 15 of the row in register order (keys 64b .. 64b + 63).
        """
        row_max, row_sum, q_coef = self.row_max, self.row_sum, self.q_coef
        head = self.head_inv_v is not None
        # Per head the strip is one block and nothing is folded per block.
        nb = 1 if head else self.scale_blocks
        if cutlass.const_expr(not head):
            ks, lsv, inv_sv = scales.k, scales.log2_v, scales.inv_v
        per_block = self.block_n // nb // 4  # a thread's values of a row in one scale block
        s_mn = cute.make_tensor(acc_S.iterator, acc_mn_layout(acc_S.layout))
        alpha = cute.make_rmem_tensor((2,), cutlass.Float32)
        for r in cutlass.range_constexpr(2):
            blocks = cute.zipped_divide(s_mn[r, None], (per_block,))
            coef = q_coef[r]  # per head: K's descale is in it
            tile_max = -cutlass.Float32.inf
            for b in cutlass.range_constexpr(nb):
                raw_max = blocks[None, b].load().reduce(cute.ReductionOp.MAX,
                                                        -cutlass.Float32.inf, 0)
                # max commutes with the positive coef; a masked block stays -inf.
                if cutlass.const_expr(head):
                    tile_max = cute.arch.fmax(tile_max, raw_max * coef)
                else:
                    tile_max = cute.arch.fmax(tile_max, raw_max * (q_coef[r] * ks[b]) + lsv[b])
            tile_max = quad_max(tile_max)
            m_new = cute.arch.fmax(row_max[r], tile_max)
            m_use = max_to_subtract(m_new, self.causal)
            alpha[r] = rescale_factor(row_max[r], m_use)
            total = cutlass.Float32(0.0)
            for b in cutlass.range_constexpr(nb):
                if cutlass.const_expr(head):
                    x = exp2_argument(blocks[None, b].load(), coef, m_use)
                else:
                    x = block_exp2_argument(blocks[None, b].load(), q_coef[r] * ks[b], lsv[b],
                                            m_use)
                if cutlass.const_expr(self.fma_exp2 == 0):
                    p = cute.math.exp2(x, fastmath=True)
                    blocks[None, b].store(p)
                else:
                    # Some of the row's exponentials on the FMA pipe: the MUFU pipe (16 ex2 a
                    # clock per SM) has as much work as the FP8 tensor cores at head_dim 128,
                    # more at 64. Elementwise, in place, by the value's place in the row.
                    blocks[None, b].store(x)
                    for i in cutlass.range_constexpr(per_block):
                        if cutlass.const_expr((b * per_block + i) % FMA_EXP2_GROUP
                                              < self.fma_exp2):
                            blocks[i, b] = _exp2_polynomial(blocks[i, b])
                        else:
                            blocks[i, b] = cute.math.exp2(blocks[i, b], fastmath=True)
                    p = blocks[None, b].load()
                if cutlass.const_expr(head):
                    total = total + p.reduce(cute.ReductionOp.ADD, 0.0, 0)
                else:
                    total = total + p.reduce(cute.ReductionOp.ADD, 0.0, 0) * inv_sv[b]
            row_sum[r] = row_sum[r] * alpha[r] + total
            row_max[r] = m_new
        return alpha

    @cute.jit
    def rescale(self, acc_O, alpha):
        """O *= alpha, row by row."""
        o_mn = cute.make_tensor(acc_O.iterator, acc_mn_layout(acc_O.layout))
        for r in cutlass.range_constexpr(2):
            o_mn[r, None].store(o_mn[r, None].load() * alpha[r])

    def row_total(self, r):
        """Row r's sum l over the four threads of its quad."""
        return quad_sum(self.row_sum[r])

    @cute.jit
    def normalize(self, o_mn, r, total):
        """O's row r divided by its sum l (V's block scales are in P' already; V's head
        descale is multiplied here)."""
        scale = inverse_sum(total, self.causal)
        if cutlass.const_expr(self.head_inv_v is not None):
            scale = scale * (1.0 / self.head_inv_v)  # a reciprocal, as inverse_sum's
        o_mn[r, None].store(o_mn[r, None].load() * scale)
