"""The wgmma kernel's loader warp (warp 0 of the producer warpgroup): per item, the TMA loads of
its Q tile and of its K and V strips from the last (ragged) strip to the first, each strip's
block scales staged beside its K stage (pipelines.py says how they travel; with
kv_scales=head none: K's one descale goes into Q's row scales, V's after them). With intra-WG
overlap K runs one strip ahead of V, in the order the consumers issue QK^T(j+1) beside PV(j).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass.cute.nvgpu import cpasync

from variants.block_scales import KV_BLOCK
from variants.wgmma.scheduler import LoopState


class ProducerMixin:
    """WgmmaAttention's loader (it provides the knobs read here)."""

    @cute.jit
    def load(self, tma_q, mQ, tma_k, mK, tma_v, mV, sQ, sK, sV, pipes, scales, scheduler):
        """sQ: the tile TMA fills with Q (the bf16 staging tile with q_quant=kernel); sV: the
        ring TMA fills with V (the staging ring with v_layout=kernel)."""
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        one = cute.make_layout(1)
        lane = cute.arch.lane_idx()
        q_values = cute.make_rmem_tensor((self.block_m // 32,), cutlass.Float32)
        state = LoopState(scheduler.bid, q_state, kv_state)
        while state.item < scheduler.n_items:
            state = self._load_tile(state, tma_q, mQ, tma_k, mK, tma_v, mV, sQ, sK, sV, pipes,
                                    scales, scheduler, one, lane, q_values)

    @cute.jit
    def _load_tile(self, state, tma_q, mQ, tma_k, mK, tma_v, mV, sQ, sK, sV, pipes, scales,
                   scheduler, one, lane, q_values):
        """One item's loads; returns the loop state for the next."""
        pipe_q, pipe_k, pipe_v = pipes.q, pipes.k, pipes.vload
        pipe_q_scales, pipe_scales = pipes.q_scales, pipes.scales
        mQScales, mKVScales, sQScales, sKVScales = (scales.q_rows, scales.kv_blocks,
                                                    scales.q_stage, scales.kv_stage)
        q_state, kv_state = state.q, state.kv
        q_rows_per_lane = self.block_m // 32
        work = scheduler.work(state.item)
        m_block, head, kv_head, batch = work.m_block, work.head, work.kv_head, work.batch
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

        # Strips from the last (ragged) to the first of [lo, hi).
        last = work.hi - 1
        n_blocks = work.hi - work.lo
        value = self._fetch_strip_scales(mKVScales, batch, kv_head, last, lane)
        pipe_k.producer_acquire(kv_state)
        cute.copy(tma_k, tKgK[None, last], tKsK[None, kv_state.index],
                  tma_bar_ptr=pipe_k.producer_get_barrier(kv_state))
        self._stage_strip_scales(value, sKVScales, pipe_scales, kv_state, lane)
        # Q: e4m3 codes into the tile the QK^T wgmma reads, or (q_quant=kernel) bf16 into the
        # staging tile the consumers quantize from.
        gQ = cute.local_tile(mQ[None, None, head, batch], (self.block_m, self.head_dim),
                             (m_block, 0))
        tQsQ, tQgQ = cpasync.tma_partition(
            tma_q, 0, one, cute.group_modes(sQ, 0, 2), cute.group_modes(gQ, 0, 2))
        if cutlass.const_expr(not self.q_in_kernel):
            # Row r of the tile: lane r % 32's value r // 32.
            for j in cutlass.range_constexpr(q_rows_per_lane):
                q_values[j] = mQScales[batch, head, m_block * self.block_m + 32 * j + lane]
            if cutlass.const_expr(self.kv_head_scales):
                # Per head: K's descale folded into Q's row scales, 1 / V's staged after them.
                k_descale = mKVScales[0, batch, kv_head, 0]
                inv_v = mKVScales[2, batch, kv_head, 0]
        pipe_q.producer_acquire(q_state)
        cute.copy(tma_q, tQgQ, tQsQ, tma_bar_ptr=pipe_q.producer_get_barrier(q_state))
        if cutlass.const_expr(not self.q_in_kernel):
            # The Q tile's slot is free: its consumers read the scales before releasing Q.
            for j in cutlass.range_constexpr(q_rows_per_lane):
                if cutlass.const_expr(self.kv_head_scales):
                    sQScales[32 * j + lane] = q_values[j] * k_descale
                else:
                    sQScales[32 * j + lane] = q_values[j]
            if cutlass.const_expr(self.kv_head_scales):
                if lane == 0:
                    sQScales[self.block_m] = inv_v
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
            cute.copy(tma_v, tVgV[None, work.lo], tVsV[None, kv_state.index],
                      tma_bar_ptr=pipe_v.producer_get_barrier(kv_state))
            kv_state.advance()
        return LoopState(state.item + scheduler.grid, q_state, kv_state)

    @cute.jit
    def _fetch_strip_scales(self, mKVScales, batch, kv_head, strip, lane):
        """This lane's one block scale of a strip (lane 3 * scale_blocks and above: none): K's,
        log2 of V's, then 1 / V's, each for the strip's 64-key blocks in order. A global load,
        issued before the loader waits for the stage, so that the wait hides its latency."""
        nb = self.scale_blocks
        value = cutlass.Float32(1.0)
        if cutlass.const_expr(not self.kv_head_scales):  # per head: staged with Q's scales
            if lane < 3 * nb:
                value = mKVScales[lane // nb, batch, kv_head,
                                  strip * self.block_n // KV_BLOCK + lane % nb]
        return value

    @cute.jit
    def _stage_strip_scales(self, value, sKVScales, pipe_scales, state, lane):
        """The fetched scales into the stage's slot (the K stage just acquired: its consumers
        have read the slot's previous scales), then every loader thread arrives."""
        if cutlass.const_expr(not self.kv_head_scales):
            if lane < 3 * self.scale_blocks:
                sKVScales[lane, state.index] = value
            pipe_scales.producer_commit(state)
