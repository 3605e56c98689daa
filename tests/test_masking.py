"""variants/common/masking.py, the masks both families apply, against a dense mask built here
independently (torch.tril with the bottom-right diagonal, as FlashAttention aligns it)."""

import pytest
import torch

from variants.common.masking import (
    causal_offset,
    first_masked_strip,
    key_hidden,
    strip_needs_mask,
    strips_needed,
)


def dense_visible(seq_q: int, seq_kv: int, causal: bool) -> torch.Tensor:
    """(seq_q, seq_kv) bool: row r sees key j."""
    seen = torch.ones(seq_q, seq_kv, dtype=torch.bool)
    if causal:
        seen = torch.tril(seen, diagonal=seq_kv - seq_q)
    return seen


LENGTHS = [(1, 1), (1, 77), (77, 1), (130, 130), (200, 64), (64, 200), (333, 1000),
           (1000, 333), (256, 256), (129, 511)]


@pytest.mark.parametrize(("seq_q", "seq_kv"), LENGTHS)
@pytest.mark.parametrize(("block_m", "block_n"), [(64, 32), (128, 128), (192, 64), (128, 256)])
@pytest.mark.parametrize("causal", [False, True])
def test_tiles_visit_every_visible_key_and_mask_every_hidden_one(seq_q, seq_kv, block_m,
                                                                 block_n, causal):
    seen = dense_visible(seq_q, seq_kv, causal)
    offset = causal_offset(seq_q, seq_kv)
    strips = -(-seq_kv // block_n)
    ragged = seq_kv % block_n != 0
    for m_block in range(-(-seq_q // block_m)):
        row0 = m_block * block_m
        rows = seen[row0:row0 + block_m]
        n = strips_needed(row0, block_m, block_n, strips, offset, causal)
        assert 1 <= n <= strips
        # No visible key lies in a strip the tile skips.
        assert not rows[:, n * block_n:].any()
        first = first_masked_strip(row0, block_n, offset)
        for strip in range(n):
            keys = slice(strip * block_n, (strip + 1) * block_n)
            block = rows[:, keys]
            full = block.all() and (strip + 1) * block_n <= seq_kv
            masked = strip_needs_mask(strip, strips, ragged, first, causal)
            # A strip some row does not fully see is masked (unmasked ones are fully visible).
            assert masked or full, (m_block, strip)
            # Elementwise, as the kernels apply it (here on tensors of rows and keys).
            row = torch.arange(row0, row0 + block.shape[0])[:, None]
            key = torch.arange(strip * block_n, (strip + 1) * block_n)[None, :]
            want = torch.zeros(block.shape[0], block_n, dtype=torch.bool)
            want[:, :block.shape[1]] = block
            hidden = key_hidden(key, row, seq_kv, offset, causal).expand(want.shape)
            assert torch.equal(hidden, ~want)


def test_rows_above_the_diagonal_see_nothing_when_queries_outnumber_keys():
    """Sq > Skv causal: the first Sq - Skv rows see no key (their output is 0, LSE -inf)."""
    seen = dense_visible(10, 4, True)
    assert not seen[:6].any() and seen[6:].any(dim=1).all()
    assert all(key_hidden(j, r, 4, causal_offset(10, 4), True)
               for r in range(6) for j in range(4))
