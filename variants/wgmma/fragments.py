"""Register views of the wgmma accumulators: by (row, column) for the softmax and the
epilogue, and P's accumulator registers as the A fragment of the PV wgmma (P from registers).
Layout algebra only: no instruction is issued here."""

from __future__ import annotations

import cutlass.cute as cute


def acc_mn_layout(acc_layout):
    """wgmma C partition ((2, 2, N/8), MMA_M, MMA_N) -> rows (2, MMA_M) x cols (2, (N/8, MMA_N)).

    The per-thread value mode is (column pair e, row half i, 8-column block j).
    """
    flat = cute.make_layout(acc_layout.shape)
    shape = ((flat.shape[0][1], flat.shape[1]),
             (flat.shape[0][0], (flat.shape[0][2], flat.shape[2])))
    stride = ((flat.stride[0][1], flat.stride[1]),
              (flat.stride[0][0], (flat.stride[0][2], flat.stride[2])))
    return cute.composition(acc_layout, cute.make_layout(shape, stride=stride))


def acc_mn(acc):
    """The accumulator (or its coordinates, or its global tile) indexed by (row, column)."""
    return cute.make_tensor(acc.iterator, acc_mn_layout(acc.layout))


def p_views(acc_S, tOrP, block_n: int):
    """acc_S (f32, C order) and tOrP (e4m3, A order) as (b0, b1, row half, k half, k-block).

    C register 4j + 2i + e holds (row half i, key 8j + 2t + e); A register 4*(2h + i) + b
    holds slot 16h + 4t + b, which in register_p_key_order is key 16h + 8(b//2) + 2t + b%2,
    i.e. C value j = 2h + b//2 (+ 4 per k-block), e = b % 2: swap modes b1 and i.
    tests/test_wgmma_config.py checks these strides against the PTX ISA's fragment layouts.
    """
    k_blocks = block_n // 32
    shape = (2, 2, 2, 2, k_blocks)
    c_view = cute.make_tensor(
        acc_S.iterator, cute.make_layout(shape, stride=(1, 4, 2, 8, 16)))
    a_view = cute.make_tensor(
        tOrP.iterator, cute.make_layout(shape, stride=(1, 2, 4, 8, 16)))
    return c_view, a_view
