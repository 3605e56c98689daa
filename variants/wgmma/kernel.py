"""FP8 flash-attention forward for Hopper (sm_90a): TMA + mbarrier pipeline + warpgroup MMA.

Algorithm. A CTA owns `block_m = 64 * consumer_wgs` query rows of one (batch, head) tile (or,
`persistent`, loops over tiles with a static stride of the grid). Warpgroup 0 is the producer:
it gives registers back (setmaxnreg) and one of its warps issues TMA loads of Q once per tile
and of K and V strips of `block_n` keys into two rings of `kv_stages` shared-memory stages,
each stage guarded by a full/empty mbarrier pair. Every other warpgroup is a consumer that owns
64 rows and, per strip:
  S = Q K^T        SS wgmma m64 n`block_n` k32 e4m3 -> f32 (Q, K K-major in smem)
  online softmax   log2 domain; row max/sum reduced over the 4 threads of a quad
  P = 2^(s*qk_log2 - m + 8) rounded to e4m3 (exp scaled by 256 so P uses e4m3's range)
  O += P V         V is K-major (keys contiguous, laid out so by prepare); P is the A operand
                   either from registers (RS wgmma) or from shared memory (SS wgmma)
Strips run from the last to the first, so the ragged strip (keys >= seq_len masked to -inf)
is the first one and the only one that pays for the mask.

P from registers. The f32 accumulator of a m64nN wgmma gives thread (warp w, lane l) rows
16w + l/4 (+8) and keys 8j + 2(l%4) + {0,1}; the e4m3 A fragment of a k32 wgmma wants keys
4(l%4) + {0..3} and 16 + 4(l%4) + {0..3} of the same rows from that thread. Both are 8 keys a
row per 32, so no shuffle is needed if V's keys are stored in the order
`prepare.register_p_key_order` (the one of mma.sync m16n8k32, whose A/C layouts are the same per
warp): A slot 4t + e of each 16 keys holds key 8(e // 2) + 2t + e % 2. The fp8 registers are
then the accumulator registers in another order (`_p_views`). With P in shared memory the
layout is logical, so V keeps its natural order.

intra_wg_overlap: the QK^T wgmma of strip j+1 is issued together with the PV wgmma of strip j,
so the softmax of strip j+1 runs while the tensor cores are busy (FA3's intra-warpgroup
pipelining). pingpong: consumer warpgroups take turns issuing their GEMMs through named
barriers, so one warpgroup's softmax overlaps the other's GEMMs (FA3's inter-warpgroup
pingpong).

fma_exp2 = k: k of every 8 exponentials of a softmax row are computed by a cubic on the FMA and
integer pipes (_exp2_polynomial) instead of MUFU ex2, which at 16 a clock per SM is about as
busy as the FP8 tensor cores; it pays at head_dim 64 (7% on the H200), not at 128, where the
softmax's issue slots and latency bind instead (RESULTS.md).

Block scales (variants/block_scales.py) reach the consumers through shared memory: the loader
warp reads each strip's K and V scales (3 per 64-key block) and each tile's Q row scales from
global memory into registers before it waits for the stage, stores them beside the stage it
fills and arrives on a full-only mbarrier per stage (pipe_scales, pipe_q_scales); the K stage's
and the Q tile's own empty barriers guard their reuse, as the consumers read them before they
release those. A consumer reads them with shared loads, so no global load is in flight in the
main loop: a named barrier waits for the loads issued before it, and the pingpong turn barrier
then waited an L2 round trip every strip (the kernel 12-18% slower on the H200, RESULTS.md).

Epilogue: O * dv / l stored as bf16 straight from registers (rows >= seq_len skipped), and
LSE = ln 2 * (m - 8 + log2 l).

split_tail: the persistent grid's last partial wave split along the keys (variants/wgmma/
split_tail.py says how): the whole tiles run in one launch, the last wave's pieces in a second
launch of a program of their own, whose epilogue leaves each piece's partial state in a
workspace and lets the warp that completes a tile merge the pieces and store it.

v_layout=kernel: V arrives as the caller holds it, (batch, seq, heads, head_dim) like K. The
loader warp TMA-loads each V strip, (block_n keys, head_dim), into a staging ring laid out like
K's; warps 1-3 of the producer warpgroup copy it into the V ring the PV wgmma reads, 16 keys x
32 features per warp step (one ldmatrix.x4.trans, 4 byte permutes, one conflict-free
stmatrix.x4), in the register-P key order when P comes from registers; then they fence the
generic-proxy stores for the async proxy and arrive on the ring's full barrier (a
PipelineAsync: 96 producer threads, every consumer thread releasing). Costs a second V ring of
shared memory, 8 consumer registers (232/32 split with two consumer warpgroups: 24 spill the
copy's state) and producer instructions that share issue slots with the consumers: 5-11% of
the kernel on the H200; prepare writes V's layout inside its cast, so little is saved there
(RESULTS.md).
tests/test_wgmma_v_transpose.py checks its addressing on the CPU. (When this option was added,
the v_layout=prepared kernel stayed byte for byte the one built before it.)

q_quant=kernel: Q arrives as the caller's bf16 (batch, seq, heads, head_dim), unpadded. The
loader TMA-loads each tile of it into a bf16 staging tile (rows past seq_len zero-filled); each
consumer warpgroup quantizes its 64 rows into the e4m3 Q tile at the tile's start, one scale a
row, and releases the staging tile at once, so the next tile's Q loads during this one
(_quantize_q). (When this option was added, the q_quant=prepare SASS stayed the one built before
it: the default's, compared line by line, one UMOV one slot apart.)

Constraints (config.can_implement states them for the tuner): sm_90a; head_dim 64 or 128;
block_n a multiple of 32 up to 256; q, k (batch, padded, heads, head_dim), v (batch, heads,
head_dim, padded) (v_layout=kernel: like k) fp8 e4m3, padded a multiple of lcm(block_m,
block_n), zero padding;
softmax_scale > 0. Batch, heads and sequence length are runtime values.
"""

from __future__ import annotations

import math

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.tensor_utils import LayoutEnum

from variants.block_scales import DESCALE_PER_AMAX, E4M3_MAX, KV_BLOCK, TINY_AMAX
from variants.common.abi import block_scale_views, kv_block_scales_view, output_views
from variants.common.masking import (
    causal_offset,
    first_masked_strip,
    key_hidden,
    strip_needs_mask,
    strips_needed,
)
from variants.common.softmax import LOG2_E, block_exp2_argument, lse_natural, rescale_factor
from variants.wgmma.barriers import p_store_barrier, q_store_barrier, sched_barrier
from variants.wgmma.config import (
    FMA_EXP2_GROUP,
    ROWS_PER_WG,
    WG_THREADS,
    Config,
    register_split,
    smem_bytes,
)
from variants.wgmma.ptx import _exp2_polynomial
from variants.wgmma.split_tail import (
    PIECES_PER_CTA,
    run_bounds,
    slot,
    split_tiles,
    tail_piece,
    unit_owner,
    work_limit,
    workspace_offsets,
)
from variants.wgmma.v_transpose import TRANSPOSE_WARPS, VTransposeMixin

