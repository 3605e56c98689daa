"""The mask of one tile, as both families apply it: which strips of keys need one, and setting
the scores of the keys a row does not see to -inf (the rule is masking.py's).

A strip needs the mask when it holds the ragged end of the keys (past seq_len_kv) or, with a
causal mask, when it crosses the diagonal (from the tile's first_masked strip on); every other
strip is visible to every row of the tile and skips it. The accumulator's coordinates (tScS:
(row, key) of each of the thread's S values) come from the family's MMA partition.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import cutlass
import cutlass.cute as cute

from variants.common.masking import (
    first_masked_strip,
    key_hidden,
    query_token,
    strip_needs_mask,
)


@dataclass(frozen=True)
class AttentionMask:
    row_base: Any  # the tile's first row (with packed query heads a packed row: query_token)
    first_masked: Any  # the first strip some row of the tile does not see all of
    n_total: Any  # strips of block_n keys in the whole key length
    ragged: Any  # seq_len_kv is no multiple of block_n
    seq_len_kv: Any
    offset: Any  # causal diagonal: row r sees keys <= r + offset
    tScS: Any  # the (row, key) coordinate of each of the thread's S accumulator values
    block_n: int
    causal: bool
    group: int = 1  # query heads packed into the tile's rows (1: a row is a token)

    @staticmethod
    def for_tile(row_base, n_total, ragged, seq_len_kv, offset, tScS, block_n: int,
                 causal: bool, group: int = 1) -> AttentionMask:
        first_masked = first_masked_strip(query_token(row_base, group), block_n, offset)
        return AttentionMask(row_base, first_masked, n_total, ragged, seq_len_kv, offset, tScS,
                             block_n, causal, group)

    def needs_mask(self, strip):
        """The ragged last strip, and with a causal mask the diagonal's strips."""
        return strip_needs_mask(strip, self.n_total, self.ragged, self.first_masked, self.causal)

    def on_diagonal(self, strip):
        """Causal: the strip crosses the diagonal (where the ragged strip is known to be
        visited apart, the only strips that need the mask)."""
        return strip >= self.first_masked

    @cute.jit
    def apply(self, acc_S, strip):
        """Scores of keys the row does not see (past seq_len_kv, or causal: above the
        diagonal) to -inf."""
        key_base = strip * self.block_n
        tScS = self.tScS
        for i in cutlass.range_constexpr(cute.size(acc_S)):
            row = query_token(self.row_base + tScS[i][0], self.group)
            if key_hidden(key_base + tScS[i][1], row, self.seq_len_kv, self.offset, self.causal):
                acc_S[i] = -cutlass.Float32.inf
