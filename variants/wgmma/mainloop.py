"""The wgmma kernel's consumer warpgroups: each owns 64 query rows of a tile and, per strip of
block_n keys (from the last to the first), issues S = Q K^T, masks and softmaxes S into P, and
issues O += P V; then the epilogue (epilogue.py).

One strip is one method: _strip_plain (QK^T, wait, softmax, PV, wait) or, with intra-WG
overlap, _strip_overlapped (QK^T of this strip beside PV of the previous one, so the softmax
runs while the tensor cores are busy); _first_strip and _last_strip are the halves of the
overlapped pipeline's ends. pingpong: consumer warpgroups take turns issuing their GEMMs
through named barriers (barriers.py), so one warpgroup's softmax overlaps the other's GEMMs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass.cute.nvgpu import warpgroup

from variants.common.mask import AttentionMask
from variants.wgmma.barriers import p_store_barrier, sched_barrier
from variants.wgmma.config import WG_THREADS
from variants.wgmma.fragments import acc_mn_layout, p_views
from variants.wgmma.pv16 import PV16, store_p16
from variants.wgmma.qk8 import s32_view, scores_to_f32
from variants.wgmma.scheduler import LoopState
from variants.wgmma.softmax import Softmax, StripScales


@dataclass(frozen=True)
class MmaFragments:
    """A consumer thread's partitions of the tiles and its O accumulator, for every tile."""

    tiled_mma_qk: Any
    tiled_mma_pv: Any
    thr_qk: Any
    thr_pv: Any
    tSrQ: Any  # Q, the A operand of QK^T (shared memory)
    tSrK: Any  # K's ring, the B operand of QK^T
    tOrV: Any  # V's ring, the B operand of PV
    tOrP: Any  # P, the A operand of PV: registers, or shared memory (p_source=smem)
    tPrP: Any  # p_source=smem: P as e4m3 (bf16: pv_dtype) in C order before its store
    tPsP: Any  # p_source=smem: the thread's part of the P tile
    tScS: Any  # the (row, key) coordinate of each S accumulator value
    s_rows: Any  # tScS by (row, column)
    tOcO: Any  # the (row, feature) coordinate of each O accumulator value
    acc_O: Any


