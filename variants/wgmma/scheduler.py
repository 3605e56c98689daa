"""Which work a CTA of the wgmma kernel does, and the state its loop carries from tile to tile.

A tile is (query block, head, batch), with pack_gqa (query block, KV head, batch) over packed
rows (pack_gqa.py); the config's tile_order and head_swizzle say in which order the tiles are
dealt (tiles.py), the grid's static stride deals them (persistent, or one tile a CTA), and a
causal tile visits only the strips of keys its rows' tokens see (common/masking.py). In
split_tail's pieces program an item is a run of the last wave's strips (split_tail.py).

TileScheduler and WorkTile are frozen dataclasses built inside the traced kernel, which the
loops only read: CuTe DSL carries no read-only frozen dataclass through a dynamic loop.
LoopState is what a loop does carry: a plain dataclass, whose fields CuTe DSL flattens in
declaration order into the loop's values. That order is the generated code's (the cubin
changes with it), so keep it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import cutlass
import cutlass.cute as cute

from variants.common.masking import strips_needed
from variants.wgmma.split_tail import split_tiles, tail_piece, work_limit
from variants.wgmma.tiles import tile_coords, tile_rows


@dataclass(frozen=True)
class WorkTile:
    """One item of a CTA's loop: its tile's query block, head, KV head and batch, the strips
    [lo, hi) it visits (from the last), and its split_tail tail tile (-1: a whole tile). With
    pack_gqa head is the KV head, whose query heads the tile's packed rows hold."""

    m_block: Any
    head: Any
    kv_head: Any
    batch: Any
    lo: Any
    hi: Any
    tail_tile: Any


@dataclass
class LoopState:
    """What a persistent loop carries: its item (bid, bid + grid, ...), then the position of
    the Q pipeline and of the K/V pipeline (read by consumers, written by the loader)."""

    item: Any
    q: Any
    kv: Any


@dataclass(frozen=True)
class TileScheduler:
    """The tiles of a launch and this CTA's items among them (n_items: the loop bound)."""

    m_blocks: Any
    heads: Any  # with pack_gqa the KV heads
    n_blocks: Any  # strips of block_n keys in the whole key length
    group: Any  # query heads per KV head
    offset: Any  # causal diagonal: row r sees keys <= r + offset (common/masking.py)
    heads_batch: Any
    total_tiles: Any
    bid: Any
    grid: Any
    n_items: Any
    block_m: int
    block_n: int
    causal: bool
    longest_first: bool
    pieces: bool  # split_tail's pieces program (else the whole tiles')
    packed: int  # query heads packed into a tile's rows (pack_gqa; 1: none)
    head_swizzle: int  # longest_first's section of (head, batch) pairs (tiles.py; 0: one)

    @staticmethod
    def create(kernel, m_blocks, heads, total_tiles, tile_limit, seq_len_kv, group, offset):
        """This CTA's scheduler in the program `kernel` traces: every tile, the whole waves'
        tiles below tile_limit (split_tail), or its pieces of the last wave's tiles."""
        bid, _, _ = cute.arch.block_idx()
        grid, _, _ = cute.arch.grid_dim()
        n_blocks = cute.ceil_div(seq_len_kv, kernel.block_n)
        heads_batch = total_tiles // m_blocks
        n_items = total_tiles
        if cutlass.const_expr(kernel.pieces):
            n_items = work_limit(total_tiles, grid, bid, n_blocks)
        elif cutlass.const_expr(kernel.split_tail):
            n_items = tile_limit
        return TileScheduler(m_blocks, heads, n_blocks, group, offset, heads_batch, total_tiles,
                             bid, grid, n_items, kernel.block_m, kernel.block_n, kernel.causal,
                             kernel.longest_first, kernel.pieces, kernel.group,
                             kernel.head_swizzle)

    @cute.jit
    def tile(self, tile: cutlass.Int32) -> WorkTile:
        """A whole tile with all the strips it visits."""
        m_block, rest = tile_coords(tile, self.m_blocks, self.heads_batch, self.longest_first,
                                    self.head_swizzle)
        head = rest % self.heads
        row_start, rows = tile_rows(m_block, self.block_m, self.packed)
        n_tile = strips_needed(row_start, rows, self.block_n, self.n_blocks, self.offset,
                               self.causal)
        kv_head = head
        if cutlass.const_expr(self.packed == 1):
            kv_head = head // self.group
        return WorkTile(m_block, head, kv_head, rest // self.heads, 0, n_tile, -1)

    @cute.jit
    def work(self, item) -> WorkTile:
        """Item `item` of this CTA's loop: a whole tile, or in the pieces program one piece
        of a tail tile (split_tail.tail_piece)."""
        if cutlass.const_expr(not self.pieces):
            return self.tile(item)
        tail = split_tiles(self.total_tiles, self.grid, self.n_blocks)
        t, lo, hi = tail_piece(item, self.grid, tail, self.n_blocks)
        tile = self.tile(self.total_tiles - tail + t)
        return WorkTile(tile.m_block, tile.head, tile.kv_head, tile.batch, lo, hi, t)