_DEBUG = False


class WgmmaAttention(VTransposeMixin):
    """One kernel class; every knob of `Config` is a compile-time constant of it. The host side
    (__call__), the producer (load; transpose_v from VTransposeMixin) and the consumers
    (consume: main loop, softmax, epilogue)."""

    def __init__(self, cfg: Config, head_dim: int, causal: bool = False):
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
        self.fma_exp2 = cfg.fma_exp2
        self.longest_first = cfg.tile_order == "longest_first"
        self.q_in_kernel = cfg.q_in_kernel
        self.consumer_regs, self.producer_regs = register_split(cfg)
        self.scale_blocks = cfg.scale_blocks
        self.split_tail = cfg.split_tail and cfg.persistent
        self.pieces = False  # which program kernel() is tracing (split_tail's pieces or tiles)

    # ----------------------------------------------------------------------------------------
    # host side
    # ----------------------------------------------------------------------------------------
    @staticmethod
    def _smem_layout(rows: int, cols: int, stages: int | None, dtype=cutlass.Float8E4M3FN):
        """K-major (cols contiguous) tile with the widest wgmma swizzle `cols` allows (fp8; bf16
        for the staged Q of q_quant=kernel)."""
        atom = warpgroup.make_smem_layout_atom(
            sm90_utils.get_smem_layout_atom(LayoutEnum.ROW_MAJOR, dtype, cols), dtype)
        if stages is None:
            return cute.tile_to_shape(atom, (rows, cols), (0, 1))
        return cute.tile_to_shape(atom, (rows, cols, stages), (0, 1, 2))

    def _shared_storage(self, sQ_layout, sK_layout, sV_layout, sP_layout, sQraw_layout):
        """The CTA's shared memory as a cute.struct: barriers and the block scales' slots, then
        the tiles; v_layout=kernel adds the V staging ring and its barriers, q_quant=kernel the
        bf16 Q staging tile (config.smem_bytes counts the same fields). Built from a field dict
        because this module's annotations are strings (`from __future__ import annotations`),
        which cute.struct does not evaluate."""
        fp8 = cutlass.Float8E4M3FN
        stages = self.stages

        def buffer(elems):
            return cute.struct.Align[cute.struct.MemRange[fp8, elems], 1024]

        fields = {
            "mbar_q": cute.struct.MemRange[cutlass.Int64, 2],
            "mbar_k": cute.struct.MemRange[cutlass.Int64, 2 * stages],
            "mbar_v": cute.struct.MemRange[cutlass.Int64, 2 * stages],
        }
        if self.v_in_kernel:
            fields["mbar_vraw"] = cute.struct.MemRange[cutlass.Int64, 2 * stages]
        # Each strip's K/V block scales beside its stage, each tile's Q row scales (smem_bytes
        # counts them in the header below the first 1024-aligned buffer).
        fields["mbar_scales"] = cute.struct.MemRange[cutlass.Int64, 2 * stages]
        if not self.q_in_kernel:
            fields["mbar_q_scales"] = cute.struct.MemRange[cutlass.Int64, 2]
        fields["kv_scales"] = cute.struct.MemRange[cutlass.Float32, 3 * self.scale_blocks * stages]
        if not self.q_in_kernel:
            fields["q_scales"] = cute.struct.MemRange[cutlass.Float32, self.block_m]
        fields["q"] = buffer(cute.cosize(sQ_layout))
        fields["k"] = buffer(cute.cosize(sK_layout))
        fields["v"] = buffer(cute.cosize(sV_layout))
        if self.v_in_kernel:
            fields["vraw"] = buffer(cute.cosize(sK_layout))
        fields["p"] = buffer(1 if self.register_p else cute.cosize(sP_layout))
        if self.q_in_kernel:  # the caller's bf16 Q tile, as TMA loads it
            fields["qraw"] = cute.struct.Align[
                cute.struct.MemRange[cutlass.BFloat16, cute.cosize(sQraw_layout)], 1024]
        return cute.struct(type("SharedStorage", (), {"__annotations__": fields}))

    def _check_smem_estimate(self, storage_type) -> None:
        """At trace time: the direct launch path (variants/launch.py) and can_implement use
        config.smem_bytes, which must cover what this kernel allocates."""
        size, estimate = storage_type.size_in_bytes(), smem_bytes(self.cfg, self.head_dim)
        if size > estimate:
            raise AssertionError(f"shared storage of {size} bytes, config.smem_bytes says "
                                 f"{estimate}: count the new fields there")

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
        # at their own length and KV head count.
        # Q's TMA view, (seq, head_dim, heads, batch): the e4m3 codes at the padded length, or
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
        else:
            v_layout = cute.make_ordered_layout((batch, kv_heads, d, padded_kv),
                                                order=(3, 2, 1, 0))
            mV = cute.make_tensor(v_ptr, cute.select(v_layout, mode=[2, 3, 1, 0]))
        mO, mLSE = output_views(o_ptr, lse_ptr, batch, heads, seq_len, d)
        mScales = block_scale_views(scales_ptr, batch, heads, padded, kv_heads, padded_kv)
        mKVScales = kv_block_scales_view(scales_ptr, batch, heads, padded, kv_heads, padded_kv)

        sQ_layout = self._smem_layout(bm, d, None)
        sK_layout = self._smem_layout(bn, d, self.stages)
        sV_layout = self._smem_layout(d, bn, self.stages)
        sP_layout = self._smem_layout(bm, bn, None)
        sQraw_layout = self._smem_layout(bm, d, None, cutlass.BFloat16)

        tiled_mma_qk = sm90_utils.make_trivial_tiled_mma(
            fp8, fp8, warpgroup.OperandMajorMode.K, warpgroup.OperandMajorMode.K,
            cutlass.Float32, (self.wgs, 1, 1), (ROWS_PER_WG, bn))
        tiled_mma_pv = sm90_utils.make_trivial_tiled_mma(
            fp8, fp8, warpgroup.OperandMajorMode.K, warpgroup.OperandMajorMode.K,
            cutlass.Float32, (self.wgs, 1, 1), (ROWS_PER_WG, d),
            warpgroup.OperandSource.RMEM if self.register_p else warpgroup.OperandSource.SMEM)

        g2s = cpasync.CopyBulkTensorTileG2SOp()
        tma_k, tma_mK = cpasync.make_tiled_tma_atom(
            g2s, mK, cute.select(sK_layout, mode=[0, 1]), (bn, d))
        tma_q, tma_mQ = cpasync.make_tiled_tma_atom(
            g2s, mQ, sQraw_layout if cutlass.const_expr(self.q_in_kernel) else sQ_layout,
            (bm, d))
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

        m_blocks = cute.ceil_div(seq_len, bm)
        total_tiles = m_blocks * heads * batch
        # split_tail: the whole tiles in this launch (the program of split_tail=False, its loop
        # bound the whole tiles), the last wave's pieces in a second one (kernel(pieces=True)):
        # two programs, so that the pieces' code leaves the whole tiles' main loop as ptxas
        # schedules it without them (RESULTS.md, seventeenth session).
        tail = 0
        if cutlass.const_expr(self.split_tail):
            tail = split_tiles(total_tiles, max_ctas, cute.ceil_div(seq_len_kv, bn))
        whole = total_tiles - tail
        grid_x = total_tiles
        if cutlass.const_expr(self.persistent):
            grid_x = cutlass.max(cutlass.min(whole, max_ctas), 1)
        mWorkO, mWorkML, mCount = self._workspace_views(workspace_ptr, max_ctas)
        args = (tma_q, tma_mQ, tma_k, tma_mK, tma_v, tma_mV, mScales[0], mKVScales, mO, mLSE,
                mWorkO, mWorkML, mCount,
                seq_len, heads, m_blocks, total_tiles, whole, softmax_scale * LOG2_E, seq_len_kv,
                heads // kv_heads, causal_offset(seq_len, seq_len_kv),
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

    def _workspace_views(self, workspace_ptr, grid):
        """split_tail's scratch (split_tail.workspace_offsets lays it out): each slot's partial
        O (slots, block_m, head_dim), its rows' m and l (slots, 2, block_m), and the counters,
        one per (tail tile, consumer warp). Views of a null pointer when the config needs none
        (never read then)."""
        bm, d = self.block_m, self.head_dim
        slots = PIECES_PER_CTA * grid
        ml_at, counters_at = workspace_offsets(bm, d, grid)
        m_work_o = cute.make_tensor(
            workspace_ptr, cute.make_ordered_layout((slots, bm, d), order=(2, 1, 0)))
        m_work_ml = cute.make_tensor(
            workspace_ptr + ml_at, cute.make_ordered_layout((slots, 2, bm), order=(2, 1, 0)))
        counters = cute.recast_ptr(workspace_ptr + counters_at, dtype=cutlass.Int32)
        m_count = cute.make_tensor(counters, cute.make_layout(grid * 4 * self.wgs))
        return m_work_o, m_work_ml, m_count

    # ----------------------------------------------------------------------------------------
    # device side
    # ----------------------------------------------------------------------------------------
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
        the whole waves); pieces=True: split_tail's pieces of the last wave's tiles."""
        # Read by the device methods at trace time: which of the two programs this is.
        self.pieces = pieces
        d, bm, bn = self.head_dim, self.block_m, self.block_n
        tidx, _, _ = cute.arch.thread_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg_idx = warp_idx // 4

        smem = cutlass.utils.SmemAllocator()
        storage = smem.allocate(SharedStorage)
        sQ = storage.q.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sK = storage.k.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sV = storage.v.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)

        if warp_idx == 0:
            cpasync.prefetch_descriptor(tma_q)
            cpasync.prefetch_descriptor(tma_k)
            cpasync.prefetch_descriptor(tma_v)

        producer = pipeline.CooperativeGroup(pipeline.Agent.Thread, 1)
        # One arrive per consumer warp (lane 0 signals the empty barrier).
        consumers = pipeline.CooperativeGroup(pipeline.Agent.Thread, 4 * self.wgs)
        # q_quant=kernel: TMA fills the bf16 staging tile, which the consumers release as soon
        # as they hold its values, so the next tile's Q loads while this one runs.
        sQ_load = sQ
        q_bytes = bm * d
        if cutlass.const_expr(self.q_in_kernel):
            sQ_load = storage.qraw.get_tensor(sQraw_layout.outer, swizzle=sQraw_layout.inner)
            q_bytes = bm * d * 2
        pipe_q = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.mbar_q.data_ptr(), num_stages=1, producer_group=producer,
            consumer_group=consumers, tx_count=q_bytes, defer_sync=True)
        pipe_k = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.mbar_k.data_ptr(), num_stages=self.stages,
            producer_group=producer, consumer_group=consumers, tx_count=bn * d,
            defer_sync=True)
        if cutlass.const_expr(self.v_in_kernel):
            # TMA fills the staging ring (waited on by the transposing warps, one arrive each);
            # the transposing threads fill the V ring (all of them arrive, then the consumers
            # wait and release as they do for a TMA-filled ring, every consumer thread arriving).
            sV_load = storage.vraw.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
            pipe_vload = pipeline.PipelineTmaAsync.create(
                barrier_storage=storage.mbar_vraw.data_ptr(), num_stages=self.stages,
                producer_group=producer,
                consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, TRANSPOSE_WARPS),
                tx_count=bn * d, defer_sync=True)
            pipe_v = pipeline.PipelineAsync.create(
                barrier_storage=storage.mbar_v.data_ptr(), num_stages=self.stages,
                producer_group=pipeline.CooperativeGroup(
                    pipeline.Agent.Thread, 32 * TRANSPOSE_WARPS),
                consumer_group=pipeline.CooperativeGroup(
                    pipeline.Agent.Thread, WG_THREADS * self.wgs),
                defer_sync=True)
        else:
            pipe_v = pipeline.PipelineTmaAsync.create(
                barrier_storage=storage.mbar_v.data_ptr(), num_stages=self.stages,
                producer_group=producer, consumer_group=consumers, tx_count=bn * d,
                defer_sync=True)
            sV_load, pipe_vload = sV, pipe_v  # TMA fills the ring the wgmma reads
        # The scales' full barriers: the loader warp's 32 threads arrive after their stores;
        # the consumers never release these (the K stage's and Q tile's empty barriers do).
        loader = pipeline.CooperativeGroup(pipeline.Agent.Thread, 32)
        all_consumers = pipeline.CooperativeGroup(pipeline.Agent.Thread, WG_THREADS * self.wgs)
        pipe_scales = pipeline.PipelineAsync.create(
            barrier_storage=storage.mbar_scales.data_ptr(), num_stages=self.stages,
            producer_group=loader, consumer_group=all_consumers, defer_sync=True)
        sKVScales = storage.kv_scales.get_tensor(
            cute.make_layout((3 * self.scale_blocks, self.stages)))
        pipe_q_scales, sQScales = None, None
        if cutlass.const_expr(not self.q_in_kernel):
            pipe_q_scales = pipeline.PipelineAsync.create(
                barrier_storage=storage.mbar_q_scales.data_ptr(), num_stages=1,
                producer_group=loader, consumer_group=all_consumers, defer_sync=True)
            sQScales = storage.q_scales.get_tensor(cute.make_layout(self.block_m))
        scales = (mQScales, mKVScales, sQScales, sKVScales, pipe_q_scales, pipe_scales)
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()

        bid, _, _ = cute.arch.block_idx()
        grid, _, _ = cute.arch.grid_dim()
        n_blocks = cute.ceil_div(seq_len_kv, bn)
        # What _tile_strips and _work read.
        strips = (m_blocks, heads, n_blocks, group, offset, total_tiles // m_blocks, total_tiles)
        # This CTA's persistent loop walks items bid, bid + grid, ... below n_items: tiles, or
        # (pieces) its pieces of the last wave's tiles.
        n_items = total_tiles
        if cutlass.const_expr(self.pieces):
            n_items = work_limit(total_tiles, grid, bid, n_blocks)
        elif cutlass.const_expr(self.split_tail):
            n_items = tile_limit  # the whole waves' tiles

        if wg_idx == 0:
            cute.arch.setmaxregister_decrease(self.producer_regs)
            if warp_idx == 0:
                self.load(tma_q, mQ, tma_k, mK, tma_v, mV, sQ_load, sK, sV_load, pipe_q, pipe_k,
                          pipe_vload, scales, bid, grid, n_items, strips)
            if cutlass.const_expr(self.v_in_kernel):
                if warp_idx > 0:
                    # Views with the swizzle in the layout, not in the pointer: the copy adds
                    # the swizzled byte offsets it computes to their plain base pointers.
                    self.transpose_v(storage.vraw.get_tensor(sK_layout),
                                     storage.v.get_tensor(sV_layout), pipe_vload, pipe_v,
                                     tidx - 32, bid, grid, n_items, strips)
        else:
            cute.arch.setmaxregister_increase(self.consumer_regs)
            sP = None
            if cutlass.const_expr(not self.register_p):
                sP = storage.p.get_tensor(sP_layout.outer, swizzle=sP_layout.inner)
            self.consume(tiled_mma_qk, tiled_mma_pv, sQ, sK, sV, sP, pipe_q, pipe_k, pipe_v,
                         sQ_load, scales, mO, mLSE, (mWorkO, mWorkML, mCount), seq_len,
                         scale_log2, tidx - WG_THREADS, wg_idx - 1, bid, grid, n_items, strips,
                         seq_len_kv)

    @cute.jit
    def _tile_strips(self, tile: cutlass.Int32, strips):
        """(m_block, head, KV head, batch, strips to visit) of a tile, in the config's
        tile_order (config.TILE_ORDERS says what each is for)."""
        m_blocks, heads, n_blocks, group, offset, heads_batch, _ = strips
        # per_head: m fastest, the CTAs in flight share the K/V of one or two heads in L2.
        m_block = tile % m_blocks
        rest = tile // m_blocks
        if cutlass.const_expr(self.longest_first):
            # m slowest, from the last block down, (head, batch) fastest: the first tiles of
            # the grid are the longest of every head (causal), and the persistent grid's static
            # stride deals each CTA tiles of falling length.
            m_block = m_blocks - 1 - tile // heads_batch
            rest = tile % heads_batch
        head = rest % heads
        n_tile = strips_needed(m_block * self.block_m, self.block_m, self.block_n, n_blocks,
                               offset, self.causal)
        return m_block, head, head // group, rest // heads, n_tile

    @cute.jit
    def _work(self, item, grid, strips):
        """(m_block, head, KV head, batch, lo, hi, tail tile) of a persistent loop item: a tile,
        all of its strips [0, n) (tail tile -1), or in the pieces program one piece [lo, hi)
        of tail tile t (split_tail.tail_piece)."""
        if cutlass.const_expr(not self.pieces):
            m_block, head, kv_head, batch, n_tile = self._tile_strips(item, strips)
            return m_block, head, kv_head, batch, 0, n_tile, -1
        n_total, total_tiles = strips[2], strips[6]
        tail = split_tiles(total_tiles, grid, n_total)
        t, lo, hi = tail_piece(item, grid, tail, n_total)
        m_block, head, kv_head, batch, _ = self._tile_strips(total_tiles - tail + t, strips)
        return m_block, head, kv_head, batch, lo, hi, t

    # ---- producer ----------------------------------------------------------------------------
    @cute.jit
    def _fetch_strip_scales(self, mKVScales, batch, kv_head, strip, lane):
        """This lane's one block scale of a strip (lane 3 * scale_blocks and above: none): K's,
        log2 of V's, then 1 / V's, each for the strip's 64-key blocks in order. A global load,
        issued before the loader waits for the stage, so that the wait hides its latency."""
        nb = self.scale_blocks
        value = cutlass.Float32(1.0)
        if lane < 3 * nb:
            value = mKVScales[lane // nb, batch, kv_head,
                              strip * self.block_n // KV_BLOCK + lane % nb]
        return value

    @cute.jit
    def _stage_strip_scales(self, value, sKVScales, pipe_scales, state, lane):
        """The fetched scales into the stage's slot (the K stage just acquired: its consumers
        have read the slot's previous scales), then every loader thread arrives."""
        if lane < 3 * self.scale_blocks:
            sKVScales[lane, state.index] = value
        pipe_scales.producer_commit(state)

    @cute.jit
    def load(self, tma_q, mQ, tma_k, mK, tma_v, mV, sQ, sK, sV, pipe_q, pipe_k, pipe_v,
             scales, bid, grid, n_items, strips):
        mQScales, mKVScales, sQScales, sKVScales, pipe_q_scales, pipe_scales = scales
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        one = cute.make_layout(1)
        lane = cute.arch.lane_idx()
        q_rows_per_lane = self.block_m // 32
        q_values = cute.make_rmem_tensor((q_rows_per_lane,), cutlass.Float32)
        item = bid
        while item < n_items:
            m_block, head, kv_head, batch, lo, hi, _ = self._work(item, grid, strips)
            gK = cute.local_tile(mK[None, None, kv_head, batch], (self.block_n, self.head_dim),
                                 (None, 0))
            if cutlass.const_expr(self.v_in_kernel):
                gV = cute.local_tile(mV[None, None, kv_head, batch],
                                     (self.block_n, self.head_dim), (None, 0))
            else:
                gV = cute.local_tile(mV[None, None, kv_head, batch],
                                     (self.head_dim, self.block_n), (0, None))
            tKsK, tKgK = cpasync.tma_partition(
                tma_k, 0, one, cute.group_modes(sK, 0, 2), cute.group_modes(gK, 0, 2))
            tVsV, tVgV = cpasync.tma_partition(
                tma_v, 0, one, cute.group_modes(sV, 0, 2), cute.group_modes(gV, 0, 2))

            # Strips from the last (ragged) to the first of [lo, hi); with intra-WG overlap K
            # runs one strip ahead of V, in the order the consumers issue QK^T(j+1) beside PV(j).
            last = hi - 1
            n_blocks = hi - lo
            value = self._fetch_strip_scales(mKVScales, batch, kv_head, last, lane)
            pipe_k.producer_acquire(kv_state)
            cute.copy(tma_k, tKgK[None, last], tKsK[None, kv_state.index],
                      tma_bar_ptr=pipe_k.producer_get_barrier(kv_state))
            self._stage_strip_scales(value, sKVScales, pipe_scales, kv_state, lane)
            # Q: e4m3 codes into the tile the QK^T wgmma reads, or (q_quant=kernel) bf16 into
            # the staging tile the consumers quantize from.
            gQ = cute.local_tile(mQ[None, None, head, batch], (self.block_m, self.head_dim),
                                 (m_block, 0))
            tQsQ, tQgQ = cpasync.tma_partition(
                tma_q, 0, one, cute.group_modes(sQ, 0, 2), cute.group_modes(gQ, 0, 2))
            if cutlass.const_expr(not self.q_in_kernel):
                # Row r of the tile: lane r % 32's value r // 32.
                for j in cutlass.range_constexpr(q_rows_per_lane):
                    q_values[j] = mQScales[batch, head, m_block * self.block_m + 32 * j + lane]
            pipe_q.producer_acquire(q_state)
            cute.copy(tma_q, tQgQ, tQsQ, tma_bar_ptr=pipe_q.producer_get_barrier(q_state))
            if cutlass.const_expr(not self.q_in_kernel):
                # The Q tile's slot is free: its consumers read the scales before releasing Q.
                for j in cutlass.range_constexpr(q_rows_per_lane):
                    sQScales[32 * j + lane] = q_values[j]
                pipe_q_scales.producer_commit(q_state)
            q_state.advance()
            if cutlass.const_expr(not self.overlap):
                pipe_v.producer_acquire(kv_state)
                cute.copy(tma_v, tVgV[None, last], tVsV[None, kv_state.index],
                          tma_bar_ptr=pipe_v.producer_get_barrier(kv_state))
                kv_state.advance()
                for i in cutlass.range(n_blocks - 1, unroll=1):
                    n = last - 1 - i
                    value = self._fetch_strip_scales(mKVScales, batch, kv_head, n, lane)
                    pipe_k.producer_acquire(kv_state)
                    cute.copy(tma_k, tKgK[None, n], tKsK[None, kv_state.index],
                              tma_bar_ptr=pipe_k.producer_get_barrier(kv_state))
                    self._stage_strip_scales(value, sKVScales, pipe_scales, kv_state, lane)
                    pipe_v.producer_acquire(kv_state)
                    cute.copy(tma_v, tVgV[None, n], tVsV[None, kv_state.index],
                              tma_bar_ptr=pipe_v.producer_get_barrier(kv_state))
                    kv_state.advance()
            else:
                for i in cutlass.range(n_blocks - 1, unroll=1):
                    n = last - 1 - i
                    prev = kv_state.clone()
                    kv_state.advance()
                    value = self._fetch_strip_scales(mKVScales, batch, kv_head, n, lane)
                    pipe_k.producer_acquire(kv_state)
                    cute.copy(tma_k, tKgK[None, n], tKsK[None, kv_state.index],
                              tma_bar_ptr=pipe_k.producer_get_barrier(kv_state))
                    self._stage_strip_scales(value, sKVScales, pipe_scales, kv_state, lane)
                    pipe_v.producer_acquire(prev)
                    cute.copy(tma_v, tVgV[None, n + 1], tVsV[None, prev.index],
                              tma_bar_ptr=pipe_v.producer_get_barrier(prev))
                pipe_v.producer_acquire(kv_state)
                cute.copy(tma_v, tVgV[None, lo], tVsV[None, kv_state.index],
                          tma_bar_ptr=pipe_v.producer_get_barrier(kv_state))
                kv_state.advance()
            item += grid

    # ---- consumer ------------------------------------------------------------------------------
    def _sched_sync(self, wg):
        if cutlass.const_expr(self.pingpong):
            cute.arch.barrier(barrier_id=sched_barrier(wg), number_of_threads=2 * WG_THREADS)

    def _sched_arrive(self, wg):
        if cutlass.const_expr(self.pingpong):
            nxt = (wg + 1) % self.wgs
            cute.arch.barrier_arrive(barrier_id=sched_barrier(nxt),
                                     number_of_threads=2 * WG_THREADS)

    def _p_views(self, acc_S, tOrP):
        """acc_S (f32, C order) and tOrP (e4m3, A order) as (b0, b1, row half, k half, k-block).

        C register 4j + 2i + e holds (row half i, key 8j + 2t + e); A register 4*(2h + i) + b
        holds slot 16h + 4t + b, which in register_p_key_order is key 16h + 8(b//2) + 2t + b%2,
        i.e. C value j = 2h + b//2 (+ 4 per k-block), e = b % 2: swap modes b1 and i.
        """
        k_blocks = self.block_n // 32
        shape = (2, 2, 2, 2, k_blocks)
        c_view = cute.make_tensor(
            acc_S.iterator, cute.make_layout(shape, stride=(1, 4, 2, 8, 16)))
        a_view = cute.make_tensor(
            tOrP.iterator, cute.make_layout(shape, stride=(1, 2, 4, 8, 16)))
        return c_view, a_view

    @cute.jit
    def _gemm(self, tiled_mma, acc, tA, tB, stage, accumulate: cutlass.Constexpr):
        """acc (+)= A B over the k-blocks of one strip as one wgmma group, committed, not
        waited on; accumulate=False starts from zero (S = Q K^T), True adds (O += P V)."""
        warpgroup.fence()
        atom = cute.make_mma_atom(tiled_mma.op)
        atom.set(warpgroup.Field.ACCUMULATE, accumulate)
        for k in cutlass.range_constexpr(cute.size(tA.shape[2])):
            cute.gemm(atom, acc, tA[None, None, k], tB[None, None, k, stage], acc)
            atom.set(warpgroup.Field.ACCUMULATE, True)
        warpgroup.commit_group()

    def _qk(self, tiled_mma, acc, tSrQ, tSrK, stage):
        self._gemm(tiled_mma, acc, tSrQ, tSrK, stage, False)

    def _pv(self, tiled_mma, acc, tOrP, tOrV, stage):
        self._gemm(tiled_mma, acc, tOrP, tOrV, stage, True)

    @cute.jit
    def _softmax(self, acc_S, row_max, row_sum, q_coef, ks, lsv, inv_sv):
        """Online softmax of one strip in place, with block scales (variants/block_scales.py):
        S -> P' = 256 * 2^(x' - m'), x' = s * q_coef[row] * ks[block] + lsv[block] for each
        64-key block of the strip; the row sum counts P' * inv_sv[block] (= P' / sv).

        Returns alpha = 2^(m_old - m_new) per row; the caller rescales O with it (with intra-WG
        overlap only after the in-flight PV wgmma that still accumulates into O has finished).
        A thread's values of a row are 8j + 2t + e of its quad lane t: block b is values
        16b .. 16b + 15 of the row in register order (keys 64b .. 64b + 63).
        """
        nb = self.scale_blocks
        per_block = self.block_n // nb // 4  # a thread's values of a row in one scale block
        s_mn = cute.make_tensor(acc_S.iterator, _acc_mn_layout(acc_S.layout))
        alpha = cute.make_rmem_tensor((2,), cutlass.Float32)
        for r in cutlass.range_constexpr(2):
            blocks = cute.zipped_divide(s_mn[r, None], (per_block,))
            tile_max = -cutlass.Float32.inf
            for b in cutlass.range_constexpr(nb):
                raw_max = blocks[None, b].load().reduce(cute.ReductionOp.MAX,
                                                        -cutlass.Float32.inf, 0)
                # max commutes with the positive coef; a masked block stays -inf.
                tile_max = cute.arch.fmax(tile_max, raw_max * (q_coef[r] * ks[b]) + lsv[b])
            tile_max = cute.arch.fmax(tile_max, cute.arch.shuffle_sync_bfly(tile_max, offset=1))
            tile_max = cute.arch.fmax(tile_max, cute.arch.shuffle_sync_bfly(tile_max, offset=2))
            m_new = cute.arch.fmax(row_max[r], tile_max)
            m_use = m_new
            if cutlass.const_expr(self.causal):
                # A row that has seen no key yet (all -inf): subtract 0, not -inf, so that its
                # P and alpha are 0 instead of NaN.
                if m_new == -cutlass.Float32.inf:
                    m_use = cutlass.Float32(0.0)
            alpha[r] = rescale_factor(row_max[r], m_use)
            total = cutlass.Float32(0.0)
            for b in cutlass.range_constexpr(nb):
                x = block_exp2_argument(blocks[None, b].load(), q_coef[r] * ks[b], lsv[b], m_use)
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
                total = total + p.reduce(cute.ReductionOp.ADD, 0.0, 0) * inv_sv[b]
            row_sum[r] = row_sum[r] * alpha[r] + total
            row_max[r] = m_new
        return alpha

    def _scale_registers(self) -> tuple:
        """Registers for K's scale, log2 of V's and 1 / V's of each 64-key block of a strip."""
        return tuple(cute.make_rmem_tensor((self.scale_blocks,), cutlass.Float32)
                     for _ in range(3))

    @cute.jit
    def _read_strip_scales(self, dst, sKVScales, pipe_scales, state):
        """The strip's block scales from the slot the loader filled beside its K stage. Call
        before releasing that K stage: the release lets the loader overwrite the slot (the warp
        sync orders every lane's read before lane 0's release)."""
        pipe_scales.consumer_wait(state)
        nb = self.scale_blocks
        for i in cutlass.range_constexpr(3):
            for b in cutlass.range_constexpr(nb):
                dst[i][b] = sKVScales[i * nb + b, state.index]
        cute.arch.sync_warp()

    @cute.jit
    def _rescale(self, acc_O, alpha):
        o_mn = cute.make_tensor(acc_O.iterator, _acc_mn_layout(acc_O.layout))
        for r in cutlass.range_constexpr(2):
            o_mn[r, None].store(o_mn[r, None].load() * alpha[r])

    @cute.jit
    def _mask(self, acc_S, tScS, key_base, row_base, seq_len_kv, offset):
        """Scores of keys the row does not see (past seq_len_kv, or causal: above the
        diagonal) to -inf."""
        for i in cutlass.range_constexpr(cute.size(acc_S)):
            if key_hidden(key_base + tScS[i][1], row_base + tScS[i][0], seq_len_kv, offset,
                          self.causal):
                acc_S[i] = -cutlass.Float32.inf

    @cute.jit
    def _store_p(self, acc_S, tOrP, tPrP, tPsP, wg):
        fp8 = cutlass.Float8E4M3FN
        if cutlass.const_expr(self.register_p):
            c_view, a_view = self._p_views(acc_S, tOrP)
            a_view.store(c_view.load().to(fp8))
        else:
            tPrP.store(acc_S.load().to(fp8))
            cute.autovec_copy(tPrP, tPsP)
            # Generic-proxy smem writes must be visible to the async proxy (wgmma) reads.
            cute.arch.fence_view_async_shared()
            cute.arch.barrier(barrier_id=p_store_barrier(wg, self.wgs),
                              number_of_threads=WG_THREADS)

    @cute.jit
    def _quantize_q(self, sQraw, sQ, q_coef, s_rows, scale_log2, pipe_q, q_state, wg):
        """q_quant=kernel: the warpgroup's 64 rows of the bf16 tile TMA staged (rows past
        seq_len zero) into sQ as e4m3 codes, one scale a row (block_scales.quantize_rows'
        formula, as block_quantize_kernel computes it): q_coef[r] = descale * softmax_scale *
        log2(e). The staging tile is released as soon as its values are in registers.

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

    @cute.jit
    def consume(self, tiled_mma_qk, tiled_mma_pv, sQ, sK, sV, sP, pipe_q, pipe_k, pipe_v,
                sQraw, scales, mO, mLSE, work, seq_len, scale_log2, ctid, wg, bid, grid, n_items,
                strips, seq_len_kv):
        _, _, sQScales, sKVScales, pipe_q_scales, pipe_scales = scales
        d, bm, bn = self.head_dim, self.block_m, self.block_n
        fp8 = cutlass.Float8E4M3FN
        wg_slice = cute.make_layout(self.wgs, stride=WG_THREADS)
        thr_qk = tiled_mma_qk.get_slice(ctid)
        wg_qk = tiled_mma_qk.get_slice(wg_slice(wg))
        wg_pv = tiled_mma_pv.get_slice(wg_slice(wg))
        thr_pv = tiled_mma_pv.get_slice(ctid)
        tSrQ = wg_qk.make_fragment_A(wg_qk.partition_A(sQ))
        tSrK = wg_qk.make_fragment_B(wg_qk.partition_B(sK))
        tOrV = wg_pv.make_fragment_B(wg_pv.partition_B(sV))
        tPrP = None
        tPsP = None
        if cutlass.const_expr(self.register_p):
            tOrP = wg_pv.make_fragment_A(wg_pv.partition_shape_A((bm, bn)))
        else:
            tOrP = wg_pv.make_fragment_A(wg_pv.partition_A(sP))
            tPsP = thr_qk.partition_C(sP)
        tScS = thr_qk.partition_C(cute.make_identity_tensor((bm, bn)))
        s_rows = cute.make_tensor(tScS.iterator, _acc_mn_layout(tScS.layout))
        tOcO = thr_pv.partition_C(cute.make_identity_tensor((bm, d)))
        acc_O = cute.make_rmem_tensor(thr_pv.partition_shape_C((bm, d)), cutlass.Float32)
        if cutlass.const_expr(not self.register_p):
            tPrP = cute.make_rmem_tensor(thr_qk.partition_shape_C((bm, bn)), fp8)
        if cutlass.const_expr(_DEBUG):
            print("tSrQ", tSrQ.layout, "tSrK", tSrK.layout, "tOrV", tOrV.layout)
            print("tOrP", tOrP.layout, "acc_O", acc_O.layout, "tScS", tScS.layout)
            print("tv_A pv", tiled_mma_pv.tv_layout_A, "tv_C qk", tiled_mma_qk.tv_layout_C)

        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        if cutlass.const_expr(self.pingpong):
            if wg == 0:
                # The first consumer holds the first turn.
                cute.arch.barrier_arrive(barrier_id=sched_barrier(0),
                                         number_of_threads=2 * WG_THREADS)
        n_total, offset = strips[2], strips[4]
        ragged = seq_len_kv % bn != 0
        lane = cute.arch.lane_idx()
        item = bid
        while item < n_items:
            m_block, head, kv_head, batch, lo, hi, tail_tile = self._work(item, grid, strips)
            n_blocks = hi - lo
            row_base = m_block * bm
            first_masked = first_masked_strip(row_base, bn, offset)
            # Q's scale of each of the thread's two rows, times softmax_scale * log2(e).
            q_coef = cute.make_rmem_tensor((2,), cutlass.Float32)
            if cutlass.const_expr(self.q_in_kernel):
                pipe_q.consumer_wait(q_state)
                self._quantize_q(sQraw, sQ, q_coef, s_rows, scale_log2, pipe_q, q_state, wg)
                q_state.advance()
            else:
                pipe_q_scales.consumer_wait(q_state)
                for r in cutlass.range_constexpr(2):
                    q_coef[r] = sQScales[s_rows[r, 0][0]] * scale_log2
            row_max = cute.make_rmem_tensor((2,), cutlass.Float32)
            row_sum = cute.make_rmem_tensor((2,), cutlass.Float32)
            row_max.fill(-cutlass.Float32.inf)
            row_sum.fill(0.0)
            acc_O.fill(0.0)
            acc_S = cute.make_rmem_tensor(thr_qk.partition_shape_C((bm, bn)), cutlass.Float32)
            last = hi - 1
            if cutlass.const_expr(not self.q_in_kernel):
                pipe_q.consumer_wait(q_state)

            # The strip's block scales, read from shared memory after the arrive that follows
            # its GEMMs (the loader stored them beside the K stage; see the module docstring).
            cur = self._scale_registers()
            if cutlass.const_expr(self.overlap):
                # First strip alone: S, mask, softmax, P.
                pipe_k.consumer_wait(kv_state)
                self._qk(tiled_mma_qk, acc_S, tSrQ, tSrK, kv_state.index)
                self._read_strip_scales(cur, sKVScales, pipe_scales, kv_state)
                warpgroup.wait_group(0)
                pipe_k.consumer_release(kv_state)
                if strip_needs_mask(last, n_total, ragged, first_masked, self.causal):
                    self._mask(acc_S, tScS, last * bn, row_base, seq_len_kv, offset)
                self._softmax(acc_S, row_max, row_sum, q_coef, *cur)
                self._store_p(acc_S, tOrP, tPrP, tPsP, wg)
                for step in cutlass.range(n_blocks - 1, unroll=1):
                    v_state = kv_state.clone()
                    kv_state.advance()
                    strip = last - 1 - step
                    pipe_k.consumer_wait(kv_state)
                    self._sched_sync(wg)
                    self._qk(tiled_mma_qk, acc_S, tSrQ, tSrK, kv_state.index)
                    pipe_v.consumer_wait(v_state)
                    self._pv(tiled_mma_pv, acc_O, tOrP, tOrV, v_state.index)
                    self._sched_arrive(wg)
                    self._read_strip_scales(cur, sKVScales, pipe_scales, kv_state)
                    warpgroup.wait_group(1)
                    pipe_k.consumer_release(kv_state)
                    if cutlass.const_expr(self.causal):  # the diagonal's other strips
                        if strip >= first_masked:
                            self._mask(acc_S, tScS, strip * bn, row_base, seq_len_kv, offset)
                    alpha = self._softmax(acc_S, row_max, row_sum, q_coef, *cur)
                    warpgroup.wait_group(0)
                    pipe_v.consumer_release(v_state)
                    self._store_p(acc_S, tOrP, tPrP, tPsP, wg)
                    self._rescale(acc_O, alpha)
                if cutlass.const_expr(not self.q_in_kernel):
                    pipe_q.consumer_release(q_state)
                pipe_v.consumer_wait(kv_state)
                self._pv(tiled_mma_pv, acc_O, tOrP, tOrV, kv_state.index)
                warpgroup.wait_group(0)
                pipe_v.consumer_release(kv_state)
                kv_state.advance()
            else:
                self._sched_sync(wg)
                for i in cutlass.range(n_blocks, unroll=1):
                    pipe_k.consumer_wait(kv_state)
                    self._qk(tiled_mma_qk, acc_S, tSrQ, tSrK, kv_state.index)
                    self._sched_arrive(wg)
                    self._read_strip_scales(cur, sKVScales, pipe_scales, kv_state)
                    warpgroup.wait_group(0)
                    pipe_k.consumer_release(kv_state)
                    if strip_needs_mask(last - i, n_total, ragged, first_masked, self.causal):
                        self._mask(acc_S, tScS, (last - i) * bn, row_base, seq_len_kv, offset)
                    alpha = self._softmax(acc_S, row_max, row_sum, q_coef, *cur)
                    self._rescale(acc_O, alpha)
                    self._store_p(acc_S, tOrP, tPrP, tPsP, wg)
                    pipe_v.consumer_wait(kv_state)
                    self._sched_sync(wg)
                    self._pv(tiled_mma_pv, acc_O, tOrP, tOrV, kv_state.index)
                    warpgroup.wait_group(0)
                    pipe_v.consumer_release(kv_state)
                    kv_state.advance()
                if cutlass.const_expr(not self.q_in_kernel):
                    pipe_q.consumer_release(q_state)
                self._sched_arrive(wg)
            if cutlass.const_expr(not self.q_in_kernel):
                q_state.advance()

            # ---- epilogue: O * dv / l as bf16, LSE; rows >= seq_len are not stored ----------
            o_mn = cute.make_tensor(acc_O.iterator, _acc_mn_layout(acc_O.layout))
            totals = cute.make_rmem_tensor((2,), cutlass.Float32)
            stores = True
            if cutlass.const_expr(self.pieces):
                # A tail piece leaves its state in the workspace; the warp that completes the
                # tile merges every piece into acc_O, row_max, totals and stores.
                for r in cutlass.range_constexpr(2):
                    totals[r] = self._row_total(row_sum[r])
                stores = self._merge_tail(
                    acc_O, row_max, totals, work, tail_tile, hi - lo, thr_pv,
                    cute.make_tensor(tOcO.iterator, _acc_mn_layout(tOcO.layout)), bid, grid,
                    strips, ctid // 32)
                for r in cutlass.range_constexpr(2):
                    self._normalize_row(o_mn, r, totals[r])
            else:
                # (The pieces program's steps above, in the order this one was written before
                # it existed: so its SASS stays the one built then.)
                for r in cutlass.range_constexpr(2):
                    total = self._row_total(row_sum[r])
                    totals[r] = total
                    self._normalize_row(o_mn, r, total)
            rO = cute.make_rmem_tensor_like(acc_O, cutlass.BFloat16)
            rO.store(acc_O.load().to(cutlass.BFloat16))
            gO = cute.local_tile(mO[batch, None, head, None], (bm, d), (m_block, 0))
            tOgO = thr_pv.partition_C(gO)
            r_mn = cute.make_tensor(rO.iterator, _acc_mn_layout(rO.layout))
            g_mn = cute.make_tensor(tOgO.iterator, _acc_mn_layout(tOgO.layout))
            c_mn = cute.make_tensor(tOcO.iterator, _acc_mn_layout(tOcO.layout))
            if stores:
                for r in cutlass.range_constexpr(2):
                    row = row_base + c_mn[r, 0][0]
                    if row < seq_len:
                        if lane % 4 == 0:
                            mLSE[batch, head, row] = lse_natural(row_max[r], totals[r])
                        for c in cutlass.range_constexpr(cute.size(r_mn, mode=[1]) // 2):
                            cute.autovec_copy(r_mn[r, (None, c)], g_mn[r, (None, c)])
            item += grid

    @cute.jit
    def _row_total(self, partial):
        """A row's sum l over the four threads of its quad."""
        total = partial + cute.arch.shuffle_sync_bfly(partial, offset=1)
        return total + cute.arch.shuffle_sync_bfly(total, offset=2)

    @cute.jit
    def _normalize_row(self, o_mn, r, total):
        scale = 1.0 / total  # V's scales are in P' already
        if cutlass.const_expr(self.causal):
            if total == 0.0:  # a row that sees no key: output 0 (and LSE -inf)
                scale = cutlass.Float32(0.0)
        o_mn[r, None].store(o_mn[r, None].load() * scale)

    # ---- split_tail: the pieces of a tail tile ---------------------------------------------------
    @cute.jit
    def _merge_tail(self, acc_O, row_max, totals, work, tail_tile, count, thr_pv, c_mn, bid,
                    grid, strips, warp):
        """A tail piece's epilogue (split_tail.py): its O, m and quad-summed l into its slot,
        then `count` strips added to the counter of (tile, warp); the warp whose addition
        completes the tile's strips merges every piece's slot into its registers and returns
        True (it stores the tile's rows), the others False. Full masks only: every piece's rows
        have a finite maximum (the first merge from the empty state takes 2^(-inf - m) = 0 of
        it)."""
        mWorkO, mWorkML, mCount = work
        n_total, total_tiles = strips[2], strips[6]
        units = split_tiles(total_tiles, grid, n_total) * n_total
        lane = cute.arch.lane_idx()
        own = slot(bid, tail_tile - run_bounds(bid, grid, units)[0] // n_total)
        self._piece_io(acc_O, row_max, totals, mWorkO, mWorkML, own, thr_pv, c_mn, True)
        # Release: every lane's slot stores before lane 0's counter update (the warp sync
        # orders them; the fences make them visible at GPU scope).
        cute.arch.fence_acq_rel_gpu()
        cute.arch.sync_warp()
        old = cutlass.Int32(0)
        if lane == 0:
            counter = mCount.iterator + (tail_tile * (4 * self.wgs) + warp)
            old = cute.arch.atomic_add(counter.llvm_ptr, cutlass.Int32(count), sem="acq_rel",
                                       scope="gpu")
        old = cute.arch.shuffle_sync(old, 0)
        done = old + count == n_total
        if done:
            # Acquire: the other pieces' stores, which their counter updates released.
            cute.arch.fence_acq_rel_gpu()
            # Every piece from its slot (this one's too) in CTA order, from an empty state, so
            # the sum's order and the output bits do not depend on which piece was last.
            row_max.fill(-cutlass.Float32.inf)
            totals.fill(0.0)
            acc_O.fill(0.0)
            first = unit_owner(tail_tile * n_total, grid, units)
            last = unit_owner(tail_tile * n_total + n_total - 1, grid, units)
            for cta in cutlass.range(first, last + 1, unroll=1):
                start, end = run_bounds(cta, grid, units)
                if end > start:
                    self._piece_io(acc_O, row_max, totals, mWorkO, mWorkML,
                                   slot(cta, tail_tile - start // n_total), thr_pv, c_mn, False)
        return done

    @cute.jit
    def _piece_io(self, acc_O, row_max, totals, mWorkO, mWorkML, at, thr_pv, c_mn,
                  write: cutlass.Constexpr):
        """write: this thread's part of the piece state (unnormalised O, m, l) into workspace
        slot `at`; otherwise merge slot `at` into it: m* = max(m, m_i), O = O 2^(m - m*) +
        O_i 2^(m_i - m*), l likewise. Each thread touches the same positions in every slot (its
        own accumulator's), so a warp reads only what warps of its rows wrote."""
        tWgW = thr_pv.partition_C(mWorkO[at, None, None])
        o_mn = cute.make_tensor(acc_O.iterator, _acc_mn_layout(acc_O.layout))
        w_mn = cute.make_tensor(tWgW.iterator, _acc_mn_layout(tWgW.layout))
        pairs = cute.size(o_mn, mode=[1]) // 2
        if cutlass.const_expr(write):
            for r in cutlass.range_constexpr(2):
                for c in cutlass.range_constexpr(pairs):
                    cute.autovec_copy(o_mn[r, (None, c)], w_mn[r, (None, c)])
                if cute.arch.lane_idx() % 4 == 0:
                    row = c_mn[r, 0][0]
                    mWorkML[at, 0, row] = row_max[r]
                    mWorkML[at, 1, row] = totals[r]
        else:
            other = cute.make_rmem_tensor_like(acc_O, cutlass.Float32)
            other_mn = cute.make_tensor(other.iterator, _acc_mn_layout(other.layout))
            for r in cutlass.range_constexpr(2):
                for c in cutlass.range_constexpr(pairs):
                    cute.autovec_copy(w_mn[r, (None, c)], other_mn[r, (None, c)])
            for r in cutlass.range_constexpr(2):
                row = c_mn[r, 0][0]
                m_other = mWorkML[at, 0, row]
                m_new = cute.arch.fmax(row_max[r], m_other)
                keep = rescale_factor(row_max[r], m_new)
                take = rescale_factor(m_other, m_new)
                totals[r] = totals[r] * keep + mWorkML[at, 1, row] * take
                row_max[r] = m_new
                o_mn[r, None].store(o_mn[r, None].load() * keep + other_mn[r, None].load() * take)


def _acc_mn_layout(acc_layout):
    """wgmma C partition ((2, 2, N/8), MMA_M, MMA_N) -> rows (2, MMA_M) x cols (2, (N/8, MMA_N)).

    The per-thread value mode is (column pair e, row half i, 8-column block j).
    """
    flat = cute.make_layout(acc_layout.shape)
    shape = ((flat.shape[0][1], flat.shape[1]),
             (flat.shape[0][0], (flat.shape[0][2], flat.shape[2])))
    stride = ((flat.stride[0][1], flat.stride[1]),
              (flat.stride[0][0], (flat.stride[0][2], flat.stride[2])))
    return cute.composition(acc_layout, cute.make_layout(shape, stride=stride))
