"""FP8 flash-attention forward for Hopper (sm_90a): TMA + mbarrier pipelines + warpgroup MMA.

A CTA owns `block_m = 64 * consumer_wgs` query rows of a (batch, head) tile, or (persistent)
loops over tiles with the grid's static stride (scheduler.py). Warpgroup 0 produces: its warp 0
issues the TMA loads of Q and of K and V strips into rings of kv_stages (load, producer.py;
v_layout=kernel: its other warps transpose V, v_transpose.py). Every other warpgroup consumes
64 rows: QK^T, the mask (common/mask.py), the online softmax with the block-scale fold, PV
(e4m3, or with pv_dtype=bf16 a bf16 wgmma on the caller's V: pv16.py) and the epilogue (mma,
mainloop.py; softmax.py, epilogue.py); qk_dtype=int8 makes QK^T an s8 wgmma (qk8.py).
split_tail launches the whole waves' tiles and then, as a second program of this kernel, the
pieces of the last wave (split_tail.py).

docs/family-wgmma.md describes the design, the knobs and the measurements behind them;
config.can_implement states the constraints. Every knob of Config is a compile-time constant.
"""

from __future__ import annotations

import math

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import cpasync, warpgroup

from variants.common.abi import block_scale_views, kv_block_scales_view, output_views
from variants.common.masking import causal_offset
from variants.common.softmax import LOG2_E
from variants.wgmma.config import ROWS_PER_WG, WG_THREADS, Config, register_split
from variants.wgmma.epilogue import (
    EpilogueMixin,
    SplitTailWorkspace,
    workspace_views,
    zero_counters,
)
from variants.wgmma.mainloop import ConsumerMixin
from variants.wgmma.pack_gqa import packed_views
from variants.wgmma.pipelines import PipelinesMixin
from variants.wgmma.producer import ProducerMixin
from variants.wgmma.pv16 import p16_smem_layout, pv16_tiled_mma, v16_smem_layout, v16_view
from variants.wgmma.qk8 import qk_accumulator, qk_operand
from variants.wgmma.quantize_q import QuantizeQMixin
from variants.wgmma.scheduler import TileScheduler
from variants.wgmma.smem import SharedMemoryMixin
from variants.wgmma.split_tail import split_tiles
from variants.wgmma.v_transpose import VTransposeMixin


