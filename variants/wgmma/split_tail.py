"""split_tail: the persistent grid's last wave split along the keys (stream-K for the tail).

A persistent grid of G CTAs deals T tiles with a static stride, so the last `tail = T mod G`
tiles run as a wave of their own on `tail` SMs while the rest idle: at B=2 S=4608 H=24 (1728
tiles of 128 rows on 132 SMs) that is 12 tiles in the fourteenth wave, 6.5% of the kernel. With
split_tail the first T - tail tiles run as whole waves in a launch of the program without
split_tail's code (ptxas schedules a main loop 1-3% slower beside the pieces' code on the H200).
A second launch, the pieces program, cuts the tail's work, `tail * strips` K/V strips, into G
equal runs of consecutive strips, one per CTA, where that saves more than the split costs
(split_tiles; where it does not, the host launches the split_tail=False build instead, one
launch: wgmma/build.py). A run is at most a tile long (tail < G), so it lies inside one tile or
crosses into the next: a CTA holds at most two pieces, each a range [lo, hi) of one tail tile's
strips. docs/family-wgmma.md has the measurements.

Each piece leaves its unnormalised O, row maximum m and row sum l (the online softmax's state,
log2 domain) in a workspace slot of its own, then adds its strip count to a counter per (tail
tile, consumer warp). The warp whose addition completes the tile's strip count merges every
piece's slot, in CTA order (so the output bits do not depend on which piece finished last),
and stores O and LSE: with m* = max m_i, O = sum 2^(m_i - m*) O_i / sum 2^(m_i - m*) l_i.
The whole tiles' program zeroes the counters (epilogue.zero_counters) before the pieces program
reads them, so launches never share state and the host zeroes nothing.

These are plain integer functions of Python ints or CuTe DSL integers (traced inline where the
kernel calls them), so tests/test_wgmma_split_tail.py checks the decomposition on the CPU. The
products stay in int32 up to G * tail * strips < 2^31 (132 SMs: 1.2e5 strips per tile, 4M keys).
"""

from __future__ import annotations

import cutlass

# A CTA's run of tail strips is at most one tile long, so it touches at most two tiles.
PIECES_PER_CTA = 2
# What a split tail costs beyond its pieces' strips, in strip times (one 128-key strip of one
# tile): the pieces program's launch, each piece's pipeline start and Q load, the partial O
# stores, fence and counter update, and the merge's reads. The split runs only where the strips
# it saves, strips * (1 - tail / grid) of the last tile's critical path, exceed this. Measured on
# the H200 (2026-12-03, the tail always split; docs/family-wgmma.md): a gain
# at 13.4 saved strips (S=4096 H=56: 76 of 132, 32 strips, 1.03x) and more, a loss at 9.6 and
# fewer (S=4096 H=40: 0.98x; S=1024 H=56: 0.90x; B=4 S=1024 H=32: 0.95x).
MIN_SAVED_STRIPS = 12


def tail_tiles(total_tiles, grid):
    """Tiles of the last, partial wave (0 when the tiles fill whole waves)."""
    return total_tiles % grid


def split_tiles(total_tiles, grid, strips):
    """The tail tiles split_tail splits: the last wave's when that saves more than
    MIN_SAVED_STRIPS strip times, strips * (grid - tail) > MIN_SAVED_STRIPS * grid, else none
    (the tail then runs as whole tiles). The host (workspace size) and the kernel decide alike."""
    tail = tail_tiles(total_tiles, grid)
    pays = cutlass.min(cutlass.max(strips * (grid - tail) - MIN_SAVED_STRIPS * grid, 0), 1)
    return tail * pays


def work_limit(total_tiles, grid, cta, strips):
    """The item bound of CTA `cta`'s loop in the pieces program (items cta, cta + grid, ...
    below it; item p * grid + cta is its piece p), none of them empty: piece 0 when its run is
    not empty, piece 1 when the run crosses into a second tile."""
    tail = split_tiles(total_tiles, grid, strips)
    start, end = run_bounds(cta, grid, tail * strips)
    # 0/1 by min/max, so that the same arithmetic runs on Python and DSL integers.
    first = cutlass.min(end - start, 1)
    second = cutlass.min(cutlass.max(end - (start // strips + 1) * strips, 0), 1)
    return grid * (first + second)


def tail_piece(j, grid, tail, strips):
    """(tail tile t, lo, hi) of tail item j: piece j // grid of CTA j % grid, the strips
    [lo, hi) of tail tile t (work_limit walks only the pieces that are not empty)."""
    start, end = run_bounds(j % grid, grid, tail * strips)
    t = start // strips + j // grid
    base = t * strips
    lo = cutlass.max(start, base) - base
    hi = cutlass.min(end, base + strips) - base
    return t, lo, hi


def run_bounds(cta, grid, units):
    """[start, end) of CTA `cta`'s run in the tail's strip units."""
    return cta * units // grid, (cta + 1) * units // grid


def unit_owner(unit, grid, units):
    """The CTA whose run holds tail strip unit `unit` (the last c with start_c <= unit; a CTA
    with an empty run never owns one)."""
    return ((unit + 1) * grid + units - 1) // units - 1


def slot(cta, piece):
    """The workspace slot a CTA's piece writes."""
    return PIECES_PER_CTA * cta + piece


def workspace_offsets(block_m, head_dim, grid):
    """(word offset of m and l, word offset of the counters) in the workspace of a grid: O
    (slots, block_m, head_dim) fp32 first (16-byte aligned for the vector stores), then m and l
    (slots, 2, block_m) fp32, then one int32 counter per (tail tile, consumer warp), grid of
    each (tail < grid). The kernel's views (runtime grid) and the host's size both read it."""
    slots = PIECES_PER_CTA * grid
    ml_at = slots * block_m * head_dim
    return ml_at, ml_at + slots * 2 * block_m


def workspace_words(block_m: int, head_dim: int, consumer_warps: int, grid: int) -> int:
    """4-byte words of the workspace of a grid (workspace_offsets lays it out)."""
    return workspace_offsets(block_m, head_dim, grid)[1] + grid * consumer_warps
