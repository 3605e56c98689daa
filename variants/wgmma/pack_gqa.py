"""pack_gqa: the query heads that share a KV head packed into the rows of one tile.

With group = heads // kv_heads query heads per KV head, a tile of the (query block, KV head,
batch) grid holds block_m packed rows, and packed row p (of a KV head's seq_len * group) is
token p // group of query head kv_head * group + p % group (FA3's layout): the group's heads of
one token are adjacent rows, so a causal tile's rows span block_m // group tokens and its
diagonal stays as short as an unpacked tile's of that many rows. Each tile loads its K and V
strips once for the whole group instead of once per query head.

Q, O, LSE and Q's block scales are laid out (batch, seq, heads, ...) or (batch, heads, seq), and
the group's heads of one token lie at a fixed stride apart, so each becomes a view whose row
mode is (group, seq) with strides (head stride, token stride) and whose head mode counts KV
heads (`pack_heads`): the kernel indexes a packed row where it indexed a row, TMA loads a Q tile
as one box of (head_dim, group, block_m // group), and the epilogue stores O and LSE through
the same views. Only the causal mask needs the token of a row (masking.query_token, row // group).

group is a compile-time constant of the build (the TMA box and the epilogue's partition depend on
it); config.can_implement requires a power of two dividing block_m: the tile then holds whole
tokens, and the accumulator's row steps (8 rows) split evenly over (group, tokens).
tests/test_wgmma_tiles.py replays the views on the CPU.
"""

from __future__ import annotations

import cutlass.cute as cute

from variants.common.masking import query_token

__all__ = ["pack_heads", "packed_head", "packed_views", "query_token"]


def pack_heads(t, rows_mode: int, head_mode: int, group: int, kv_heads):
    """The view of tensor `t` with mode rows_mode (tokens) replaced by (group, tokens) and mode
    head_mode (query heads) by the KV heads: packed row p of KV head k is token p // group of
    query head k * group + p % group."""
    shape, stride = list(t.shape), list(t.stride)
    shape[rows_mode] = (group, t.shape[rows_mode])
    stride[rows_mode] = (t.stride[head_mode], t.stride[rows_mode])
    shape[head_mode] = kv_heads
    stride[head_mode] = t.stride[head_mode] * group
    return cute.make_tensor(t.iterator, cute.make_layout(tuple(shape), stride=tuple(stride)))


def packed_views(mQ, mO, mLSE, mQScales, group: int, kv_heads) -> tuple:
    """The kernel's views of Q (seq, head_dim, heads, batch), O (batch, seq, heads, head_dim),
    LSE and Q's scales (batch, heads, seq), packed (pack_heads)."""
    return (pack_heads(mQ, 0, 2, group, kv_heads), pack_heads(mO, 1, 2, group, kv_heads),
            pack_heads(mLSE, 2, 1, group, kv_heads), pack_heads(mQScales, 2, 1, group, kv_heads))


def packed_head(row, kv_head, group: int):
    """The query head of packed row `row` of KV head kv_head."""
    return kv_head * group + row % group
