"""FP8 flash-attention forward on warp-level mma.sync m16n8k32 (sm_89, sm_90, sm_120), in CuTe DSL.

One CTA owns `block_m` query rows of one (batch, head); its `warps` warps each own
`rows_per_warp` rows (one or two m16 MMA tiles, `warps * 16` rows apart). Q is loaded once by
cp.async; K and V stream in strips of `block_n` keys through a ring of `kv_stages` shared-memory
stages. kernel() sets up the tile, then each strip is one step of the main loop (_strip,
mainloop.py: S = Q K^T, mask, online softmax with the block-scale fold, P, O += P V), then the
epilogue (epilogue.py). Batch, heads and sequence length are runtime values, so one compiled
kernel serves every problem of a head_dim.

docs/family-mma_sync.md describes the design, the knobs (P from registers, pv_accum=fp16, mxf8)
and the measurements behind them; config.can_implement states the constraints.
"""

from __future__ import annotations

import math

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute

from variants.common.abi import block_scale_views, output_views
from variants.common.mask import AttentionMask
from variants.common.masking import causal_offset, first_masked_strip, strips_needed
from variants.common.softmax import LOG2_E
from variants.mma_sync.config import Config
from variants.mma_sync.epilogue import EpilogueMixin
from variants.mma_sync.layouts import LayoutsMixin, register_p_slots
from variants.mma_sync.mainloop import MainloopMixin, MmaFragments, StripCopies
from variants.mma_sync.softmax import Softmax


