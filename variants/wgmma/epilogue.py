"""The wgmma consumers' epilogue: O / l as bf16 straight from registers and LSE (rows past
seq_len are not stored), and in split_tail's pieces program the merge of a tail tile's pieces
(split_tail.py says how the tail is split, the counters and the merge order)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import cutlass
import cutlass.cute as cute

from variants.common.softmax import lse_natural, rescale_factor
from variants.wgmma.fragments import acc_mn_layout
from variants.wgmma.split_tail import (
    PIECES_PER_CTA,
    run_bounds,
    slot,
    split_tiles,
    unit_owner,
    workspace_offsets,
)


@dataclass(frozen=True)
class SplitTailWorkspace:
    """split_tail's scratch: each slot's partial O (slots, block_m, head_dim), its rows' m and
    l (slots, 2, block_m), and one counter per (tail tile, consumer warp)."""

    o: Any
    ml: Any
    count: Any


def workspace_views(workspace_ptr, grid, block_m: int, head_dim: int, consumer_wgs: int):
    """(O, m and l, counters) of the workspace of a launch on `grid` CTAs (split_tail.
    workspace_offsets lays it out): views of a null pointer when the config needs none (never
    read then)."""
    slots = PIECES_PER_CTA * grid
    ml_at, counters_at = workspace_offsets(block_m, head_dim, grid)
    m_work_o = cute.make_tensor(
        workspace_ptr, cute.make_ordered_layout((slots, block_m, head_dim), order=(2, 1, 0)))
    m_work_ml = cute.make_tensor(
        workspace_ptr + ml_at, cute.make_ordered_layout((slots, 2, block_m), order=(2, 1, 0)))
    counters = cute.recast_ptr(workspace_ptr + counters_at, dtype=cutlass.Int32)
    m_count = cute.make_tensor(counters, cute.make_layout(grid * 4 * consumer_wgs))
    return m_work_o, m_work_ml, m_count


@cute.jit
def zero_counters(m_count, tidx, threads: cutlass.Constexpr):
    """Every counter zeroed, strided over the grid's threads. The whole tiles' program calls it
    where there is a tail: the pieces program, which reads the counters, is the next launch on
    the stream (WgmmaAttention.__call__), so no launch of the host's zeroes them."""
    bid, _, _ = cute.arch.block_idx()
    ctas, _, _ = cute.arch.grid_dim()
    for i in cutlass.range(bid * threads + tidx, cute.size(m_count), ctas * threads, unroll=1):
        m_count[i] = cutlass.Int32(0)


class EpilogueMixin:
    """WgmmaAttention's epilogue (it provides the knobs read here)."""

    @cute.jit
    def epilogue(self, softmax, frags, work, row_base, mO, mLSE, workspace, seq_len, lane,
                 scheduler, ctid):
        """O * dv / l as bf16 and LSE of the tile's rows below seq_len; a tail piece first
        leaves its state in the workspace, and only the warp that completes the tile merges
        every piece and stores."""
        acc_O, thr_pv, tOcO = frags.acc_O, frags.thr_pv, frags.tOcO
        row_max = softmax.row_max
        bm, d = self.block_m, self.head_dim
        o_mn = cute.make_tensor(acc_O.iterator, acc_mn_layout(acc_O.layout))
        totals = cute.make_rmem_tensor((2,), cutlass.Float32)
        stores = True
        if cutlass.const_expr(self.pieces):
            for r in cutlass.range_constexpr(2):
                totals[r] = softmax.row_total(r)
            stores = self._merge_tail(
                acc_O, row_max, totals, workspace, work.tail_tile, work.hi - work.lo, thr_pv,
                cute.make_tensor(tOcO.iterator, acc_mn_layout(tOcO.layout)), scheduler,
                ctid // 32)
            for r in cutlass.range_constexpr(2):
                softmax.normalize(o_mn, r, totals[r])
        else:
            # The pieces program's steps in the whole tiles' program's order, whose cubins
            # benchmarks/cubin_hashes.py pins.
            for r in cutlass.range_constexpr(2):
                total = softmax.row_total(r)
                totals[r] = total
                softmax.normalize(o_mn, r, total)
        rO = cute.make_rmem_tensor_like(acc_O, cutlass.BFloat16)
        rO.store(acc_O.load().to(cutlass.BFloat16))
        gO = cute.local_tile(mO[work.batch, None, work.head, None], (bm, d), (work.m_block, 0))
        tOgO = thr_pv.partition_C(gO)
        r_mn = cute.make_tensor(rO.iterator, acc_mn_layout(rO.layout))
        g_mn = cute.make_tensor(tOgO.iterator, acc_mn_layout(tOgO.layout))
        c_mn = cute.make_tensor(tOcO.iterator, acc_mn_layout(tOcO.layout))
        batch, head = work.batch, work.head
        if stores:
            for r in cutlass.range_constexpr(2):
                row = row_base + c_mn[r, 0][0]
                if row < seq_len:
                    if lane % 4 == 0:
                        mLSE[batch, head, row] = lse_natural(row_max[r], totals[r])
                    for c in cutlass.range_constexpr(cute.size(r_mn, mode=[1]) // 2):
                        cute.autovec_copy(r_mn[r, (None, c)], g_mn[r, (None, c)])

    # ---- split_tail: the pieces of a tail tile -------------------------------------------------
    @cute.jit
    def _merge_tail(self, acc_O, row_max, totals, workspace, tail_tile, count, thr_pv, c_mn,
                    scheduler, warp):
        """A tail piece's epilogue (split_tail.py): its O, m and quad-summed l into its slot,
        then `count` strips added to the counter of (tile, warp); the warp whose addition
        completes the tile's strips merges every piece's slot into its registers and returns
        True (it stores the tile's rows), the others False. Full masks only: every piece's rows
        have a finite maximum (the first merge from the empty state takes 2^(-inf - m) = 0 of
        it)."""
        mWorkO, mWorkML, mCount = workspace.o, workspace.ml, workspace.count
        n_total, grid, bid = scheduler.n_blocks, scheduler.grid, scheduler.bid
        units = split_tiles(scheduler.total_tiles, grid, n_total) * n_total
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
        o_mn = cute.make_tensor(acc_O.iterator, acc_mn_layout(acc_O.layout))
        w_mn = cute.make_tensor(tWgW.iterator, acc_mn_layout(tWgW.layout))
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
            other_mn = cute.make_tensor(other.iterator, acc_mn_layout(other.layout))
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
