"""Which keys a query row sees, and which strips of keys a tile of rows needs: the one statement
of the masks both families apply (grouped KV heads need none: a query head reads KV head
head // group).

A query row r (0 <= r < seq_len_q) sees key j when j < seq_len_kv and, for a causal problem,
j <= r + offset with offset = seq_len_kv - seq_len_q: the diagonal aligned to the bottom right
when the lengths differ, as FlashAttention defines it (the last query row sees every key). A row
with r + offset < 0 (possible when seq_len_q > seq_len_kv) sees no key: its output is 0 and its
LSE -inf.

The functions are plain arithmetic on ints or CuTe DSL integers (traced inline where the kernels
call them), so tests/test_masking.py checks them on the CPU against a dense mask.
"""

from __future__ import annotations

import cutlass


def query_token(row, group: int):
    """The query token of tile row `row`: the row itself, or with the query heads of a KV group
    packed into the rows (wgmma's pack_gqa: row p is token p // group of head p % group of the
    group) row // group."""
    if group == 1:
        return row
    return row // group


def causal_offset(seq_len_q, seq_len_kv):
    """offset = seq_len_kv - seq_len_q: row r sees keys j <= r + offset."""
    return seq_len_kv - seq_len_q


def strips_needed(row_start, rows: int, block_n: int, strips, offset, causal: bool):
    """How many strips of block_n keys, from strip 0, the tile of rows [row_start, row_start +
    rows) must visit: all `strips` without a causal mask; with one, those holding a key its last
    row sees, and at least one (a tile whose rows see no key still runs one fully masked strip,
    which writes their output 0 and LSE -inf, instead of a special path)."""
    if not causal:
        return strips
    visible = cutlass.max(row_start + rows + offset, 1)  # keys the tile's last row sees
    return cutlass.min((visible + block_n - 1) // block_n, strips)


def first_masked_strip(row_start, block_n: int, offset):
    """The first strip with a key that some row of a tile starting at row_start does not see
    (causal): strips before it are visible to every row of the tile and need no mask."""
    return cutlass.max(row_start + offset + 1, 0) // block_n


def strip_needs_mask(strip, strips, ragged, first_masked, causal: bool):
    """Whether a strip needs a mask: the last strip of a ragged key length, and with a causal
    mask every strip from first_masked on."""
    last = strip == strips - 1
    if not causal:
        return ragged & last
    return (ragged & last) | (strip >= first_masked)


def key_hidden(key, row, seq_len_kv, offset, causal: bool):
    """Whether row `row` does not see key `key` (past the keys, or above the causal diagonal)."""
    if not causal:
        return key >= seq_len_kv
    return (key >= seq_len_kv) | (key > row + offset)
