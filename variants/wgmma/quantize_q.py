"""Q's row scales of a tile in the wgmma consumers: read from the slot the loader staged
(q_quant=prepare), or computed here while each consumer warpgroup quantizes its 64 rows of the
caller's bf16 Q tile into the e4m3 tile the QK^T wgmma reads (q_quant=kernel: prepare then
reads and writes only K and V). The formula is block_scales.quantize_rows', as
block_quantize_kernel computes it."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute

from variants.block_scales import DESCALE_PER_AMAX, E4M3_MAX, TINY_AMAX
from variants.wgmma.barriers import q_store_barrier
from variants.wgmma.config import WG_THREADS


class QuantizeQMixin:
    """WgmmaAttention's Q scale path (it provides the knobs read here)."""

    @cute.jit
    def _tile_q(self, q_state, sQraw, sQ, s_rows, scale_log2, pipes, sQScales, wg):
        """Q's scale of each of the thread's two rows, times softmax_scale * log2(e)."""
        q_coef = cute.make_rmem_tensor((2,), cutlass.Float32)
        if cutlass.const_expr(self.q_in_kernel):
            pipes.q.consumer_wait(q_state)
            self._quantize_q(sQraw, sQ, q_coef, s_rows, scale_log2, pipes.q, q_state, wg)
            q_state.advance()
        else:
            pipes.q_scales.consumer_wait(q_state)
            for r in cutlass.range_constexpr(2):
                q_coef[r] = sQScales[s_rows[r, 0][0]] * scale_log2
        return q_coef

    @cute.jit
    def _quantize_q(self, sQraw, sQ, q_coef, s_rows, scale_log2, pipe_q, q_state, wg):
        """q_quant=kernel: the warpgroup's 64 rows of the bf16 tile TMA staged (rows past
        seq_len zero) into sQ as e4m3 codes, one scale a row: q_coef[r] = descale *
        softmax_scale * log2(e). The staging tile is released as soon as its values are in
        registers, so the next tile's Q loads during this one.

        Each thread takes the two rows its softmax owns (16w + l/4 and + 8 of its warp) and a
        quarter of their features (quad lane t: features t * head_dim/4 ...), so the row's amax
        is reduced over the quad like the softmax's row max, and the scale lands in the thread
        that multiplies by it. 16-byte shared loads and stores, whole units of both swizzles.
        """
        cols = self.head_dim // 4  # features a thread takes of each row
        vec = 8  # bf16 a 16-byte load
        chunk = 16  # e4m3 a 16-byte store
        t = cute.arch.lane_idx() % 4
        values = cute.make_rmem_tensor(cute.make_layout((2, cols), stride=(cols, 1)),
                                       cutlass.Float32)
        for r in cutlass.range_constexpr(2):
            row = s_rows[r, 0][0]
            loads = cute.zipped_divide(values[r, None], (vec,))
            for c in cutlass.range_constexpr(cols // vec):
                src = cute.local_tile(sQraw[row, None], (vec,), (t * (cols // vec) + c,))
                loads[None, c].store(src.load().to(cutlass.Float32))
        # One barrier for two orders: every warp of the warpgroup has its values (so the staging
        # tile can be released to the next tile's TMA), and every wgmma that read the previous
        # tile's codes has completed in all four warps (each waited before its softmax) before
        # any overwrites them.
        cute.arch.barrier(barrier_id=q_store_barrier(wg, self.wgs),
                          number_of_threads=WG_THREADS)
        pipe_q.consumer_release(q_state)
        for r in cutlass.range_constexpr(2):
            m = cutlass.Float32(0.0)
            for j in cutlass.range_constexpr(cols):
                m = cute.arch.fmax(m, abs(values[r, j]), nan=True)
            m = cute.arch.fmax(m, cute.arch.shuffle_sync_bfly(m, offset=1), nan=True)
            m = cute.arch.fmax(m, cute.arch.shuffle_sync_bfly(m, offset=2), nan=True)
            amax = cute.arch.fmax(m, TINY_AMAX, nan=True)
            q_coef[r] = amax * DESCALE_PER_AMAX * scale_log2
            inv = (1.0 / amax) * E4M3_MAX  # fl(fl(1 / amax) * 448), as prepare's formula
            stores = cute.zipped_divide(values[r, None], (chunk,))
            for c in cutlass.range_constexpr(cols // chunk):
                dst = cute.local_tile(sQ[s_rows[r, 0][0], None], (chunk,),
                                      (t * (cols // chunk) + c,))
                # f32 -> e4m3 is cvt.rn.satfinite, as prepare's cast.
                dst.store((stores[None, c].load() * inv).to(cutlass.Float8E4M3FN))
        # Generic-proxy smem writes must be visible to the async proxy (wgmma) reads, in all
        # four warps of the warpgroup before any issues its first QK^T.
        cute.arch.fence_view_async_shared()
        cute.arch.barrier(barrier_id=q_store_barrier(wg, self.wgs),
                          number_of_threads=WG_THREADS)
