"""FP8 flash-attention forward on warp-level mma.sync (sm_89, sm_90, sm_120), in CuTe DSL.

Algorithm (the seed kernel of shared/docs/seed-blog-fp8-flash-attention-cute-dsl.txt). One CTA
owns `block_m` query rows of one (batch, head); its `warps` warps each own `rows_per_warp` rows
(one or two m16 MMA tiles, the m-tiles of a warp sit `warps * 16` rows apart). Q is loaded once
by cp.async; K and V are streamed in strips of `block_n` keys through a ring of `kv_stages`
shared-memory stages. Per strip:
  S = Q K^T     mma.sync m16n8k32 e4m3 -> f32, operands by ldmatrix from swizzled smem
  online softmax in the log2 domain: m (row max, exact across the quad by two shuffles), l (row
                sum, lane-local until the epilogue), O *= 2^(m_old - m_new)
  P = 2^(s*qk_scale*log2e - m + 8), i.e. exp scaled by 256, rounded to e4m3 (P in [0, 256])
  O += P V      P either through smem (C layout in, ldmatrix A layout out) or straight from the
                S registers into the A fragment, V's keys being stored by prepare in the matching
                order (register_p_key_order)
Epilogue: O * dv / l (l carries the 256), LSE = ln 2 * (m - 8 + log2 l), rows >= seq_len skipped.

pv_accum=fp16 (two-level P @ V, _pv_fp16): each strip's P V is summed by f16-accumulate MMAs into a
fresh f16 accumulator, then added into the fp32 O; P's scale 2^shift replaces the 256 (shift =
config.p_shift_log2: 2, 1, 0 for block_n 32, 64, 128) so that no strip can overflow fp16. Q K^T
cannot take the same path: a score sums head_dim products of codes up to 448 each, 448^2 * 128 =
2.6e7 in code units, 2^8.6 times fp16's 65504. Fitting it would take Q and K codes with
|q| * |k| <= 65504 / head_dim = 512 (about 22 each), i.e. quantizing into the bottom of e4m3's
range, where small components fall out of the normal range (2^-6) and lose their precision;
and a score, unlike P (in [0, 2^shift], summed over one strip), has no per-strip bound short of
that worst case (outlier channels do align). Its f16 result would also carry an absolute error
of 2^-11 |s| into the exponent. Q K^T therefore keeps FP32 accumulate (or mma=mxf8, full rate
with FP32 accumulate on sm_120).

Constraints (config.can_implement states them for the tuner): block_m = warps * rows_per_warp;
block_n a multiple of 32 (the k of the P V MMA) up to 128; head_dim a multiple of 32; whole rows
per cp.async pass; q, k (batch, padded, heads, head_dim) and v (batch, heads, head_dim, padded)
fp8 e4m3 with padded a multiple of lcm(block_m, block_n) and zero padding; softmax_scale > 0 (the
row max is taken before scaling). Batch, heads and sequence length are runtime values, so one
compiled kernel serves every problem of a head_dim. Keys >= seq_len are masked to -inf in the
last strip only.
"""

from __future__ import annotations

import math

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import cpasync, warp

from variants.block_scales import KV_BLOCK
from variants.common.abi import block_scale_views, output_views
from variants.common.masking import (
    causal_offset,
    first_masked_strip,
    key_hidden,
    strip_needs_mask,
    strips_needed,
)
from variants.common.softmax import LOG2_E, block_exp2_argument, lse_natural, rescale_factor
from variants.mma_sync.config import Config