class MmaSyncAttention(LayoutsMixin, MainloopMixin, EpilogueMixin):
    """The host side (__call__) and the device entry (kernel); every knob of `Config` is a
    compile-time constant."""

    def __init__(self, cfg: Config, head_dim: int, causal: bool = False):
        self.cfg = cfg
        self.head_dim = head_dim
        self.causal = causal
        self.block_m = cfg.block_m
        self.block_n = cfg.block_n
        self.threads = cfg.warps * 32
        self.m_tiles = cfg.rows_per_warp // 16
        self.stages = cfg.kv_stages
        self.register_p = cfg.p_source == "registers"
        self.q_in_registers = cfg.q_in_registers
        self.bank_period = cfg.swizzle == "bank_period"
        self.mxf8 = cfg.mma == "mxf8"
        self.pv_fp16 = cfg.pv_accum == "fp16"
        # P = exp(s - m) * 2^shift before rounding to e4m3 (config.p_shift_log2 derives it).
        self.p_shift = float(cfg.p_shift_log2)

    @cute.jit
    def __call__(
        self,
        q_ptr: cute.Pointer,
        k_ptr: cute.Pointer,
        v_ptr: cute.Pointer,
        scales_ptr: cute.Pointer,
        o_ptr: cute.Pointer,
        lse_ptr: cute.Pointer,
        workspace_ptr: cute.Pointer,  # unused: this family needs no scratch
        batch: cutlass.Int32,
        heads: cutlass.Int32,
        seq_len: cutlass.Int32,
        padded_len: cutlass.Int32,
        softmax_scale: cutlass.Float32,
        kv_heads: cutlass.Int32,
        seq_len_kv: cutlass.Int32,
        padded_len_kv: cutlass.Int32,
        stream: cuda.CUstream,
    ):
        d = self.head_dim
        padded = cute.assume(padded_len, divby=math.lcm(self.block_m, self.block_n))
        padded_kv = cute.assume(padded_len_kv, divby=math.lcm(self.block_m, self.block_n))
        # (batch, padded, heads, head_dim), row-major; K at its own length and KV heads
        mQ = cute.make_tensor(
            q_ptr, cute.make_ordered_layout((batch, padded, heads, d), order=(3, 2, 1, 0)))
        mK = cute.make_tensor(
            k_ptr, cute.make_ordered_layout((batch, padded_kv, kv_heads, d), order=(3, 2, 1, 0)))
        # (batch, kv_heads, head_dim, padded_kv): keys contiguous
        mV = cute.make_tensor(
            v_ptr, cute.make_ordered_layout((batch, kv_heads, d, padded_kv), order=(3, 2, 1, 0)))
        mO, mLSE = output_views(o_ptr, lse_ptr, batch, heads, seq_len, d)
        mScales = block_scale_views(scales_ptr, batch, heads, padded, kv_heads, padded_kv)

        sQ_layout = self._smem_layout(self.block_m, d, None)
        sK_layout = self._smem_layout(self.block_n, d, self.stages)
        sV_layout = self._smem_layout(d, self.block_n, self.stages)
        sP_layout = self._smem_layout(self.block_m, self.block_n, None)
        p_elems = cute.cosize(sP_layout) if cutlass.const_expr(not self.register_p) else 1

        @cute.struct
        class SharedStorage:
            q: cute.struct.Align[
                cute.struct.MemRange[cutlass.Float8E4M3FN, cute.cosize(sQ_layout)], 1024]
            k: cute.struct.Align[
                cute.struct.MemRange[cutlass.Float8E4M3FN, cute.cosize(sK_layout)], 1024]
            v: cute.struct.Align[
                cute.struct.MemRange[cutlass.Float8E4M3FN, cute.cosize(sV_layout)], 1024]
            p: cute.struct.Align[cute.struct.MemRange[cutlass.Float8E4M3FN, p_elems], 1024]

        tiled_mma = self._tiled_mma()
        m_blocks = cute.ceil_div(seq_len, self.block_m)
        grid = (m_blocks, heads, batch)
        self.kernel(
            mQ, mK, mV, mScales, mO, mLSE, seq_len, softmax_scale * LOG2_E, seq_len_kv,
            heads // kv_heads, causal_offset(seq_len, seq_len_kv), m_blocks,
            sQ_layout, sK_layout, sV_layout, sP_layout,
            self._g2s_copy(d), self._g2s_copy(self.block_n), tiled_mma, SharedStorage,
        ).launch(grid=grid, block=[self.threads, 1, 1],
                 smem=SharedStorage.size_in_bytes(), stream=stream)

    @cute.kernel
    def kernel(
        self,
        mQ: cute.Tensor,
        mK: cute.Tensor,
        mV: cute.Tensor,
        mScales: tuple,
        mO: cute.Tensor,
        mLSE: cute.Tensor,
        seq_len: cutlass.Int32,
        scale_log2: cutlass.Float32,
        seq_len_kv: cutlass.Int32,
        group: cutlass.Int32,
        offset: cutlass.Int32,
        m_blocks: cutlass.Int32,
        sQ_layout: cute.ComposedLayout,
        sK_layout: cute.ComposedLayout,
        sV_layout: cute.ComposedLayout,
        sP_layout: cute.ComposedLayout,
        g2s_qk: cute.TiledCopy,
        g2s_v: cute.TiledCopy,
        tiled_mma: cute.TiledMma,
        SharedStorage: cutlass.Constexpr,
    ):
        d = self.head_dim
        bm, bn = self.block_m, self.block_n
        tidx, _, _ = cute.arch.thread_idx()
        m_block, head, batch = cute.arch.block_idx()
        if cutlass.const_expr(self.causal):
            # The longest rows (the most strips) first: the short ones fill the grid's tail.
            m_block = m_blocks - 1 - m_block
        kv_head = head // group  # grouped-query attention: a view, no copy of K and V
        lane = cute.arch.lane_idx()

        # The strips this tile visits, from strip 0; the mask's first diagonal strip.
        n_total = cute.ceil_div(seq_len_kv, bn)
        row_base = m_block * bm
        n_strips = strips_needed(row_base, bm, bn, n_total, offset, self.causal)
        first_masked = first_masked_strip(row_base, bn, offset)

        gQ = cute.local_tile(mQ[batch, None, head, None], (bm, d), (m_block, 0))
        gK = cute.local_tile(mK[batch, None, kv_head, None], (bn, d), (None, 0))
        gV = cute.local_tile(mV[batch, kv_head, None, None], (d, bn), (0, None))

        smem = cutlass.memory.SmemAllocator()
        storage = smem.allocate(SharedStorage)
        sQ = storage.q.get_tensor(sQ_layout)
        sK = storage.k.get_tensor(sK_layout)
        sV = storage.v.get_tensor(sV_layout)

        thr_qk = g2s_qk.get_slice(tidx)
        thr_v = g2s_v.get_slice(tidx)
        copies = StripCopies(g2s_qk, g2s_v, thr_qk.partition_S(gQ), thr_qk.partition_D(sQ),
                             thr_qk.partition_S(gK), thr_qk.partition_D(sK),
                             thr_v.partition_S(gV), thr_v.partition_D(sV))
        frags = self._fragments(tiled_mma, tidx, sQ, sK, sV, storage, sP_layout)

        # Q's scale of each of the thread's rows, times softmax_scale * log2(e).
        q_coef = cute.make_rmem_tensor((2 * self.m_tiles,), cutlass.Float32)
        for mt_i in cutlass.range_constexpr(self.m_tiles):
            for r in cutlass.range_constexpr(2):
                row = row_base + frags.tScS[(0, r), mt_i, 0][0]
                q_coef[mt_i * 2 + r] = mScales[0][batch, head, row] * scale_log2
        row_max = cute.make_rmem_tensor((2 * self.m_tiles,), cutlass.Float32)
        row_sum = cute.make_rmem_tensor((2 * self.m_tiles,), cutlass.Float32)
        row_max.fill(-cutlass.Float32.inf)
        row_sum.fill(0.0)
        softmax = Softmax(row_max, row_sum, q_coef, self.m_tiles, bn, self.causal, self.p_shift)

        self._load_prologue(copies, frags, n_strips)
        mask = AttentionMask(row_base, first_masked, n_total, seq_len_kv % bn != 0, seq_len_kv,
                             offset, frags.tScS, bn, self.causal)
        for strip in cutlass.range(n_strips, unroll=1):
            self._strip(strip, n_strips, copies, frags, mask, softmax, mScales, batch, kv_head)
        self.epilogue(softmax, frags, mO, mLSE, batch, head, m_block, row_base, seq_len, lane)

    def _fragments(self, tiled_mma, tidx, sQ, sK, sV, storage, sP_layout) -> MmaFragments:
        """The thread's MMA partitions and register fragments, and the ldmatrix views."""
        bm, bn = self.block_m, self.block_n
        fp8 = cutlass.Float8E4M3FN
        thr_mma = tiled_mma.get_slice(tidx)
        tSrQ = thr_mma.make_fragment_A(thr_mma.partition_A(sQ))
        tSrK = thr_mma.make_fragment_B(thr_mma.partition_B(sK[None, None, 0]))
        tOrV = thr_mma.make_fragment_B(thr_mma.partition_B(sV[None, None, 0]))
        acc_S = cute.make_rmem_tensor(thr_mma.partition_shape_C((bm, bn)), cutlass.Float32)
        acc_O = cute.make_rmem_tensor(thr_mma.partition_shape_C((bm, self.head_dim)),
                                      cutlass.Float32)
        acc_O.fill(0.0)
        tOrP = cute.make_rmem_tensor(thr_mma.partition_shape_A((bm, bn)), fp8)

        ldsm = self._ldsm()
        s2r_Q = cute.make_tiled_copy_A(ldsm, tiled_mma).get_slice(tidx)
        s2r_K = cute.make_tiled_copy_B(ldsm, tiled_mma).get_slice(tidx)
        s2r_V = cute.make_tiled_copy_B(ldsm, tiled_mma).get_slice(tidx)
        tSsQ = s2r_Q.partition_S(sQ)
        tSrQ_view = s2r_Q.retile(tSrQ)
        tSsK = s2r_K.partition_S(sK)
        tSrK_view = s2r_K.retile(tSrK)
        tOsV = s2r_V.partition_S(sV)
        tOrV_view = s2r_V.retile(tOrV)

        # P rounded to fp8 in accumulator (C) order; through smem, or moved into the A fragment.
        tPrP = cute.make_rmem_tensor_like(acc_S, fp8)
        p_dst = s2r_P = tOsP = tOrP_view = None
        if cutlass.const_expr(not self.register_p):
            sP = storage.p.get_tensor(sP_layout)
            p_dst = self._p_store_views(thr_mma, sP, sP_layout)
            s2r_P, tOsP = self._p_load_partition(tiled_mma, tidx, sP)
            tOrP_view = s2r_P.retile(tOrP)
        p_slots = register_p_slots(self.m_tiles, bn)
        # Coordinates of every S element inside the (bm, bn) strip, for the mask.
        tScS = thr_mma.partition_C(cute.make_identity_tensor((bm, bn)))
        return MmaFragments(tiled_mma, thr_mma, tSrQ, tSrK, tOrV, acc_S, acc_O, tOrP, s2r_Q,
                            s2r_K, s2r_V, tSsQ, tSrQ_view, tSsK, tSrK_view, tOsV, tOrV_view, tPrP,
                            p_dst, s2r_P, tOsP, tOrP_view, p_slots, tScS)
