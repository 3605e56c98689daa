"""The wgmma kernel's tile arithmetic on the CPU: the tile orders (tiles.py), the scheduler's tile
-> (query block, head, KV head, batch, strips) and pack_gqa's packed views (pack_gqa.py),
checked against brute-force enumerations.

The scheduler and the views run as the kernel's own code: a host-side @cute.jit function builds
TileScheduler and the views exactly as the kernel does and evaluates them for every tile and row
on the CPU (the views read int32 buffers holding their own element offsets, so each read says
which element a coordinate addresses). The invariants: every (batch, head, token) row is in
exactly one tile, at the packed row whose token and head pack_gqa documents; causal tiles come
longest first; head_swizzle's sections keep the CTAs in flight on a few heads; a causal tile
visits exactly the strips its rows' tokens see. What this cannot see: the TMA box the Q view
turns into and the epilogue's partition of it (tests/gpu/test_pack_gqa_gpu.py).
"""

from __future__ import annotations

import itertools

import cutlass
import cutlass.cute as cute
import pytest
import torch
from cutlass.cute.runtime import from_dlpack

from variants.common.abi import block_scale_views, output_views
from variants.common.masking import (
    first_masked_strip,
    key_hidden,
    query_token,
    strips_needed,
)
from variants.wgmma.pack_gqa import packed_head, packed_views
from variants.wgmma.scheduler import TileScheduler
from variants.wgmma.tiles import tile_coords, tile_rows

ORDERS = [(False, 0), (True, 0), (True, 1), (True, 2), (True, 4), (True, 8), (True, 16)]


def _order(m_blocks, heads_batch, longest_first, swizzle):
    return [tile_coords(t, m_blocks, heads_batch, longest_first, swizzle)
            for t in range(m_blocks * heads_batch)]


@pytest.mark.parametrize(("longest_first", "swizzle"), ORDERS)
@pytest.mark.parametrize(("m_blocks", "heads_batch"), [(1, 1), (7, 5), (64, 56), (3, 40),
                                                        (16, 7)])
def test_every_order_deals_every_tile_once(m_blocks, heads_batch, longest_first, swizzle):
    order = _order(m_blocks, heads_batch, longest_first, swizzle)
    assert sorted(order) == list(itertools.product(range(m_blocks), range(heads_batch)))


