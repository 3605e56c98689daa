"""The mma_sync kernel's layouts, copies and MMA atoms: the swizzled shared-memory tiles (the
`swizzle` knob), cp.async and ldmatrix copies, the m16n8k32 tiled MMAs (fp8, mxf8, the f16
accumulate of pv_accum=fp16), and where each P value goes (register P slots, the P store
views). tests/test_mma_sync_layouts.py replays the P paths address by address on the CPU."""

from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import cpasync, warp


def register_p_slots(m_tiles: int, block_n: int) -> list[int]:
    """A-fragment slot (in 16-bit pairs) of each C-order pair of P, for register P.

    The C fragment holds, per m16 tile m and n8 tile nt, key pairs (2t, 2t+1) of rows g and g+8
    (row half r); the A fragment of m16n8k32 wants, per k-block, bytes e + 4r + 8h of keys
    4t + e + 16h. Putting the pair of n-tile nt at e = 2 * (nt % 2), h = (nt // 2) % 2 of
    k-block nt // 4 makes slot 4t + e of each 16-key group hold key 8 * (e // 2) + 2t + e % 2:
    prepare.register_p_key_order, the order V's keys are stored in.
    """
    slots = []
    for nt in range(block_n // 8):
        for m in range(m_tiles):
            for r in range(2):
                slots.append((nt % 2) + 2 * r + 4 * ((nt // 2) % 2) + 8 * m
                             + 8 * m_tiles * (nt // 4))
    return slots


class LayoutsMixin:
    """MmaSyncAttention's layout and copy helpers (it provides the knobs read here)."""

    def _smem_layout(self, rows: int, row_elems: int, stages: int | None):
        """K-major fp8 tile of `rows` x `row_elems`, swizzled per the `swizzle` knob."""
        atom_cols = min(row_elems, 128)
        chunk_bytes = 16
        bits = min(int(math.log2(atom_cols // chunk_bytes)), 3)
        # bank_period: XOR source at bit 7 (128 B); chunk_elems: log2(16 fp8 a chunk) = 4.
        shift = int(math.log2(128 // chunk_bytes)) if self.bank_period else int(math.log2(16))
        atom = cute.make_composed_layout(
            cute.make_swizzle(bits, int(math.log2(chunk_bytes)), shift),
            0,
            cute.make_layout((8, atom_cols), stride=(atom_cols, 1)),
        )
        if stages is None:
            return cute.tile_to_shape(atom, (rows, row_elems), (0, 1))
        return cute.tile_to_shape(atom, (rows, row_elems, stages), (0, 1, 2))

    def _g2s_copy(self, row_elems: int):
        """cp.async, 16 bytes a thread, threads laid along whole rows."""
        atom = cute.make_copy_atom(
            cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL),
            cutlass.Float8E4M3FN,
            num_bits_per_copy=128,
        )
        per_row = row_elems // 16
        return cute.make_tiled_copy_tv(
            atom,
            cute.make_layout((self.threads // per_row, per_row), stride=(per_row, 1)),
            cute.make_layout((1, 16)),
        )

    def _tiled_mma(self):
        return cute.make_tiled_mma(
            self._mma_op(),
            (self.cfg.warps, 1, 1),
            permutation_mnk=(self.cfg.warps * 16, 16, 32),
        )

    def _ldsm(self):
        return cute.make_copy_atom(
            warp.LdMatrix8x16x8bOp(transpose=False, num_matrices=4), cutlass.Float8E4M3FN)

    def _p_load_partition(self, tiled_mma, tidx, sP):
        """ldmatrix (A layout) read of P: the thread's copy slice and its source partition."""
        s2r_P = cute.make_tiled_copy_A(self._ldsm(), tiled_mma).get_slice(tidx)
        return s2r_P, s2r_P.partition_S(sP)

    def _p_store_views(self, thr_mma, sP, sP_layout):
        """P store path: a function (mt_i, r, n) -> the 2-byte smem view of C-fragment key pair
        ((None, r), mt_i, n) of this thread.

        NOT thr_mma.partition_C(sP)[(None, r), mt_i, n]: CuTe DSL 4.8.1 slices that partition
        wrongly when the swizzle cannot be folded into per-thread strides, as under chunk_elems
        (XOR source at bit 8, so the row half r and the n8 tile both feed the XOR). The sliced
        view keeps only the low bits of the thread's offset and drops the swizzled part (the
        n8 tile, the row half, the swizzle): all pairs of a thread land on one address and
        ptxas keeps a single st.shared.b16. Here a pair's byte offset is the swizzled layout
        applied to its logical (row, key) coordinate, as the ldmatrix read path computes it.
        A pair stays adjacent: the swizzle moves 16-byte chunks and the pair's first key is
        even. tests/test_mma_sync_layouts.py checks both paths address by address.
        """
        tPcP = thr_mma.partition_C(cute.make_identity_tensor((self.block_m, self.block_n)))

        def view(mt_i, r, n):
            offset = cute.assume(cute.crd2idx(tPcP[(0, r), mt_i, n], sP_layout), divby=2)
            return cute.make_tensor(sP.iterator + offset, cute.make_layout(2))

        return view

    def _mma_op(self):
        if cutlass.const_expr(self.mxf8):
            return warp.MmaMXF8Op(cutlass.Float8E4M3FN, cutlass.Float32, cutlass.Float8E8M0FNU)
        return warp.MmaFP8Op(cutlass.Float8E4M3FN, cutlass.Float32, (16, 8, 32))

    def _tiled_mma_pv16(self):
        """P @ V with f16 accumulate (pv_accum=fp16): the same thread and value layout as
        _tiled_mma, so its A/B fragments are the ones partitioned there (the C fragment of an
        m16n8 f16 accumulator holds the same 4 elements a thread, as halves)."""
        return cute.make_tiled_mma(
            warp.MmaFP8Op(cutlass.Float8E4M3FN, cutlass.Float16, (16, 8, 32)),
            (self.cfg.warps, 1, 1),
            permutation_mnk=(self.cfg.warps * 16, 16, 32),
        )
