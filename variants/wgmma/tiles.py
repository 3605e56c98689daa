"""Which (query block, head, batch) a tile index names, in each tile order of the wgmma kernel.

Tiles are numbered 0 .. m_blocks * heads_batch - 1, heads_batch = heads * batch (with pack_gqa
the heads are the KV heads, pack_gqa.py). The pair index hb = batch * heads + head.

- per_head: m_block fastest, one head's query blocks before the next head's.
- longest_first, head_swizzle 0: m_block slowest, from the last block down, hb fastest: the first
  tiles are the longest of every head (causal) and each persistent CTA's tiles fall in length.
- longest_first, head_swizzle k: the pairs cut into sections of k consecutive hb (the last one
  shorter where k does not divide heads_batch), a section's tiles before the next section's and,
  inside one, longest first over its k pairs: the CTAs in flight read the K/V of about k heads,
  which stay in L2 while the section runs (FA3's L2-swizzled LPT order).

Plain arithmetic on Python ints or CuTe DSL integers (traced inline by TileScheduler.tile), so
tests/test_wgmma_tiles.py replays it on the CPU against a brute-force enumeration.
"""

from __future__ import annotations

import cutlass


def tile_coords(tile, m_blocks, heads_batch, longest_first: bool, head_swizzle: int = 0):
    """(m_block, hb) of tile `tile`."""
    m_block = tile % m_blocks
    rest = tile // m_blocks
    if longest_first:
        if head_swizzle == 0:
            m_block = m_blocks - 1 - tile // heads_batch
            rest = tile % heads_batch
        else:
            per_section = head_swizzle * m_blocks
            first = tile // per_section * head_swizzle
            # The last section holds the pairs left over; min keeps it branch-free in the DSL.
            width = cutlass.min(heads_batch - first, head_swizzle)
            within = tile % per_section
            m_block = m_blocks - 1 - within // width
            rest = first + within % width
    return m_block, rest


def tile_rows(m_block, block_m: int, group: int):
    """(first query token, tokens) of query block m_block: block_m rows of one head, or with
    pack_gqa (group > 1) block_m // group tokens of each of the group's heads."""
    rows = block_m // group
    return m_block * rows, rows
