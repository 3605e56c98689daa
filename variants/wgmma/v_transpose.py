"""v_layout=kernel: the producer warpgroup's copy of each V strip from the staging ring (laid
out like K) into the K-major V ring the PV wgmma reads, as a mixin of WgmmaAttention (the
algorithm is in docs/family-wgmma.md; tests/test_wgmma_v_transpose.py replays its addresses on
the CPU)."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline

from variants.wgmma.ptx import _ldmatrix_x4_trans, _stmatrix_x4

# Warps 1..3 of the producer warpgroup transpose V (warp 0 issues the TMA loads).
TRANSPOSE_WARPS = 3
# prmt.b32 selectors (_pair_to_words): bytes 0, 2 of A then 0, 2 of B; bytes 1, 3 of each.
TRANSPOSE_PRMT = (0x6420, 0x7531)


class VTransposeMixin:
    """The transposing warps' methods; the class using it provides block_n, head_dim,
    stages and register_p."""

    @cute.jit
    def transpose_v(self, sVraw, sV, pipe_vload, pipe_v, ttid, scheduler):
        """Warps 1-3 of the producer warpgroup: every V strip the loader put in the staging
        ring, (block_n keys, head_dim) as in memory, is written into the V ring K-major
        (head_dim, block_n keys contiguous) for the PV wgmma, with the register-P key order
        applied on the way when P comes from registers. Strips in the loader's order."""
        raw_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        v_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        lane = cutlass.Uint32(ttid) % 32
        # Warp-uniform for the compiler too: the ldmatrix/stmatrix under `if` are .sync.aligned.
        warp = cutlass.Uint32(cute.arch.make_warp_uniform(ttid // 32))
        lane_offsets = self._lane_offsets(lane)
        item = scheduler.bid
        while item < scheduler.n_items:
            work = scheduler.work(item)  # as many strips as the loader's
            for _ in cutlass.range(work.hi - work.lo, unroll=1):
                pipe_vload.consumer_wait(raw_state)
                pipe_v.producer_acquire(v_state)
                self._transpose_strip(sVraw, sV, raw_state.index, v_state.index, warp, lane,
                                      lane_offsets)
                # Generic-proxy smem writes must be visible to the async proxy (wgmma) reads.
                cute.arch.fence_view_async_shared()
                pipe_v.producer_commit(v_state)
                # consumer_release arrives from lane 0 only: every lane's reads of the staging
                # slot must be done before it (FA3 syncs its producer warpgroup at this point).
                cute.arch.sync_warp()
                pipe_vload.consumer_release(raw_state)
                raw_state.advance()
                v_state.advance()
            item += scheduler.grid

    @cute.jit
    def _transpose_strip(self, src, dst, raw_stage, v_stage, warp, lane, lane_offsets):
        """One strip, 16 keys x 32 features per warp step: one ldmatrix.x4.trans (four 8x8
        b16 tiles: 8 keys x 16 feature bytes each), 4 byte permutes, one stmatrix.x4 (four 8x8
        b16 tiles: 8 features x 16 slot bytes each). The .trans load hands each lane two keys x
        two features per tile; two tiles whose key rows are chosen in the slot order (A, B:
        `_ldmatrix_key`) then make, per feature, one word of 4 consecutive slots (TRANSPOSE_PRMT),
        which is the row fragment a plain stmatrix writes. Both tiles' row addresses are the
        lane's constant offsets moved by the step (_ldmatrix_offset, _stmatrix_offset): integer
        arithmetic on the swizzled offsets instead of crd2idx, whose generic layout algebra on
        runtime coordinates cost ~200 instructions per 4x4-byte step. The copy shares issue
        slots with the consumers, so its instruction count is the kernel's cost: RESULTS.md has
        the H200 timings of each version. tests/test_wgmma_v_transpose.py replays these
        addresses through models of the instructions against CuTe's layouts."""
        strip = self.block_n * self.head_dim
        src_base = src.iterator + raw_stage * strip
        dst_base = dst.iterator + v_stage * strip
        key_blocks = self.block_n // 16
        # Warp w takes key blocks w, w + 3, ..., each across all feature blocks (unrolled, so
        # the feature moves are immediates): every warp has key_blocks // 3, some one more.
        for i in cutlass.range(key_blocks // TRANSPOSE_WARPS, unroll=1):
            self._transpose_key_block(src_base, dst_base, self._warp_key_block(warp, i), lane,
                                      lane_offsets)
        if cutlass.const_expr(key_blocks % TRANSPOSE_WARPS != 0):
            last = self._warp_key_block(warp, key_blocks // TRANSPOSE_WARPS)
            if last < key_blocks:
                self._transpose_key_block(src_base, dst_base, last, lane, lane_offsets)

    @staticmethod
    def _warp_key_block(warp, i):
        """The i-th 16-key block of a strip that transposing warp `warp` copies."""
        return warp + i * TRANSPOSE_WARPS

    @property
    def _feature_blocks(self) -> int:
        """32-feature blocks of a V row: one ldmatrix.x4 / stmatrix.x4 pair each."""
        return self.head_dim // 32

    @cute.jit
    def _transpose_key_block(self, src_base, dst_base, kb, lane, lane_offsets):
        """16 keys x head_dim: one ldmatrix.x4.trans, 4 prmt, one stmatrix.x4 per 32 features."""
        load_row = self._ldmatrix_row(lane_offsets[0], kb)
        store_row = self._stmatrix_row(lane_offsets[1], kb)
        for fb in cutlass.range_constexpr(self._feature_blocks):
            tiles = _ldmatrix_x4_trans(src_base + self._ldmatrix_offset(load_row, fb))
            _stmatrix_x4(dst_base + self._stmatrix_offset(store_row, fb),
                         self._tiles_to_words(tiles, lane))

    @staticmethod
    def _tiles_to_words(tiles, lane, prmt=None):
        """The 4 ldmatrix tiles (pair 0: A, B; pair 1: A, B) -> the 4 stmatrix words of this
        lane: pair 0's two features, then pair 1's (_pair_to_words)."""
        return [w for pair in range(2) for w in
                VTransposeMixin._pair_to_words(tiles[2 * pair], tiles[2 * pair + 1], lane, prmt)]

    def _lane_offsets(self, lane):
        """The byte offsets this lane's ldmatrix and stmatrix row addresses have at step
        (kb, fb) = (0, 0); every other step moves them by _ldmatrix_offset/_stmatrix_offset."""
        tile, row = lane // 8, lane % 8
        load = self._staging_offset(self._ldmatrix_key(tile % 2, row), 16 * (tile // 2))
        # Tile t of the store takes word t of _tiles_to_words: row r is feature
        # 16 pair + 2 r + half, the halves swapped for rows 4-7 so that a tile's 8 rows are 8
        # distinct features mod 8, hence 8 distinct swizzled 16-byte chunks: a conflict-free
        # store (unswapped, rows r and r + 4 share banks).
        half = (tile % 2) ^ (row // 4)
        store = self._ring_offset(16 * (tile // 2) + 2 * row + half, 0)
        return load, store

    def _ldmatrix_row(self, lane_load, kb):
        """This lane's ldmatrix offset for key block kb, feature block 0: keys + 16 kb. The
        swizzle XORs the 16-byte chunk bits (4..) with bits 7.. of the offset; 16 kb keys add a
        multiple of 16 * head_dim >= 1024 bytes, above every swizzle source bit, so the move
        commutes with the swizzle."""
        return lane_load + kb * (16 * self.head_dim)

    def _ldmatrix_offset(self, load_row, fb):
        """... and for feature block fb: feature bytes + 32 fb. Bits 5-6 of the unswizzled
        offset are zero at fb = 0 (the feature is 0 or 16) and are no swizzle source bits, so
        the add is a XOR on the swizzled offset."""
        return load_row ^ (32 * fb)

    def _stmatrix_row(self, lane_store, kb):
        """This lane's stmatrix offset for key block kb, feature block 0: slots + 16 kb.
        Within the swizzle atom (`width` slots) the move sets chunk bits that are zero at
        slot 0 and feeds no swizzle source bit (those come from the feature row), so it is a
        XOR on the swizzled offset; across atoms an add of whole atom columns."""
        width = _swizzle_width(self.block_n)
        slot = 16 * kb
        return (lane_store ^ (slot % width)) + (slot // width) * (self.head_dim * width)

    def _stmatrix_offset(self, store_row, fb):
        """... and for feature block fb: features + 32 fb, a multiple of the swizzle period
        (8 rows of `width` bytes) down, so an add."""
        return store_row + fb * (32 * _swizzle_width(self.block_n))

    def _ldmatrix_key(self, side, row):
        """Key (within a 16-key block) of row `row` of tile A (side 0) or B (side 1). A .trans
        load gives lane 4r + q rows 2q, 2q + 1 of each tile; slots 4q .. 4q + 3 must hold
        A's two keys then B's two: with register P, keys 2q, 2q + 1, 8 + 2q, 9 + 2q
        (prepare.register_p_key_order); otherwise 4q .. 4q + 3."""
        if self.register_p:
            return 8 * side + row
        return 4 * (row // 2) + row % 2 + 2 * side

    def _staging_offset(self, key, feature):
        """Byte offset of V[key, feature] in a staging slot (block_n keys x head_dim, K's
        layout: one swizzle atom wide)."""
        return _swizzle(key * self.head_dim + feature, self.head_dim)

    def _ring_offset(self, feature, slot):
        """Byte offset of (feature, slot) in a V-ring slot (head_dim x block_n, keys
        contiguous). The swizzle atom is `width` bytes of slots x 8 features; atoms run down the
        features first, then along the slots."""
        width = _swizzle_width(self.block_n)
        linear = (slot // width) * (self.head_dim * width) + feature * width + slot % width
        return _swizzle(linear, self.block_n)

    @staticmethod
    def _pair_to_words(a, b, lane, prmt=None):
        """Tiles A and B as a .trans load leaves them in a lane: bytes (key a0: f, f + 1;
        key a1: f, f + 1), likewise for B. Returns the words of features f and f + 1, each
        holding keys a0, a1, b0, b1 (4 consecutive slots); in the other order in lanes 16-31
        (rows 4-7 of the stmatrix tiles, see _lane_offsets). `prmt` is PTX prmt.b32 (a host
        model in the CPU test)."""
        if prmt is None:
            def prmt(x, y, selector):
                return cutlass.Uint32(cute.arch.prmt(x, y, selector))
        swap = lane // 16
        step = TRANSPOSE_PRMT[1] - TRANSPOSE_PRMT[0]
        return (prmt(a, b, TRANSPOSE_PRMT[0] + step * swap),
                prmt(a, b, TRANSPOSE_PRMT[1] - step * swap))


def _swizzle_width(cols: int) -> int:
    """Bytes per row of the wgmma swizzle atom for an fp8 K-major tile `cols` wide: the widest
    of 128/64/32 dividing it, as sm90_utils.get_smem_layout_atom picks (16: no swizzle)."""
    return next((w for w in (128, 64, 32) if cols % w == 0), 16)


def _swizzle(offset, cols: int):
    """The byte offset `offset` of an fp8 K-major tile `cols` wide under its wgmma swizzle:
    Swizzle<B, 4, 3> (B = log2(width / 16)) XORs the B chunk-index bits (4 ..) with offset bits
    7 .. 7 + B - 1: the row within the 8-row atom for 128-byte rows, (row / 2) mod 4 for 64-byte
    rows, (row / 4) mod 2 for 32-byte rows."""
    width = _swizzle_width(cols)
    if width == 16:
        return offset
    mask = (width // 16 - 1) << 4
    return offset ^ ((offset >> 3) & mask)
