"""The mbarrier pipelines between the wgmma kernel's loader and its consumers, and where the
block scales travel.

Q: one stage, TMA-filled (q_quant=kernel: the bf16 staging tile, which the consumers release
as soon as they hold its values). K and V: rings of kv_stages, TMA-filled; with v_layout=kernel
TMA fills a staging ring (vload) that the producer's other warps transpose into the V ring.
The block scales (variants/block_scales.py): the loader warp reads each strip's K and V scales
and each tile's Q row scales from global memory into registers before it waits for the stage,
stores them beside it and arrives on a full-only barrier (scales, q_scales); the K stage's and
the Q tile's empty barriers guard their reuse, as the consumers read them before releasing
those. So no global load is in flight in the consumers' main loop (docs/family-wgmma.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline

from variants.wgmma.config import WG_THREADS
from variants.wgmma.v_transpose import TRANSPOSE_WARPS


@dataclass(frozen=True)
class Pipelines:
    q: Any
    k: Any
    v: Any  # the V ring the PV wgmma reads
    vload: Any  # the ring TMA fills with V: v itself, or (v_layout=kernel) the staging ring
    scales: Any  # each K stage's strip scales: full barriers only
    q_scales: Any  # the Q tile's row scales (None with q_quant=kernel)


@dataclass(frozen=True)
class ScaleViews:
    """The block scales in global memory and the slots the loader stages them in."""

    q_rows: Any  # Q's per-row scales (batch, heads, padded)
    kv_blocks: Any  # K's, log2 V's and 1 / V's per 64 keys (3, batch, kv_heads, blocks)
    q_stage: Any  # the Q tile's row scales in shared memory (None with q_quant=kernel)
    kv_stage: Any  # (3 * scale_blocks, kv_stages) strip scales in shared memory


class PipelinesMixin:
    """WgmmaAttention's pipeline set-up (it provides the knobs read here)."""

    def _make_pipelines(self, storage, sQ, sV, sK_layout, sQraw_layout, mQScales, mKVScales):
        """(Pipelines, ScaleViews, the tile TMA fills with Q, the ring TMA fills with V)."""
        bm, bn, d = self.block_m, self.block_n, self.head_dim
        producer = pipeline.CooperativeGroup(pipeline.Agent.Thread, 1)
        # One arrive per consumer warp (lane 0 signals the empty barrier).
        consumers = pipeline.CooperativeGroup(pipeline.Agent.Thread, 4 * self.wgs)
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
            v_bytes = bn * d * 2 if cutlass.const_expr(self.pv16) else bn * d  # bf16 V: 2 B
            pipe_v = pipeline.PipelineTmaAsync.create(
                barrier_storage=storage.mbar_v.data_ptr(), num_stages=self.stages,
                producer_group=producer, consumer_group=consumers, tx_count=v_bytes,
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
        pipes = Pipelines(pipe_q, pipe_k, pipe_v, pipe_vload, pipe_scales, pipe_q_scales)
        scales = ScaleViews(mQScales, mKVScales, sQScales, sKVScales)
        return pipes, scales, sQ_load, sV_load
