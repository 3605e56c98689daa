"""The mma_sync kernel's epilogue: O / l as bf16 straight from the accumulator registers (V's
scales are in P' already), LSE = ln 2 * (m - shift + log2 l), rows past seq_len not stored."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute

from variants.common.softmax import inverse_sum, lse_natural, quad_sum


class EpilogueMixin:
    """MmaSyncAttention's epilogue (it provides the knobs read here)."""

    @cute.jit
    def epilogue(self, softmax, frags, mO, mLSE, batch, head, m_block, row_base, seq_len, lane):
        bm, d = self.block_m, self.head_dim
        acc_O, thr_mma = frags.acc_O, frags.thr_mma
        row_max, row_sum = softmax.row_max, softmax.row_sum
        gO = cute.local_tile(mO[batch, None, head, None], (bm, d), (m_block, 0))
        tOgO = thr_mma.partition_C(gO)
        tOcO = thr_mma.partition_C(cute.make_identity_tensor((bm, d)))
        rO = cute.make_rmem_tensor_like(acc_O, cutlass.BFloat16)
        for mt_i in cutlass.range_constexpr(self.m_tiles):
            for r in cutlass.range_constexpr(2):
                st = mt_i * 2 + r
                total = quad_sum(row_sum[st])
                o_row = acc_O[(None, r), mt_i, None]
                scale = inverse_sum(total, self.causal)
                o_row.store(o_row.load() * scale)
                r_row = rO[(None, r), mt_i, None]
                r_row.store(o_row.load().to(cutlass.BFloat16))
                row = row_base + tOcO[(0, r), mt_i, 0][0]
                if row < seq_len:
                    if lane % 4 == 0:
                        mLSE[batch, head, row] = lse_natural(row_max[st], total, self.p_shift)
                    for n in cutlass.range_constexpr(d // 8):
                        cute.autovec_copy(rO[(None, r), mt_i, n], tOgO[(None, r), mt_i, n])
