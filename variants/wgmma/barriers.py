"""Named barrier ids of the wgmma kernel, in one place: 0 is __syncthreads (sync_threads); the
pingpong turn barriers of the consumer warpgroups come next, one per consumer, then one barrier
per consumer that orders its P stores to shared memory before its PV wgmma reads them (and,
q_quant=kernel, its Q stores before its first QK^T)."""

from __future__ import annotations

from enum import IntEnum


class NamedBarrier(IntEnum):
    SYNC_THREADS = 0
    SCHED = 1  # the first pingpong turn barrier: consumer wg waits on SCHED + wg


def sched_barrier(wg):
    """The turn barrier of consumer warpgroup `wg` (pingpong)."""
    return NamedBarrier.SCHED + wg


def p_store_barrier(wg, consumer_wgs: int):
    """The barrier consumer `wg` syncs on after storing P to shared memory."""
    return NamedBarrier.SCHED + consumer_wgs + wg


def q_store_barrier(wg, consumer_wgs: int):
    """The barrier consumer `wg` syncs on around writing its Q rows (q_quant=kernel): the P
    store's id, which only the same 128 threads use, at another point of their program (a
    named barrier completes per use, so the two uses never mix)."""
    return p_store_barrier(wg, consumer_wgs)