class WgmmaAttention(SharedMemoryMixin, PipelinesMixin, ProducerMixin, VTransposeMixin,
                     ConsumerMixin, QuantizeQMixin, EpilogueMixin):
    """The host side (__call__) and the device entry (kernel), which hands off to the
    producer (load, transpose_v) and the consumers (mma)."""

    def __init__(self, cfg: Config, head_dim: int, causal: bool = False, group: int = 1):
        """group: query heads packed into a tile's rows (pack_gqa: the problem's heads per KV
        head, a compile-time constant; 1: a tile's rows are tokens of one head)."""
        self.cfg = cfg
        self.head_dim = head_dim
        self.causal = causal
        self.wgs = cfg.consumer_wgs
        self.block_m = cfg.block_m
        self.block_n = cfg.block_n
        self.stages = cfg.kv_stages
        self.threads = cfg.threads
        self.register_p = cfg.register_p
        self.overlap = cfg.intra_wg_overlap
        self.pingpong = cfg.pingpong and cfg.consumer_wgs >= 2
        self.persistent = cfg.persistent
        self.v_in_kernel = cfg.v_in_kernel
        self.pv16 = cfg.v_unquantized
        self.qk_int8 = cfg.qk_int8
        self.fma_exp2 = cfg.fma_exp2
        self.longest_first = cfg.tile_order == "longest_first"
        self.q_in_kernel = cfg.q_in_kernel
        self.consumer_regs, self.producer_regs = register_split(cfg)
        self.scale_blocks = cfg.scale_blocks
        self.kv_head_scales = cfg.kv_head_scales
        self.split_tail = cfg.split_tail and cfg.persistent
        self.group = group
        self.head_swizzle = cfg.head_swizzle
        self.pieces = False  # which program kernel() is tracing (split_tail's pieces or tiles)

    @cute.jit
    def __call__(
        self,
        q_ptr: cute.Pointer,
        k_ptr: cute.Pointer,
        v_ptr: cute.Pointer,
        scales_ptr: cute.Pointer,
        o_ptr: cute.Pointer,
        lse_ptr: cute.Pointer,
        workspace_ptr: cute.Pointer,
        batch: cutlass.Int32,
        heads: cutlass.Int32,
        seq_len: cutlass.Int32,
        padded_len: cutlass.Int32,
        softmax_scale: cutlass.Float32,
        kv_heads: cutlass.Int32,
        seq_len_kv: cutlass.Int32,
        padded_len_kv: cutlass.Int32,
        max_ctas: cutlass.Int32,
        stream: cuda.CUstream,
    ):
        d = self.head_dim
        bm, bn = self.block_m, self.block_n
        fp8 = cutlass.Float8E4M3FN
        padded = cute.assume(padded_len, divby=math.lcm(bm, bn))
        padded_kv = cute.assume(padded_len_kv, divby=math.lcm(bm, bn))
        # TMA views, (seq, head_dim, heads, batch) and V (head_dim, seq, heads, batch); K and V
        # at their own length and KV head count. Q: the e4m3 codes at the padded length, or
        # (q_quant=kernel) the caller's bf16 q at its own length (TMA fills rows past it with
        # zeros).
        q_rows = seq_len if cutlass.const_expr(self.q_in_kernel) else padded
        q_layout = cute.make_ordered_layout((batch, q_rows, heads, d), order=(3, 2, 1, 0))
        mQ = cute.make_tensor(q_ptr, cute.select(q_layout, mode=[1, 3, 2, 0]))
        kv_layout = cute.make_ordered_layout((batch, padded_kv, kv_heads, d), order=(3, 2, 1, 0))
        kv_layout = cute.select(kv_layout, mode=[1, 3, 2, 0])
        mK = cute.make_tensor(k_ptr, kv_layout)
        if cutlass.const_expr(self.v_in_kernel):
            # V as the caller holds it, (batch, seq, heads, head_dim): the same view as K.
            mV = cute.make_tensor(v_ptr, kv_layout)
        elif cutlass.const_expr(self.pv16):
            # The caller's bf16 V at its real length, head_dim contiguous (pv16.py).
            mV = v16_view(v_ptr, batch, seq_len_kv, kv_heads, d)
        else:
            v_layout = cute.make_ordered_layout((batch, kv_heads, d, padded_kv),
                                                order=(3, 2, 1, 0))
            mV = cute.make_tensor(v_ptr, cute.select(v_layout, mode=[2, 3, 1, 0]))
        mO, mLSE = output_views(o_ptr, lse_ptr, batch, heads, seq_len, d)
        mScales = block_scale_views(scales_ptr, batch, heads, padded, kv_heads, padded_kv)
        mKVScales = kv_block_scales_view(scales_ptr, batch, heads, padded, kv_heads, padded_kv)
        mQScales = mScales[0]
        g = self.group
        q_tiler = (bm, d)
        rows, tile_heads = seq_len, heads
        if cutlass.const_expr(g > 1):
            # pack_gqa: a tile's rows are (group, tokens) of one KV head's query heads; Q, O,
            # LSE and Q's scales indexed by packed row (pack_gqa.py).
            mQ, mO, mLSE, mQScales = packed_views(mQ, mO, mLSE, mQScales, g, kv_heads)
            q_tiler = ((g, bm // g), d)
            rows, tile_heads = seq_len * g, kv_heads

        qk = qk_operand(self.qk_int8)
        sQ_layout = self._smem_layout(bm, d, None, qk)
        sK_layout = self._smem_layout(bn, d, self.stages, qk)
        sV_layout = self._smem_layout(d, bn, self.stages)
        sP_layout = self._smem_layout(bm, bn, None)
        if cutlass.const_expr(self.pv16):
            sV_layout, sP_layout = v16_smem_layout(d, bn, self.stages), p16_smem_layout(bm, bn)
        sQraw_layout = self._smem_layout(bm, d, None, cutlass.BFloat16)

        tiled_mma_qk = sm90_utils.make_trivial_tiled_mma(
            qk, qk, cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.K,
            qk_accumulator(self.qk_int8), (self.wgs, 1, 1), (ROWS_PER_WG, bn))
        if cutlass.const_expr(self.pv16):
            tiled_mma_pv = pv16_tiled_mma(self.wgs, d, self.register_p)
        else:
            tiled_mma_pv = sm90_utils.make_trivial_tiled_mma(
                fp8, fp8, cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.K,
                cutlass.Float32, (self.wgs, 1, 1), (ROWS_PER_WG, d),
                warpgroup.OperandSource.RMEM if self.register_p else warpgroup.OperandSource.SMEM)

        g2s = cpasync.CopyBulkTensorTileG2SOp()
        tma_k, tma_mK = cpasync.make_tiled_tma_atom(
            g2s, mK, cute.select(sK_layout, mode=[0, 1]), (bn, d))
        tma_q, tma_mQ = cpasync.make_tiled_tma_atom(
            g2s, mQ, sQraw_layout if cutlass.const_expr(self.q_in_kernel) else sQ_layout,
            q_tiler)
        if cutlass.const_expr(self.v_in_kernel):
            # Loaded like K into a staging ring of K's layout; the producer transposes it.
            tma_v, tma_mV = cpasync.make_tiled_tma_atom(
                g2s, mV, cute.select(sK_layout, mode=[0, 1]), (bn, d))
        else:
            tma_v, tma_mV = cpasync.make_tiled_tma_atom(
                g2s, mV, cute.select(sV_layout, mode=[0, 1]), (d, bn))

        SharedStorage = self._shared_storage(sQ_layout, sK_layout, sV_layout, sP_layout,
                                             sQraw_layout)
        self._check_smem_estimate(SharedStorage)

        m_blocks = cute.ceil_div(rows, bm)
        total_tiles = m_blocks * tile_heads * batch
        # split_tail: the whole tiles in this launch (the program of split_tail=False, its loop
        # bound the whole tiles), the last wave's pieces in a second one (kernel(pieces=True)):
        # two programs, so that the pieces' code leaves the whole tiles' main loop as ptxas
        # schedules it without them (docs/family-wgmma.md, "split_tail").
        tail = 0
        if cutlass.const_expr(self.split_tail):
            tail = split_tiles(total_tiles, max_ctas, cute.ceil_div(seq_len_kv, bn))
        whole = total_tiles - tail
        grid_x = total_tiles
        if cutlass.const_expr(self.persistent):
            grid_x = cutlass.max(cutlass.min(whole, max_ctas), 1)
        mWorkO, mWorkML, mCount = workspace_views(workspace_ptr, max_ctas, bm, d, self.wgs)
        args = (tma_q, tma_mQ, tma_k, tma_mK, tma_v, tma_mV, mQScales, mKVScales, mO, mLSE,
                mWorkO, mWorkML, mCount,
                rows, tile_heads, m_blocks, total_tiles, whole, softmax_scale * LOG2_E,
                seq_len_kv, heads // kv_heads, causal_offset(seq_len, seq_len_kv),
                sQ_layout, sK_layout, sV_layout, sP_layout, sQraw_layout, tiled_mma_qk,
                tiled_mma_pv, SharedStorage)
        self.kernel(*args, False).launch(
            grid=(grid_x, 1, 1), block=[self.threads, 1, 1],
            smem=SharedStorage.size_in_bytes(), min_blocks_per_mp=1, stream=stream)
        if cutlass.const_expr(self.split_tail):
            # Every SM takes a run of the tail's strips (a grid of one, which has none, where
            # the split does not pay).
            pieces_grid = max_ctas
            if tail == 0:
                pieces_grid = 1
            self.kernel(*args, True).launch(
                grid=(pieces_grid, 1, 1), block=[self.threads, 1, 1],
                smem=SharedStorage.size_in_bytes(), min_blocks_per_mp=1, stream=stream)

    @cute.kernel
    def kernel(
        self,
        tma_q: cute.CopyAtom,
        mQ: cute.Tensor,
        tma_k: cute.CopyAtom,
        mK: cute.Tensor,
        tma_v: cute.CopyAtom,
        mV: cute.Tensor,
        mQScales: cute.Tensor,
        mKVScales: cute.Tensor,
        mO: cute.Tensor,
        mLSE: cute.Tensor,
        mWorkO: cute.Tensor,
        mWorkML: cute.Tensor,
        mCount: cute.Tensor,
        seq_len: cutlass.Int32,
        heads: cutlass.Int32,
        m_blocks: cutlass.Int32,
        total_tiles: cutlass.Int32,
        tile_limit: cutlass.Int32,
        scale_log2: cutlass.Float32,
        seq_len_kv: cutlass.Int32,
        group: cutlass.Int32,
        offset: cutlass.Int32,
        sQ_layout: cute.ComposedLayout,
        sK_layout: cute.ComposedLayout,
        sV_layout: cute.ComposedLayout,
        sP_layout: cute.ComposedLayout,
        sQraw_layout: cute.ComposedLayout,
        tiled_mma_qk: cute.TiledMma,
        tiled_mma_pv: cute.TiledMma,
        SharedStorage: cutlass.Constexpr,
        pieces: cutlass.Constexpr,
    ):
        """pieces=False: the tiles below tile_limit (all of them, or with split_tail those of
        the whole waves); pieces=True: split_tail's pieces of the last wave's tiles. With
        pack_gqa seq_len counts packed rows (seq_len * group) and heads the KV heads."""
        # Read by the device methods at trace time: which of the two programs this is.
        self.pieces = pieces
        tidx, _, _ = cute.arch.thread_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg_idx = warp_idx // 4

        smem = cutlass.memory.SmemAllocator()
        storage = smem.allocate(SharedStorage)
        sQ = storage.q.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sK = storage.k.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sV = storage.v.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)

        if warp_idx == 0:
            cpasync.prefetch_descriptor(tma_q)
            cpasync.prefetch_descriptor(tma_k)
            cpasync.prefetch_descriptor(tma_v)

        pipes, scales, sQ_load, sV_load = self._make_pipelines(
            storage, sQ, sV, sK_layout, sQraw_layout, mQScales, mKVScales)
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()

        if cutlass.const_expr(self.split_tail and not pieces):
            if total_tiles > tile_limit:
                zero_counters(mCount, tidx, self.threads)
        scheduler = TileScheduler.create(self, m_blocks, heads, total_tiles, tile_limit,
                                         seq_len_kv, group, offset)
        if wg_idx == 0:
            cute.arch.setmaxregister_decrease(self.producer_regs)
            if warp_idx == 0:
                self.load(tma_q, mQ, tma_k, mK, tma_v, mV, sQ_load, sK, sV_load, pipes, scales,
                          scheduler)
            if cutlass.const_expr(self.v_in_kernel):
                if warp_idx > 0:
                    # Views with the swizzle in the layout, not in the pointer: the copy adds
                    # the swizzled byte offsets it computes to their plain base pointers.
                    self.transpose_v(storage.vraw.get_tensor(sK_layout),
                                     storage.v.get_tensor(sV_layout), pipes.vload, pipes.v,
                                     tidx - 32, scheduler)
        else:
            cute.arch.setmaxregister_increase(self.consumer_regs)
            sP = None
            if cutlass.const_expr(not self.register_p):
                sP = storage.p.get_tensor(sP_layout.outer, swizzle=sP_layout.inner)
            self.mma(tiled_mma_qk, tiled_mma_pv, sQ, sK, sV, sP, sQ_load, pipes, scales, mO,
                     mLSE, SplitTailWorkspace(mWorkO, mWorkML, mCount), seq_len, scale_log2,
                     tidx - WG_THREADS, wg_idx - 1, scheduler, seq_len_kv)
