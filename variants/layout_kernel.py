"""The FP8 entry point's GPU work: e4m3 codes the caller quantized, copied into the layouts the
attention kernels read (no scale: e4m3 -> f32 -> e4m3 is exact), zero-padded past the length.

    token-major:    out[b, s, h, :] = x[b, s, h, :], zero for seq_len <= s < padded
    feature-major:  out[b, h, :, pos(s)] = x[b, s, h, :], pos(s) = s or, with permute_keys, its
                    slot in key_order.register_p_key_order (V for a kernel that reads it K-major)

A CTA owns one chunk of tokens_per_chunk rows of one (batch, head), heads fastest in the grid;
its warps read whole rows of head_dim features, 8 rows per thread unrolled. The feature-major copy
goes through shared memory so that every warp store fills whole 128-byte lines. (From bf16 inputs
prepare quantizes with variants/block_quantize_kernel.py instead, which writes the same layouts.)

One compiled function per (head_dim, layout, arch) and process, compiled on first use and then
only launched through variants/launch.py, on torch's current stream. Where it cannot compile,
prepare falls back to torch ops (compiled() is None).
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import torch

from variants.key_order import key_at_slot
from variants.launch import STREAM, FastLaunch, LauncherCache, device_arch, pointer, scalar

VEC = 8  # features per thread and row: 8 bytes of e4m3 in and out
THREADS = 256
ROWS_PER_THREAD = 8  # rows of a chunk each thread handles, unrolled: the loads in flight

LAUNCHERS = LauncherCache("fused layout kernel")  # (head_dim, arch, feature_major, permute_keys)


def tokens_per_chunk(head_dim: int) -> int:
    """Rows of one CTA: THREADS // (head_dim // VEC) rows per pass, ROWS_PER_THREAD passes."""
    return ROWS_PER_THREAD * THREADS // (head_dim // VEC)