@pytest.mark.parametrize("swizzle", [0, 1, 2, 4, 8, 16])
@pytest.mark.parametrize(("m_blocks", "heads_batch"), [(7, 5), (64, 56), (3, 40), (16, 7)])
def test_longest_first_deals_sections_of_heads_each_longest_first(m_blocks, heads_batch,
                                                                  swizzle):
    """Sections of `swizzle` consecutive (head, batch) pairs in turn (the last one shorter),
    inside each the query blocks from the last: a causal tile's length falls with m_block."""
    order = _order(m_blocks, heads_batch, True, swizzle)
    width = swizzle or heads_batch
    at = 0
    for first in range(0, heads_batch, width):
        pairs = list(range(first, min(first + width, heads_batch)))
        section = order[at:at + m_blocks * len(pairs)]
        at += len(section)
        assert sorted({hb for _, hb in section}) == pairs
        m = [mb for mb, _ in section]
        assert m == sorted(m, reverse=True)
    assert at == len(order)
    # L2: any run of (pairs per section x m_blocks) consecutive tiles, e.g. a wave of CTAs,
    # reads the K/V of at most two sections' heads.
    run = width * m_blocks
    for start in range(0, len(order), max(1, run // 3)):
        assert len({hb for _, hb in order[start:start + run]}) <= 2 * width


def _scheduler_trace(m_blocks, heads, kv_heads, batch, n_blocks, offset, block_m, block_n,
                     causal, longest_first, packed, swizzle):
    """(m_block, head, kv_head, batch, strips) of every tile, from the kernel's TileScheduler."""
    total = m_blocks * (kv_heads if packed > 1 else heads) * batch
    out = torch.full((total, 5), -1, dtype=torch.int32)
    tile_heads = kv_heads if packed > 1 else heads

    @cute.jit
    def trace(rec: cute.Tensor, m_blocks: cutlass.Int32, tile_heads: cutlass.Int32,
              group: cutlass.Int32, n_blocks: cutlass.Int32, offset: cutlass.Int32,
              total: cutlass.Int32):
        sched = TileScheduler(m_blocks, tile_heads, n_blocks, group, offset, total // m_blocks,
                              total, 0, 1, total, block_m, block_n, causal, longest_first,
                              False, packed, swizzle)
        for t in cutlass.range(total, unroll=1):
            w = sched.tile(t)
            rec[t, 0] = w.m_block
            rec[t, 1] = w.head
            rec[t, 2] = w.kv_head
            rec[t, 3] = w.batch
            rec[t, 4] = w.hi

    args = (cutlass.Int32(m_blocks), cutlass.Int32(tile_heads), cutlass.Int32(heads // kv_heads),
            cutlass.Int32(n_blocks), cutlass.Int32(offset), cutlass.Int32(total))
    cute.compile(trace, from_dlpack(out), *args, options="--gpu-arch=sm_90a")(
        from_dlpack(out), *args)
    return out.tolist()


def _visible_strips(tokens, seq_len_kv, offset, block_n, causal):
    """Brute force: the strips holding a key some token of `tokens` sees (at least one)."""
    seen = {j // block_n for t in tokens for j in range(seq_len_kv)
            if not key_hidden(j, t, seq_len_kv, offset, causal)}
    return max(seen) + 1 if seen else 1


SCHEDULES = [
    # (batch, heads, kv_heads, seq_len, seq_len_kv, block_m, block_n, causal, pack, order, swz)
    (2, 8, 2, 77, 77, 128, 128, True, True, True, 0),
    (2, 8, 2, 77, 77, 128, 64, True, True, True, 2),
    (1, 16, 2, 50, 300, 64, 64, True, True, False, 0),
    (3, 4, 4, 100, 100, 128, 128, True, False, True, 4),
    (1, 8, 1, 33, 20, 128, 128, True, True, True, 0),
    (2, 6, 3, 129, 129, 192, 128, False, False, False, 0),
]


@pytest.mark.compile
@pytest.mark.parametrize("case", SCHEDULES, ids=lambda c: "-".join(map(str, c)))
def test_the_kernels_scheduler_covers_every_query_row_once_with_the_strips_it_sees(case):
    batch, heads, kv_heads, seq_len, seq_len_kv, bm, bn, causal, pack, longest, swz = case
    group = heads // kv_heads if pack else 1
    m_blocks = -(-seq_len * group // bm)
    n_blocks = -(-seq_len_kv // bn)
    offset = seq_len_kv - seq_len
    rows = _scheduler_trace(m_blocks, heads, kv_heads, batch, n_blocks, offset, bm, bn, causal,
                            longest, group, swz)
    covered = []
    for m_block, head, kv_head, b, hi in rows:
        start, tokens = tile_rows(m_block, bm, group)
        assert start == m_block * bm // group
        tile_tokens = [t for t in range(start, start + tokens) if t < seq_len]
        if group > 1:
            assert head == kv_head
            for p in range(m_block * bm, min((m_block + 1) * bm, seq_len * group)):
                covered.append((b, packed_head(p, kv_head, group), query_token(p, group)))
        else:
            assert kv_head == head // (heads // kv_heads)
            covered += [(b, head, t) for t in tile_tokens]
        want = _visible_strips(tile_tokens or [start], seq_len_kv, offset, bn, causal)
        assert hi == want, (m_block, head, b)
    assert sorted(covered) == list(itertools.product(range(batch), range(heads),
                                                     range(seq_len)))
    if causal and longest and not swz:
        assert [r[4] for r in rows] == sorted((r[4] for r in rows), reverse=True)


@pytest.mark.parametrize(("seq_len", "seq_len_kv", "group", "block_m", "block_n"),
                         [(77, 77, 4, 128, 64), (50, 300, 8, 64, 64), (200, 90, 2, 128, 128),
                          (1, 1, 8, 64, 64)])
def test_a_packed_tiles_mask_hides_exactly_what_each_rows_token_does_not_see(
        seq_len, seq_len_kv, group, block_m, block_n):
    """The causal mask of a packed tile (row_base a packed row, common/mask.py): strips before
    first_masked are visible to every row's token, and the per-key rule of row p is token
    p // group's."""
    offset = seq_len_kv - seq_len
    for m_block in range(-(-seq_len * group // block_m)):
        row_base = m_block * block_m
        first = first_masked_strip(query_token(row_base, group), block_n, offset)
        start, tokens = tile_rows(m_block, block_m, group)
        hi = strips_needed(start, tokens, block_n, -(-seq_len_kv // block_n), offset, True)
        for p in range(row_base, row_base + block_m):
            token = query_token(p, group)
            assert start <= token < start + tokens
            for j in range(seq_len_kv):
                hidden = key_hidden(j, token, seq_len_kv, offset, True)
                assert hidden == (j > token + offset)
                if j // block_n < first:
                    assert not hidden
                if j // block_n >= hi:
                    assert hidden


def _view_reads(batch, heads, kv_heads, seq_len, padded, head_dim, block_m):
    """For every (batch, KV head, query block, tile row): the element offsets the kernel's
    packed views address for Q (row r, feature 1), O (row r, feature 3), LSE and Q's scale."""
    group = heads // kv_heads
    m_blocks = -(-seq_len * group // block_m)
    q_mem = torch.arange(batch * padded * heads * head_dim, dtype=torch.int32)
    o_mem = torch.arange(batch * seq_len * heads * head_dim, dtype=torch.int32)
    lse_mem = torch.arange(batch * heads * seq_len, dtype=torch.int32)
    s_mem = torch.arange(batch * heads * padded + 3 * batch * kv_heads * (-(-padded // 64)),
                         dtype=torch.int32)
    out = torch.full((batch, kv_heads, m_blocks, block_m, 4), -1, dtype=torch.int32)

    @cute.jit
    def reads(rec: cute.Tensor, q: cute.Tensor, o: cute.Tensor, lse: cute.Tensor,
              s: cute.Tensor, batch: cutlass.Int32, heads: cutlass.Int32,
              kv_heads: cutlass.Int32, seq_len: cutlass.Int32, padded: cutlass.Int32):
        # The views as WgmmaAttention.__call__ builds them (q_quant=prepare).
        q_layout = cute.make_ordered_layout((batch, padded, heads, head_dim), order=(3, 2, 1, 0))
        mQ = cute.make_tensor(q.iterator, cute.select(q_layout, mode=[1, 3, 2, 0]))
        mO, mLSE = output_views(o.iterator, lse.iterator, batch, heads, seq_len, head_dim)
        mQS = block_scale_views(s.iterator, batch, heads, padded, kv_heads, padded)[0]
        mQ, mO, mLSE, mQS = packed_views(mQ, mO, mLSE, mQS, group, kv_heads)
        for b in cutlass.range(batch, unroll=1):
            for k in cutlass.range(kv_heads, unroll=1):
                for m in cutlass.range(m_blocks, unroll=1):
                    # The producer's and the epilogue's tiles of (batch, KV head, query block).
                    gQ = cute.local_tile(mQ[None, None, k, b], (block_m, head_dim), (m, 0))
                    gO = cute.local_tile(mO[b, None, k, None], (block_m, head_dim), (m, 0))
                    for r in cutlass.range(block_m, unroll=1):
                        p = m * block_m + r
                        rec[b, k, m, r, 0] = gQ[r, 1]
                        rec[b, k, m, r, 3] = mQS[b, k, p]
                        if p < seq_len * group:
                            rec[b, k, m, r, 1] = gO[r, 3]
                            rec[b, k, m, r, 2] = mLSE[b, k, p]

    args = [from_dlpack(t) for t in (out, q_mem, o_mem, lse_mem, s_mem)]
    ints = [cutlass.Int32(v) for v in (batch, heads, kv_heads, seq_len, padded)]
    cute.compile(reads, *args, *ints, options="--gpu-arch=sm_90a")(*args, *ints)
    return out


@pytest.mark.compile
@pytest.mark.parametrize(("batch", "heads", "kv_heads", "seq_len", "head_dim", "block_m"),
                         [(2, 8, 2, 77, 128, 128), (1, 16, 2, 5, 64, 64),
                          (2, 4, 2, 1, 64, 192), (1, 8, 4, 130, 128, 64)])
def test_packed_views_put_each_row_at_its_token_and_head(batch, heads, kv_heads, seq_len,
                                                         head_dim, block_m):
    group = heads // kv_heads
    padded = -(-seq_len // block_m) * block_m
    got = _view_reads(batch, heads, kv_heads, seq_len, padded, head_dim, block_m)
    rows = set()
    for b, k, m, r in itertools.product(range(batch), range(kv_heads), range(got.shape[2]),
                                        range(block_m)):
        p = m * block_m + r
        token, head = query_token(p, group), packed_head(p, k, group)
        assert k * group <= head < (k + 1) * group
        q, o, lse, scale = got[b, k, m, r].tolist()
        if token < padded:
            assert q == ((b * padded + token) * heads + head) * head_dim + 1
            assert scale == (b * heads + head) * padded + token
        if p < seq_len * group:
            assert o == ((b * seq_len + token) * heads + head) * head_dim + 3
            assert lse == (b * heads + head) * seq_len + token
            rows.add((b, head, token))
        else:
            assert (o, lse) == (-1, -1)
    assert rows == set(itertools.product(range(batch), range(heads), range(seq_len)))