class ConsumerMixin:
    """WgmmaAttention's consumer warpgroups (it provides the knobs read here)."""

    @cute.jit
    def mma(self, tiled_mma_qk, tiled_mma_pv, sQ, sK, sV, sP, sQraw, pipes, scales, mO, mLSE,
            workspace, seq_len, scale_log2, ctid, wg, scheduler, seq_len_kv):
        """Consumer warpgroup `wg` (thread ctid of the consumers): every item of this CTA."""
        frags = self._fragments(tiled_mma_qk, tiled_mma_pv, sQ, sK, sV, sP, ctid, wg)
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        if cutlass.const_expr(self.pingpong):
            if wg == 0:
                # The first consumer holds the first turn.
                cute.arch.barrier_arrive(barrier_id=sched_barrier(0),
                                         number_of_threads=2 * WG_THREADS)
        ragged = seq_len_kv % self.block_n != 0
        lane = cute.arch.lane_idx()
        state = LoopState(scheduler.bid, q_state, kv_state)
        while state.item < scheduler.n_items:
            state = self._mma_tile(state, frags, sQ, sQraw, pipes, scales, mO, mLSE, workspace,
                                   seq_len, scale_log2, ctid, wg, scheduler, seq_len_kv, ragged,
                                   lane)

    def _fragments(self, tiled_mma_qk, tiled_mma_pv, sQ, sK, sV, sP, ctid, wg) -> MmaFragments:
        bm, bn = self.block_m, self.block_n
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
        s_rows = cute.make_tensor(tScS.iterator, acc_mn_layout(tScS.layout))
        tOcO = thr_pv.partition_C(cute.make_identity_tensor((bm, self.head_dim)))
        acc_O = cute.make_rmem_tensor(thr_pv.partition_shape_C((bm, self.head_dim)),
                                      cutlass.Float32)
        if cutlass.const_expr(not self.register_p):
            tPrP = cute.make_rmem_tensor(thr_qk.partition_shape_C((bm, bn)),
                                         PV16 if self.pv16 else cutlass.Float8E4M3FN)
        return MmaFragments(tiled_mma_qk, tiled_mma_pv, thr_qk, thr_pv, tSrQ, tSrK, tOrV, tOrP,
                            tPrP, tPsP, tScS, s_rows, tOcO, acc_O)

    @cute.jit
    def _mma_tile(self, state, frags, sQ, sQraw, pipes, scales, mO, mLSE, workspace, seq_len,
                  scale_log2, ctid, wg, scheduler, seq_len_kv, ragged, lane):
        """One item: Q's row scales, the strips from the last, the epilogue. Returns the loop
        state for the next item."""
        q_state = state.q
        work = scheduler.work(state.item)
        n_blocks = work.hi - work.lo
        mask = AttentionMask.for_tile(work.m_block * self.block_m, scheduler.n_blocks, ragged,
                                      seq_len_kv, scheduler.offset, frags.tScS, self.block_n,
                                      self.causal, self.group)
        q_coef = self._tile_q(q_state, sQraw, sQ, frags.s_rows, scale_log2, pipes,
                              scales.q_stage, wg)
        softmax = Softmax.create(q_coef, self.block_n, self.scale_blocks, self.causal,
                                 self.fma_exp2, self._head_inv_v(scales.q_stage))
        frags.acc_O.fill(0.0)
        acc_S = cute.make_rmem_tensor(frags.thr_qk.partition_shape_C((self.block_m, self.block_n)),
                                      cutlass.Float32)
        last = work.hi - 1
        if cutlass.const_expr(not self.q_in_kernel):
            pipes.q.consumer_wait(q_state)
        # The strip's block scales, read from shared memory after the arrive that follows its
        # GEMMs (the loader stored them beside the K stage: pipelines.py); none per head.
        strip_scales = None
        if cutlass.const_expr(not self.kv_head_scales):
            strip_scales = StripScales.registers(self.scale_blocks)

        kv_state = self._first_strip(state.kv, acc_S, last, mask, softmax, strip_scales, frags,
                                     pipes, scales, wg)
        for step in cutlass.range(self._strip_steps(n_blocks), unroll=1):
            if cutlass.const_expr(self.overlap):
                kv_state = self._strip_overlapped(kv_state, last, step, acc_S, mask, softmax,
                                                  strip_scales, frags, pipes, scales, wg)
            else:
                kv_state = self._strip_plain(kv_state, last, step, acc_S, mask, softmax,
                                             strip_scales, frags, pipes, scales, wg)
        if cutlass.const_expr(not self.q_in_kernel):
            pipes.q.consumer_release(q_state)
        kv_state = self._last_strip(kv_state, frags, pipes, wg)
        if cutlass.const_expr(not self.q_in_kernel):
            q_state.advance()
        self.epilogue(softmax, frags, work, mask.row_base, mO, mLSE, workspace, seq_len, lane,
                      scheduler, ctid)
        return LoopState(state.item + scheduler.grid, q_state, kv_state)

    def _head_inv_v(self, sQScales):
        """kv_scales=head: 1 / V's descale of the tile's KV head, which the loader staged after
        Q's row scales (K's it folded into them); None with block scales."""
        if cutlass.const_expr(not self.kv_head_scales):
            return None
        return sQScales[self.block_m]

    def _read_strip_scales(self, strip_scales, scales, pipes, kv_state):
        """The strip's block scales from the slot beside its K stage (none per head)."""
        if cutlass.const_expr(not self.kv_head_scales):
            strip_scales.read(scales.kv_stage, pipes.scales, kv_state)

    def _strip_steps(self, n_blocks):
        """Trips of the strip loop: every strip, or with overlap all but the first (whose QK^T
        and softmax _first_strip issues, whose PV the first trip does)."""
        if cutlass.const_expr(self.overlap):
            return n_blocks - 1
        return n_blocks

    @cute.jit
    def _first_strip(self, kv_state, acc_S, strip, mask, softmax, strip_scales, frags, pipes,
                     scales, wg):
        """With overlap: the first strip's S, mask, softmax and P (its PV goes beside the next
        strip's QK^T). Without: this warpgroup's first GEMM turn."""
        if cutlass.const_expr(self.overlap):
            pipes.k.consumer_wait(kv_state)
            self._qk(frags, acc_S, kv_state.index)
            self._read_strip_scales(strip_scales, scales, pipes, kv_state)
            warpgroup.wait_group(0)
            pipes.k.consumer_release(kv_state)
            self._scores_f32(acc_S)
            if mask.needs_mask(strip):
                mask.apply(acc_S, strip)
            softmax.online(acc_S, strip_scales)
            self._store_p(acc_S, frags, wg)
        else:
            self._sched_sync(wg)
        return kv_state

    @cute.jit
    def _strip_overlapped(self, kv_state, last, step, acc_S, mask, softmax, strip_scales,
                          frags, pipes, scales, wg):
        """Trip `step`: QK^T of strip last - 1 - step issued beside PV of the strip before it
        (whose P is in tOrP); its softmax runs while the PV wgmma is in flight, O is rescaled
        after it."""
        v_state = kv_state.clone()
        kv_state.advance()
        strip = last - 1 - step
        pipes.k.consumer_wait(kv_state)
        self._sched_sync(wg)
        self._qk(frags, acc_S, kv_state.index)
        pipes.v.consumer_wait(v_state)
        self._pv(frags, v_state.index)
        self._sched_arrive(wg)
        self._read_strip_scales(strip_scales, scales, pipes, kv_state)
        warpgroup.wait_group(1)
        pipes.k.consumer_release(kv_state)
        self._scores_f32(acc_S)
        if cutlass.const_expr(self.causal):  # the diagonal's other strips
            if mask.on_diagonal(strip):
                mask.apply(acc_S, strip)
        alpha = softmax.online(acc_S, strip_scales)
        warpgroup.wait_group(0)
        pipes.v.consumer_release(v_state)
        self._store_p(acc_S, frags, wg)
        softmax.rescale(frags.acc_O, alpha)
        return kv_state

    @cute.jit
    def _strip_plain(self, kv_state, last, step, acc_S, mask, softmax, strip_scales, frags,
                     pipes, scales, wg):
        """Trip `step`: QK^T of strip last - step, its softmax, then its PV, each GEMM waited
        on."""
        pipes.k.consumer_wait(kv_state)
        self._qk(frags, acc_S, kv_state.index)
        self._sched_arrive(wg)
        self._read_strip_scales(strip_scales, scales, pipes, kv_state)
        warpgroup.wait_group(0)
        pipes.k.consumer_release(kv_state)
        self._scores_f32(acc_S)
        strip = last - step
        if mask.needs_mask(strip):
            mask.apply(acc_S, strip)
        alpha = softmax.online(acc_S, strip_scales)
        softmax.rescale(frags.acc_O, alpha)
        self._store_p(acc_S, frags, wg)
        pipes.v.consumer_wait(kv_state)
        self._sched_sync(wg)
        self._pv(frags, kv_state.index)
        warpgroup.wait_group(0)
        pipes.v.consumer_release(kv_state)
        kv_state.advance()
        return kv_state

    @cute.jit
    def _last_strip(self, kv_state, frags, pipes, wg):
        """With overlap: the last strip's PV. Without: this warpgroup gives up its turn."""
        if cutlass.const_expr(self.overlap):
            pipes.v.consumer_wait(kv_state)
            self._pv(frags, kv_state.index)
            warpgroup.wait_group(0)
            pipes.v.consumer_release(kv_state)
            kv_state.advance()
        else:
            self._sched_arrive(wg)
        return kv_state

    # ---- the GEMMs, P, the pingpong turns -----------------------------------------------------
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

    def _qk(self, frags, acc_S, stage):
        acc = s32_view(acc_S) if cutlass.const_expr(self.qk_int8) else acc_S
        self._gemm(frags.tiled_mma_qk, acc, frags.tSrQ, frags.tSrK, stage, False)

    def _scores_f32(self, acc_S):
        """qk_dtype=int8: S's s32 values made f32 in their registers (qk8.scores_to_f32)."""
        if cutlass.const_expr(self.qk_int8):
            scores_to_f32(acc_S)

    def _pv(self, frags, stage):
        self._gemm(frags.tiled_mma_pv, frags.acc_O, frags.tOrP, frags.tOrV, stage, True)

    @cute.jit
    def _store_p(self, acc_S, frags, wg):
        """P as e4m3 into the PV wgmma's A operand: its registers (the accumulator's in another
        order, V's keys being stored to match: fragments.p_views) or the P tile; bf16 with
        pv_dtype=bf16, in the accumulator's own order (pv16.store_p16)."""
        fp8 = cutlass.Float8E4M3FN
        if cutlass.const_expr(self.pv16):
            store_p16(acc_S, frags.tOrP if self.register_p else frags.tPrP)
        elif cutlass.const_expr(self.register_p):
            c_view, a_view = p_views(acc_S, frags.tOrP, self.block_n)
            a_view.store(c_view.load().to(fp8))
        else:
            frags.tPrP.store(acc_S.load().to(fp8))
        if cutlass.const_expr(not self.register_p):
            cute.autovec_copy(frags.tPrP, frags.tPsP)
            # Generic-proxy smem writes must be visible to the async proxy (wgmma) reads.
            cute.arch.fence_view_async_shared()
            cute.arch.barrier(barrier_id=p_store_barrier(wg, self.wgs),
                              number_of_threads=WG_THREADS)

    def _sched_sync(self, wg):
        """pingpong: wait for this warpgroup's turn to issue GEMMs."""
        if cutlass.const_expr(self.pingpong):
            cute.arch.barrier(barrier_id=sched_barrier(wg), number_of_threads=2 * WG_THREADS)

    def _sched_arrive(self, wg):
        """pingpong: hand the turn to the next consumer warpgroup."""
        if cutlass.const_expr(self.pingpong):
            nxt = (wg + 1) % self.wgs
            cute.arch.barrier_arrive(barrier_id=sched_barrier(nxt),
                                     number_of_threads=2 * WG_THREADS)