class CodesLayout:
    """The copy for one head_dim and output layout; batch, lengths and heads are runtime."""

    def __init__(self, head_dim: int, feature_major: bool = False,
                 permute_keys: bool = False) -> None:
        self.head_dim = head_dim
        self.lanes = head_dim // VEC  # threads per row
        self.rows_per_pass = THREADS // self.lanes
        self.tokens = tokens_per_chunk(head_dim)
        self.feature_major = feature_major
        self.permute_keys = permute_keys

    def slots(self):
        return (pointer("Float8E4M3FN", VEC), pointer("Float8E4M3FN", VEC),
                *(scalar("Int32"),) * 4, STREAM)

    def compile_args(self):
        """Stand-ins for the launch arguments (only types and alignments reach codegen)."""
        from cutlass.cute.runtime import make_fake_stream, make_ptr

        gmem = cute.AddressSpace.gmem
        codes = make_ptr(cutlass.Float8E4M3FN, 0, gmem, assumed_align=VEC)
        return (codes, codes, *(cutlass.Int32(1),) * 4, make_fake_stream())

    @cute.jit
    def __call__(self, x_ptr: cute.Pointer, out_ptr: cute.Pointer, batch: cutlass.Int32,
                 seq_len: cutlass.Int32, padded: cutlass.Int32, heads: cutlass.Int32,
                 stream: cuda.CUstream):
        # The feature-major copy transposes a chunk through shared memory: head_dim rows of
        # tokens slots, each padded by 8 bytes against bank conflicts (the token-major copy
        # needs none; it gets a token allocation).
        tile_bytes = self.head_dim * self._pitch() if cutlass.const_expr(self.feature_major) \
            else 16

        @cute.struct
        class SharedStorage:
            tile: cute.struct.Align[cute.struct.MemRange[cutlass.Float8E4M3FN, tile_bytes], 16]

        chunks = (padded + self.tokens - 1) // self.tokens
        self.kernel(x_ptr, out_ptr, seq_len, padded, heads, SharedStorage).launch(
            grid=[batch * heads, chunks, 1], block=[THREADS, 1, 1],
            smem=SharedStorage.size_in_bytes(), stream=stream)

    def _pitch(self) -> int:
        return self.tokens + ROWS_PER_THREAD

    def _load_row(self, x_ptr, b, s, h, col, seq_len, heads):
        """x[b, s, h, col:col + 8] as fp32."""
        src = cute.make_tensor(x_ptr + ((b * seq_len + s) * heads + h) * self.head_dim + col,
                               cute.make_layout(VEC))
        return src.load().to(cutlass.Float32)

    @cute.kernel
    def kernel(self, x_ptr: cute.Pointer, out_ptr: cute.Pointer, seq_len: cutlass.Int32,
               padded: cutlass.Int32, heads: cutlass.Int32, SharedStorage: cutlass.Constexpr):
        bh, chunk, _ = cute.arch.block_idx()
        tidx, _, _ = cute.arch.thread_idx()
        b = bh // heads
        h = bh % heads
        row = tidx // self.lanes
        col = (tidx % self.lanes) * VEC
        scale = cutlass.Float32(1.0)  # codes as they are: e4m3 -> f32 -> e4m3 is exact
        smem = cutlass.memory.SmemAllocator()
        tile = smem.allocate(SharedStorage).tile.get_tensor(
            cute.make_layout(SharedStorage.size_in_bytes())).iterator
        if cutlass.const_expr(self.feature_major):
            self._cast_feature_major(x_ptr, out_ptr, tile, scale, b, h, bh, chunk, seq_len,
                                     padded, heads)
        else:
            self._cast_token_major(x_ptr, out_ptr, scale, b, h, row, col, chunk, seq_len,
                                   padded, heads)

    @cute.jit
    def _cast_token_major(self, x_ptr, out_ptr, scale, b, h, row, col, chunk, seq_len, padded,
                          heads):
        """out[b, s, h, col:col + 8] for the thread's ROWS_PER_THREAD rows of the chunk."""
        if chunk * self.tokens < padded:
            for i in cutlass.range_constexpr(ROWS_PER_THREAD):
                s = chunk * self.tokens + i * self.rows_per_pass + row
                if s < padded:
                    values = cute.full((VEC,), 0.0, cutlass.Float32)
                    if s < seq_len:
                        values = self._load_row(x_ptr, b, s, h, col, seq_len, heads) * scale
                    # f32 -> e4m3 is cvt.rn.satfinite: round to nearest even, +-448 past the
                    # range.
                    dst = cute.make_tensor(out_ptr + ((b * padded + s) * heads + h)
                                           * self.head_dim + col, cute.make_layout(VEC))
                    dst.store(values.to(cutlass.Float8E4M3FN))

    @cute.jit
    def _cast_feature_major(self, x_ptr, out_ptr, tile, scale, b, h, bh, chunk, seq_len, padded,
                            heads):
        """out[b, h, :, chunk's slots], transposed through shared memory. A thread reads the keys
        stored at ROWS_PER_THREAD consecutive slots (a whole row of features per group of lanes,
        as the token-major cast), transposes their 8 x 8 codes in registers and stores each
        feature's 8 slots into the tile (one 8-byte store); then the CTA writes the tile's rows
        out, consecutive lanes on consecutive 8-byte pieces of a row, so every warp store fills
        whole 128-byte lines (8-byte pieces straight from the registers left 16 bytes per row
        and warp, and ran at a third of the token-major cast's bandwidth on the H200). Needs
        padded % 8 == 0 (prepare checks it)."""
        tidx, _, _ = cute.arch.thread_idx()
        pitch = self._pitch()
        first = chunk * self.tokens
        local = (tidx // self.lanes) * ROWS_PER_THREAD  # this thread's first slot in the chunk
        col = (tidx % self.lanes) * VEC
        if first + local < padded:
            codes = cute.make_rmem_tensor((ROWS_PER_THREAD * VEC,), cutlass.Float8E4M3FN)
            for i in cutlass.range_constexpr(ROWS_PER_THREAD):
                key = first + local + i
                if cutlass.const_expr(self.permute_keys):
                    key = key_at_slot(first + local + i)
                values = cute.full((VEC,), 0.0, cutlass.Float32)
                if key < seq_len:
                    values = self._load_row(x_ptr, b, key, h, col, seq_len, heads) * scale
                row_codes = cute.make_rmem_tensor((VEC,), cutlass.Float8E4M3FN)
                row_codes.store(values.to(cutlass.Float8E4M3FN))
                for j in cutlass.range_constexpr(VEC):
                    codes[i * VEC + j] = row_codes[j]
            for j in cutlass.range_constexpr(VEC):
                feature = cute.make_rmem_tensor((ROWS_PER_THREAD,), cutlass.Float8E4M3FN)
                for i in cutlass.range_constexpr(ROWS_PER_THREAD):
                    feature[i] = codes[i * VEC + j]
                at = cute.assume((col + j) * pitch + local, divby=ROWS_PER_THREAD)
                cute.make_tensor(tile + at, cute.make_layout(ROWS_PER_THREAD)).store(
                    feature.load())
        cute.arch.sync_threads()
        pieces = self.tokens // ROWS_PER_THREAD  # 8-byte pieces of one tile row
        for r in cutlass.range_constexpr(self.head_dim * pieces // THREADS):
            piece = tidx + r * THREADS
            d = piece // pieces
            slot = (piece % pieces) * ROWS_PER_THREAD
            if first + slot < padded:
                src = cute.make_tensor(tile + cute.assume(d * pitch + slot, divby=ROWS_PER_THREAD),
                                       cute.make_layout(ROWS_PER_THREAD))
                # 8-byte aligned: slot and padded are multiples of 8.
                at = cute.assume((bh * self.head_dim + d) * padded + first + slot,
                                 divby=ROWS_PER_THREAD)
                cute.make_tensor(out_ptr + at, cute.make_layout(ROWS_PER_THREAD)).store(
                    src.load())


def compile_kernel(head_dim: int, arch: str, feature_major: bool = False,
                   permute_keys: bool = False, *, keep_ptx_in: str | None = None):
    """(compiled function, its launch slots) for `arch` (no GPU needed, like the attention
    kernels); keep_ptx_in: a directory to leave the PTX in (the CPU tests read it)."""
    from variants.dsl_compile import compile_for_arch

    kernel = CodesLayout(head_dim, feature_major, permute_keys)
    fn, _, _ = compile_for_arch(kernel, arch, kernel.compile_args(),
                                keep="--keep-ptx" if keep_ptx_in else "", dump_dir=keep_ptx_in)
    return fn, kernel.slots()


def compiled(head_dim: int, device: torch.device, *, feature_major: bool = False,
             permute_keys: bool = False, compile_now: bool = True) -> FastLaunch | None:
    """The launcher for this head_dim, layout and GPU, or None where there is none
    (variants/launch.LauncherCache: compiled on first use, a failure logged once)."""
    key = (head_dim, device_arch(device), feature_major, permute_keys)
    return LAUNCHERS.get(key, lambda: compile_kernel(*key), compile_now=compile_now)
