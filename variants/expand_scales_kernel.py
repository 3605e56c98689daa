"""ExpandScales: the packed block scales (variants/block_scales.py) from the FP8 entry point's
descales, one thread per value, in one launch; and `put`, the one-value fp32 store the
quantization kernels share."""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute

from variants.block_scales import DESCALE_PER_AMAX, KV_BLOCK, TINY_AMAX
from variants.launch import STREAM, pointer, scalar

EXPAND_THREADS = 256


class ExpandScales:
    """The packed block scales from a caller's descales (the FP8 entry point's), one thread per
    value: q's descale of every row below seq_len (1 past it); per 64-key block below
    seq_len_kv k's, log2 of v's, 1 / v's and v's (1, 0, 1, 1 past it). Each descale tensor is
    read through its own (batch, row or block, head) strides, so one kernel serves per-head
    descales (row and block stride 0: a broadcast costs no copy) and per-token / per-block
    ones alike. A descale below an all-zero block's (TINY_AMAX / 448, 0 included) is raised to
    it, as the quantization's own amax clamp does."""

    def slots(self):
        f32 = pointer("Float32", 4)
        return (f32, f32, f32, f32, *(scalar("Int32"),) * 16, STREAM)

    def compile_args(self):
        from cutlass.cute.runtime import make_fake_stream, make_ptr

        f32 = make_ptr(cutlass.Float32, 0, cute.AddressSpace.gmem, assumed_align=4)
        return (f32, f32, f32, f32, *(cutlass.Int32(1),) * 16, make_fake_stream())

    @cute.jit
    def __call__(self, dq_ptr: cute.Pointer, dk_ptr: cute.Pointer, dv_ptr: cute.Pointer,
                 scales_ptr: cute.Pointer, batch: cutlass.Int32, heads: cutlass.Int32,
                 kv_heads: cutlass.Int32, seq_len: cutlass.Int32, padded: cutlass.Int32,
                 seq_len_kv: cutlass.Int32, padded_kv: cutlass.Int32, q_sb: cutlass.Int32,
                 q_sr: cutlass.Int32, q_sh: cutlass.Int32, k_sb: cutlass.Int32,
                 k_sr: cutlass.Int32, k_sh: cutlass.Int32, v_sb: cutlass.Int32,
                 v_sr: cutlass.Int32, v_sh: cutlass.Int32, stream: cuda.CUstream):
        blocks = (padded_kv + KV_BLOCK - 1) // KV_BLOCK
        total = batch * heads * padded + 4 * batch * kv_heads * blocks
        self.kernel(dq_ptr, dk_ptr, dv_ptr, scales_ptr, batch, heads, kv_heads, seq_len, padded,
                    seq_len_kv, blocks, q_sb, q_sr, q_sh, k_sb, k_sr, k_sh, v_sb, v_sr, v_sh,
                    total).launch(
            grid=[(total + EXPAND_THREADS - 1) // EXPAND_THREADS, 1, 1],
            block=[EXPAND_THREADS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, dq_ptr: cute.Pointer, dk_ptr: cute.Pointer, dv_ptr: cute.Pointer,
               scales_ptr: cute.Pointer, batch: cutlass.Int32, heads: cutlass.Int32,
               kv_heads: cutlass.Int32, seq_len: cutlass.Int32, padded: cutlass.Int32,
               seq_len_kv: cutlass.Int32, blocks: cutlass.Int32, q_sb: cutlass.Int32,
               q_sr: cutlass.Int32, q_sh: cutlass.Int32, k_sb: cutlass.Int32,
               k_sr: cutlass.Int32, k_sh: cutlass.Int32, v_sb: cutlass.Int32,
               v_sr: cutlass.Int32, v_sh: cutlass.Int32, total: cutlass.Int32):
        bidx, _, _ = cute.arch.block_idx()
        tidx, _, _ = cute.arch.thread_idx()
        index = bidx * EXPAND_THREADS + tidx
        q_size = batch * heads * padded
        kv_size = batch * kv_heads * blocks
        if index < q_size:
            bh = index // padded
            row = index % padded
            value = cutlass.Float32(1.0)
            if row < seq_len:
                value = at_least_tiny(
                    dq_ptr[(bh // heads) * q_sb + row * q_sr + (bh % heads) * q_sh])
            put(scales_ptr + index, value)
        elif index < total:
            rest = index - q_size
            part = rest // kv_size  # 0: k, 1: log2 v, 2: 1 / v, 3: v
            at = rest % kv_size
            bh = at // blocks
            block = at % blocks
            b, h = bh // kv_heads, bh % kv_heads
            value = cutlass.Float32(1.0)
            if block * KV_BLOCK < seq_len_kv:
                if part == 0:
                    value = at_least_tiny(dk_ptr[b * k_sb + block * k_sr + h * k_sh])
                else:
                    value = at_least_tiny(dv_ptr[b * v_sb + block * v_sr + h * v_sh])
                    if part == 1:
                        value = cute.math.log2(value, fastmath=False)
                    elif part == 2:
                        value = 1.0 / value
            elif part == 1:
                value = cutlass.Float32(0.0)
            put(scales_ptr + index, value)


@cute.jit
def at_least_tiny(descale):
    """A caller's descale, at least the one of an all-zero block (TINY_AMAX / 448), NaN kept:
    a descale of 0 would put 0 * inf (1 / sv) or -inf * 0 (a masked score times a zero
    coefficient) into the softmax, NaN where all-zero inputs mean an output of 0."""
    return cute.arch.fmax(descale, TINY_AMAX * DESCALE_PER_AMAX, nan=True)


@cute.jit
def put(ptr, value):
    """One fp32 store at a global address."""
    dst = cute.make_tensor(ptr, cute.make_layout(1))
    dst[0] = value