def _register_p_slots(m_tiles: int, block_n: int) -> list[int]:
    """A-fragment slot (in 16-bit pairs) of each C-order pair of P, for register P.

    The C fragment holds, per m16 tile m and n8 tile nt, key pairs (2t, 2t+1) of rows g and g+8
    (row half r); the A fragment of m16n8k32 wants, per k-block, bytes e + 4r + 8h of keys
    4t + e + 16h. Putting the pair of n-tile nt at e = 2 * (nt % 2), h = (nt // 2) % 2 of
    k-block nt // 4 makes slot 4t + e of each 16-key group hold key 8 * (e // 2) + 2t + e % 2:
    prepare.register_p_key_order, the order V's keys are stored in.
    """
    slots = []
    for nt in range(block_n // 8):
        for m in range(m_tiles):
            for r in range(2):
                slots.append((nt % 2) + 2 * r + 4 * ((nt // 2) % 2) + 8 * m
                             + 8 * m_tiles * (nt // 4))
    return slots


class MmaSyncAttention:
    """One kernel class; every knob of `Config` is a compile-time constant of it."""

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

    # ----------------------------------------------------------------------------------------
    # host side
    # ----------------------------------------------------------------------------------------
    def _smem_layout(self, rows: int, row_elems: int, stages: int | None):
        """K-major fp8 tile of `rows` x `row_elems`, swizzled per the `swizzle` knob."""
        atom_cols = min(row_elems, 128)
        chunk_bytes = 16
        bits = min(int(math.log2(atom_cols // chunk_bytes)), 3)
        # bank_period: XOR source at bit 7 (128 B); chunk_elems: log2(16 fp8 a chunk) = 4.
        shift = int(math.log2(128 // chunk_bytes)) if self.bank_period else int(math.log2(16))
        atom = cute.make_composed_layout(
            cute.make_swizzle(bits, int(math.log2(chunk_bytes)), shift),
            0,
            cute.make_layout((8, atom_cols), stride=(atom_cols, 1)),
        )
        if stages is None:
            return cute.tile_to_shape(atom, (rows, row_elems), (0, 1))
        return cute.tile_to_shape(atom, (rows, row_elems, stages), (0, 1, 2))

    def _g2s_copy(self, row_elems: int):
        """cp.async, 16 bytes a thread, threads laid along whole rows."""
        atom = cute.make_copy_atom(
            cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL),
            cutlass.Float8E4M3FN,
            num_bits_per_copy=128,
        )
        per_row = row_elems // 16
        return cute.make_tiled_copy_tv(
            atom,
            cute.make_layout((self.threads // per_row, per_row), stride=(per_row, 1)),
            cute.make_layout((1, 16)),
        )

    def _tiled_mma(self):
        return cute.make_tiled_mma(
            self._mma_op(),
            (self.cfg.warps, 1, 1),
            permutation_mnk=(self.cfg.warps * 16, 16, 32),
        )

    def _ldsm(self):
        return cute.make_copy_atom(
            warp.LdMatrix8x16x8bOp(transpose=False, num_matrices=4), cutlass.Float8E4M3FN)

    def _p_load_partition(self, tiled_mma, tidx, sP):
        """ldmatrix (A layout) read of P: the thread's copy slice and its source partition."""
        s2r_P = cute.make_tiled_copy_A(self._ldsm(), tiled_mma).get_slice(tidx)
        return s2r_P, s2r_P.partition_S(sP)

    def _p_store_views(self, thr_mma, sP, sP_layout):
        """P store path: a function (mt_i, r, n) -> the 2-byte smem view of C-fragment key pair
        ((None, r), mt_i, n) of this thread.

        NOT thr_mma.partition_C(sP)[(None, r), mt_i, n]: CuTe DSL 4.8.1 slices that partition
        wrongly when the swizzle cannot be folded into per-thread strides, as under chunk_elems
        (XOR source at bit 8, so the row half r and the n8 tile both feed the XOR). The sliced
        view keeps only the low bits of the thread's offset and drops the swizzled part (the
        n8 tile, the row half, the swizzle): all pairs of a thread land on one address and
        ptxas keeps a single st.shared.b16. Here a pair's byte offset is the swizzled layout
        applied to its logical (row, key) coordinate, as the ldmatrix read path computes it.
        A pair stays adjacent: the swizzle moves 16-byte chunks and the pair's first key is
        even. tests/test_mma_sync_layouts.py checks both paths address by address.
        """
        tPcP = thr_mma.partition_C(cute.make_identity_tensor((self.block_m, self.block_n)))

        def view(mt_i, r, n):
            offset = cute.assume(cute.crd2idx(tPcP[(0, r), mt_i, n], sP_layout), divby=2)
            return cute.make_tensor(sP.iterator + offset, cute.make_layout(2))

        return view

    def _mma_op(self):
        if cutlass.const_expr(self.mxf8):
            return warp.MmaMXF8Op(cutlass.Float8E4M3FN, cutlass.Float32, cutlass.Float8E8M0FNU)
        return warp.MmaFP8Op(cutlass.Float8E4M3FN, cutlass.Float32, (16, 8, 32))

    def _tiled_mma_pv16(self):
        """P @ V with f16 accumulate (pv_accum=fp16): the same thread and value layout as
        _tiled_mma, so its A/B fragments are the ones partitioned there (the C fragment of an
        m16n8 f16 accumulator holds the same 4 elements a thread, as halves)."""
        return cute.make_tiled_mma(
            warp.MmaFP8Op(cutlass.Float8E4M3FN, cutlass.Float16, (16, 8, 32)),
            (self.cfg.warps, 1, 1),
            permutation_mnk=(self.cfg.warps * 16, 16, 32),
        )

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

    # ----------------------------------------------------------------------------------------
    # device side
    # ----------------------------------------------------------------------------------------
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
        bm, bn, stages = self.block_m, self.block_n, self.stages
        fp8 = cutlass.Float8E4M3FN
        tidx, _, _ = cute.arch.thread_idx()
        m_block, head, batch = cute.arch.block_idx()
        if cutlass.const_expr(self.causal):
            # The longest rows (the most strips) first: the short ones fill the grid's tail.
            m_block = m_blocks - 1 - m_block
        kv_head = head // group  # grouped-query attention: a view, no copy of K and V
        lane = cute.arch.lane_idx()

        # Block scales (variants/block_scales.py): Q's per row here, K's and V's per 64-key block
        # in each strip's softmax; V's are in P' already, so the epilogue divides by l alone.
        n_total = cute.ceil_div(seq_len_kv, bn)
        row_base = m_block * bm
        n_strips = strips_needed(row_base, bm, bn, n_total, offset, self.causal)
        first_masked = first_masked_strip(row_base, bn, offset)

        gQ = cute.local_tile(mQ[batch, None, head, None], (bm, d), (m_block, 0))
        gK = cute.local_tile(mK[batch, None, kv_head, None], (bn, d), (None, 0))
        gV = cute.local_tile(mV[batch, kv_head, None, None], (d, bn), (0, None))

        smem = cutlass.utils.SmemAllocator()
        storage = smem.allocate(SharedStorage)
        sQ = storage.q.get_tensor(sQ_layout)
        sK = storage.k.get_tensor(sK_layout)
        sV = storage.v.get_tensor(sV_layout)

        thr_qk = g2s_qk.get_slice(tidx)
        thr_v = g2s_v.get_slice(tidx)
        tQgQ = thr_qk.partition_S(gQ)
        tQsQ = thr_qk.partition_D(sQ)
        tKgK = thr_qk.partition_S(gK)
        tKsK = thr_qk.partition_D(sK)
        tVgV = thr_v.partition_S(gV)
        tVsV = thr_v.partition_D(sV)

        # ---- MMA partitions and register fragments ------------------------------------------
        thr_mma = tiled_mma.get_slice(tidx)
        tSrQ = thr_mma.make_fragment_A(thr_mma.partition_A(sQ))
        tSrK = thr_mma.make_fragment_B(thr_mma.partition_B(sK[None, None, 0]))
        tOrV = thr_mma.make_fragment_B(thr_mma.partition_B(sV[None, None, 0]))
        acc_S = cute.make_rmem_tensor(thr_mma.partition_shape_C((bm, bn)), cutlass.Float32)
        acc_O = cute.make_rmem_tensor(thr_mma.partition_shape_C((bm, d)), cutlass.Float32)
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
        if cutlass.const_expr(not self.register_p):
            sP = storage.p.get_tensor(sP_layout)
            p_dst = self._p_store_views(thr_mma, sP, sP_layout)
            s2r_P, tOsP = self._p_load_partition(tiled_mma, tidx, sP)
            tOrP_view = s2r_P.retile(tOrP)
        p_slots = _register_p_slots(self.m_tiles, bn)

        # Coordinates of every S element inside the (bm, bn) strip, for the ragged-key mask.
        tScS = thr_mma.partition_C(cute.make_identity_tensor((bm, bn)))
        # Q's scale of each of the thread's rows, times softmax_scale * log2(e).
        q_coef = cute.make_rmem_tensor((2 * self.m_tiles,), cutlass.Float32)
        for mt_i in cutlass.range_constexpr(self.m_tiles):
            for r in cutlass.range_constexpr(2):
                row = row_base + tScS[(0, r), mt_i, 0][0]
                q_coef[mt_i * 2 + r] = mScales[0][batch, head, row] * scale_log2

        row_max = cute.make_rmem_tensor((2 * self.m_tiles,), cutlass.Float32)
        row_sum = cute.make_rmem_tensor((2 * self.m_tiles,), cutlass.Float32)
        row_max.fill(-cutlass.Float32.inf)
        row_sum.fill(0.0)

        # ---- prologue: Q in its own cp.async group, then stages-1 strips ahead --------------
        cute.copy(g2s_qk, tQgQ, tQsQ)
        cute.arch.cp_async_commit_group()
        for s in cutlass.range_constexpr(stages - 1):
            if s < n_strips:
                cute.copy(g2s_qk, tKgK[None, None, None, s], tKsK[None, None, None, s])
                cute.copy(g2s_v, tVgV[None, None, None, s], tVsV[None, None, None, s])
            cute.arch.cp_async_commit_group()
        if cutlass.const_expr(self.q_in_registers):
            cute.arch.cp_async_wait_group(stages - 1)
            cute.arch.sync_threads()
            cute.copy(s2r_Q, tSsQ, tSrQ_view)

        ragged = seq_len_kv % bn != 0
        for strip in cutlass.range(n_strips, unroll=1):
            if cutlass.const_expr(stages == 1):
                cute.copy(g2s_qk, tKgK[None, None, None, strip], tKsK[None, None, None, 0])
                cute.copy(g2s_v, tVgV[None, None, None, strip], tVsV[None, None, None, 0])
                cute.arch.cp_async_commit_group()
                cute.arch.cp_async_wait_group(0)
                cute.arch.sync_threads()
                stage = 0
            else:
                # Strip `strip` landed; the barrier also proves every warp left strip - 1, so
                # its stage is free for strip + stages - 1.
                cute.arch.cp_async_wait_group(stages - 2)
                cute.arch.sync_threads()
                ahead = strip + stages - 1
                if ahead < n_strips:
                    cute.copy(g2s_qk, tKgK[None, None, None, ahead],
                              tKsK[None, None, None, ahead % stages])
                    cute.copy(g2s_v, tVgV[None, None, None, ahead],
                              tVsV[None, None, None, ahead % stages])
                cute.arch.cp_async_commit_group()
                stage = strip % stages

            # ---- S = Q K^T ----------------------------------------------------------------
            acc_S.fill(0.0)
            for kb in cutlass.range_constexpr(d // 32):
                if cutlass.const_expr(not self.q_in_registers):
                    cute.copy(s2r_Q, tSsQ[None, None, kb], tSrQ_view[None, None, kb])
                cute.copy(s2r_K, tSsK[None, None, kb, stage], tSrK_view[None, None, kb])
                self._mma(tiled_mma, acc_S, tSrQ[None, None, kb], tSrK[None, None, kb])

            if strip_needs_mask(strip, n_total, ragged, first_masked, self.causal):
                key_base = strip * bn
                for i in cutlass.range_constexpr(cute.size(acc_S)):
                    if key_hidden(key_base + tScS[i][1], row_base + tScS[i][0], seq_len_kv,
                                  offset, self.causal):
                        acc_S[i] = -cutlass.Float32.inf

            # ---- online softmax, log2 domain, block scales -------------------------------------
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
                    tile_max = cute.arch.fmax(
                        tile_max, cute.arch.shuffle_sync_bfly(tile_max, offset=1))
                    tile_max = cute.arch.fmax(
                        tile_max, cute.arch.shuffle_sync_bfly(tile_max, offset=2))
                    m_new = cute.arch.fmax(row_max[st], tile_max)
                    m_use = m_new
                    if cutlass.const_expr(self.causal):
                        # A row that has seen no key yet: subtract 0, not -inf (P and alpha 0,
                        # not NaN).
                        if m_new == -cutlass.Float32.inf:
                            m_use = cutlass.Float32(0.0)
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

            # ---- O += P V -------------------------------------------------------------------
            if cutlass.const_expr(self.register_p):
                tPrP.store(acc_S.load().to(fp8))
                src16 = cute.recast_tensor(tPrP, cutlass.Int16)
                dst16 = cute.recast_tensor(tOrP, cutlass.Int16)
                for i in cutlass.range_constexpr(cute.size(src16)):
                    dst16[p_slots[i]] = src16[i]
            else:
                tPrP.store(acc_S.load().to(fp8))
                # Key pairs (2t, 2t+1) stay adjacent under every swizzle: one 16-bit store each.
                for mt_i in cutlass.range_constexpr(self.m_tiles):
                    for r in cutlass.range_constexpr(2):
                        for n in cutlass.range_constexpr(bn // 8):
                            cute.autovec_copy(tPrP[(None, r), mt_i, n], p_dst(mt_i, r, n))
                # A warp reads back only the P rows it wrote: a warp barrier is enough.
                cute.arch.sync_warp()
            if cutlass.const_expr(self.pv_fp16):
                if cutlass.const_expr(not self.register_p):
                    cute.copy(s2r_P, tOsP, tOrP_view)
                self._pv_fp16(acc_O, tOrP, tOrV, tOrV_view, s2r_V, tOsV, stage)
            else:
                for kb in cutlass.range_constexpr(bn // 32):
                    if cutlass.const_expr(not self.register_p):
                        cute.copy(s2r_P, tOsP[None, None, kb], tOrP_view[None, None, kb])
                    cute.copy(s2r_V, tOsV[None, None, kb, stage], tOrV_view[None, None, kb])
                    self._mma(tiled_mma, acc_O, tOrP[None, None, kb], tOrV[None, None, kb])

            if cutlass.const_expr(stages == 1):
                cute.arch.sync_threads()

        # ---- epilogue -------------------------------------------------------------------------
        gO = cute.local_tile(mO[batch, None, head, None], (bm, d), (m_block, 0))
        tOgO = thr_mma.partition_C(gO)
        tOcO = thr_mma.partition_C(cute.make_identity_tensor((bm, d)))
        rO = cute.make_rmem_tensor_like(acc_O, cutlass.BFloat16)
        for mt_i in cutlass.range_constexpr(self.m_tiles):
            for r in cutlass.range_constexpr(2):
                st = mt_i * 2 + r
                total = row_sum[st]
                total = total + cute.arch.shuffle_sync_bfly(total, offset=1)
                total = total + cute.arch.shuffle_sync_bfly(total, offset=2)
                o_row = acc_O[(None, r), mt_i, None]
                scale = 1.0 / total  # V's scales are in P' already
                if cutlass.const_expr(self.causal):
                    if total == 0.0:  # a row that sees no key: output 0 (and LSE -inf)
                        scale = cutlass.Float32(0.0)
                o_row.store(o_row.load() * scale)
                r_row = rO[(None, r), mt_i, None]
                r_row.store(o_row.load().to(cutlass.BFloat16))
                row = row_base + tOcO[(0, r), mt_i, 0][0]
                if row < seq_len:
                    if lane % 4 == 0:
                        mLSE[batch, head, row] = lse_natural(row_max[st], total, self.p_shift)
                    for n in cutlass.range_constexpr(d // 8):
                        cute.autovec_copy(rO[(None, r), mt_i, n], tOgO[(None, r), mt_i, n])

    def _pv_fp16(self, acc_O, tOrP, tOrV, tOrV_view, s2r_V, tOsV, stage):
        """O += P V of one strip, two-level: the strip's sum over its block_n keys in a fresh
        f16 accumulator (f16-accumulate MMAs, full rate on GeForce Blackwell), then added into
        the fp32 O, which the softmax has already rescaled. The f16 accumulator covers 16 of
        the head_dim columns at a time (the two n8 tiles one ldmatrix.x4 of V fills: copy c of
        tOrV_view is n-tiles 2c and 2c+1 of tOrV), so it costs 4 registers per m16 tile instead
        of head_dim / 4; every V element is still loaded once per strip. p_shift_log2 keeps
        the strip sum finite in fp16 (config.py derives it).

        Error (first order, u = 2^-11 the fp16 unit roundoff): rounding the f16 accumulator at
        each of the block_n / 32 MMAs of a strip adds at most (block_n / 32) * u * sum_j P_j |V_j|,
        0.05% (block_n 32) to 0.2% (128) of the strip's sum of |P V|; should the tensor core
        round after every product (the PTX ISA does not say), block_n * u: 1.6% to 6.3% worst
        case, an RMS of about sqrt(block_n) * u (0.3% to 0.6%). Both are below the e4m3
        rounding of P itself (2^-4 relative per element) that the fp32 path shares. The strip
        sum is exact in fp32. The smaller P scale (max 2^shift instead of 256) makes keys
        weighing under 2^-(6 + shift) of the row max e4m3 subnormals: absolute error 2^-10 (and
        0 below 2^-10) instead of 2^-4 relative; against the row sum l >= 2^shift that adds at
        most n * 2^-10 / 2^shift of V's range for n such keys in a row (fp32 path: / 256).
        """
        tiled_mma = self._tiled_mma_pv16()
        thr_mma = tiled_mma.get_slice(cute.arch.thread_idx()[0])
        acc16 = cute.make_rmem_tensor(
            thr_mma.partition_shape_C((self.block_m, 16)), cutlass.Float16)
        for c in range(self.head_dim // 16):
            acc16.fill(0.0)
            for kb in range(self.block_n // 32):
                cute.copy(s2r_V, tOsV[None, c, kb, stage], tOrV_view[None, c, kb])
                # (V, 2): n-tiles 2c and 2c + 1 of this k-block.
                v_pair = cute.logical_divide(tOrV[None, None, kb], (None, 2))[None, (None, c)]
                cute.gemm(tiled_mma, acc16, tOrP[None, None, kb], v_pair, acc16)
            for j in range(2):
                o = acc_O[None, None, 2 * c + j]
                o.store(o.load() + acc16[None, None, j].load().to(cutlass.Float32))

    def _mma(self, tiled_mma, acc, a, b):
        if cutlass.const_expr(self.mxf8):
            # Unit UE8M0 scales (127 = 2^0): the block-scaled instruction computes plain A @ B.
            cute.gemm(tiled_mma, acc, [a, _unit_scales(a)], [b, _unit_scales(b)], acc)
        else:
            cute.gemm(tiled_mma, acc, a, b, acc)


def _unit_scales(operand):
    """One UE8M0 scale of 1.0 per MMA of `operand` (scale_vec::1X: one per 32-wide k-block)."""
    sf = cute.make_rmem_tensor(((1,),) + tuple(operand.shape[1:]), cutlass.Float8E8M0FNU)
    cute.recast_tensor(sf, cutlass.Uint8).fill(127)
    return sf
