"""prepare's GPU work with block scales (variants/block_scales.py): q, k and v quantized in one
launch, each byte of each input read once.

    q: per (token, head)    amax over head_dim     codes (batch, padded, heads, head_dim)
    k: per (64 keys, head)  amax over the block    codes (batch, padded_kv, kv_heads, head_dim)
    v: per (64 keys, head)  amax over the block    codes feature-major (batch, kv_heads, head_dim,
                                                   padded_kv), keys in register_p_key_order if
                                                   asked, or token-major like k

code = e4m3(x * fl(fl(1 / amax) * 448)), descale = amax * fl32(1 / 448), amax = max(amax, 1e-12),
a NaN kept: block_scales.quantize's arithmetic, so the codes are bit for bit the torch formula's.
With qk_int8 q's and k's codes are int8: round-half-even(x * fl(fl(1 / amax) * 127)) (within
+-127, so no clamp acts), descale = amax * fl32(1 / 127); v's stay e4m3.
Optional exact transforms first (variants/transforms.py, bit for bit): smooth_k, k's real rows
less m (fp32 (batch, kv_heads, head_dim)) and, with write_shift, q . m of each real q row to
`shift` (batch, heads, seq_len), which only a caller of the LSE reads (the dot is about a third
of both transforms' cost in this launch); rotate_qk, q's and k's rows rotated
(variants/hadamard_dsl.py). V is never transformed.

A CTA owns 64 rows (tokens, or stored key slots) of one (batch, head) of one input: the grid holds
q's CTAs, then k's, then v's, heads fastest. A thread loads its rows' features (16-byte loads, all
8 in flight before the first use: v and unrotated rows 8 rows of 8 features; rotated ones 8 / c
rows of c chunks, the row on 2 lanes), keeps them in registers, reduces the amax (q: across the
row's lanes; k, v: the CTA, through shared memory) and casts from the registers. V's feature-major
codes go through a shared tile (a thread's 8 x 8 codes transposed in registers). With smooth_k
the CTA copies m of its head to shared memory after its rows' loads, and threads read it a chunk
at a time, so that it holds no registers beside the rows. On sm_90 and later (pdl) the launch is
the programmatic dependent of K smoothing's mean launch (variants/key_mean_kernel.py): q's and
v's CTAs run beside it, and a CTA that reads m waits for it (griddepcontrol.wait) after issuing
its rows' loads.

The scales go to one fp32 buffer in the kernels' layout (abi.block_scale_views): q's descale
(batch, heads, padded), then per (batch, kv_heads, ceil(padded_kv / 64)) K's descale, log2 of
V's, 1 / V's and V's; padding rows and blocks get the neutral 1 (log2: 0). BlockQuant(quantize_q=
False) ("quant_kv") has no q CTAs, for a kernel that quantizes Q itself: q's part is unwritten.
BlockQuant(quantize_v=False) has no v CTAs, for a kernel that reads V unquantized (P.V in 16
bits): its k CTAs write V's neutral scales (log2 0, 1 / V's and V's 1) beside K's.
ExpandScales (variants/expand_scales_kernel.py) writes the buffer from the FP8 entry point's
descales, one thread per value.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import torch

from variants import hadamard_dsl
from variants.block_scales import (
    DESCALE_PER_AMAX,
    DESCALE_PER_AMAX_INT8,
    E4M3_MAX,
    INT8_MAX,
    KV_BLOCK,
    TINY_AMAX,
)
from variants.expand_scales_kernel import ExpandScales, put
from variants.key_mean_kernel import MEAN_ALIGN, KeyMean
from variants.key_order import key_at_slot
from variants.launch import STREAM, FastLaunch, LauncherCache, device_arch, pointer, scalar

VEC = 8  # features per thread and row: 16 bytes of bf16 in, 8 bytes of e4m3 out
ROWS = 8  # consecutive rows a thread owns: 8 loads in flight, and V's 8 x 8 transpose
GROUPS = KV_BLOCK // ROWS  # thread groups of a CTA: 64 rows, one K/V scale block
TILE_PITCH = KV_BLOCK + ROWS  # bytes per feature row of V's shared tile (+8: fewer conflicts)
# A rotated q or k row on 2 lanes: one butterfly stage crosses lanes (a shuffle and an fma per
# value), not log2(head_dim / 8), and each load instruction still reads whole 32-byte sectors.
ROTATED_LANES = 2
STRIDES = 9  # the launch's (batch, token, head) element strides of q, k and v
# e4m3 codes: (element type, fl32 descale per amax, code of amax); v's always, q's and k's unless
# qk_int8.
E4M3_CODES = (cutlass.Float8E4M3FN, DESCALE_PER_AMAX, E4M3_MAX)

LAUNCHERS = LauncherCache("block quantize kernel")


def _dsl_dtype(dtype: torch.dtype):
    return {torch.bfloat16: cutlass.BFloat16, torch.float16: cutlass.Float16}[dtype]


def scale_blocks(padded_kv: int) -> int:
    """64-key scale blocks of a padded key length."""
    return -(-padded_kv // KV_BLOCK)


def packed_size(batch: int, heads: int, padded: int, kv_heads: int, padded_kv: int) -> int:
    """fp32 values of the packed scales: q's rows, then four arrays of K/V blocks."""
    return batch * heads * padded + 4 * batch * kv_heads * scale_blocks(padded_kv)


class BlockQuant:
    """The one launch for one input dtype, head_dim, V layout and transform set; shapes are
    runtime. Arguments: q, k, v, their codes, the packed scales, m (16-byte aligned) and shift
    (m read only with smooth_k, shift written only with write_shift: pass 0 otherwise), batch,
    heads, kv_heads, seq_len, padded, seq_len_kv, padded_kv, stream. qk_int8: q's and k's codes
    int8. pdl (with smooth_k): launched as the programmatic dependent of the mean launch before
    it, sm_90 on."""

    def __init__(self, in_dtype, head_dim: int, v_feature_major: bool = True,
                 permute_keys: bool = False, quantize_q: bool = True, smooth_k: bool = False,
                 rotate_qk: bool = False, quantize_v: bool = True, qk_int8: bool = False,
                 write_shift: bool = True, pdl: bool = False) -> None:
        self.in_dtype = in_dtype
        self.qk_int8 = qk_int8
        # q's and k's codes: (element type, fl32 descale per amax, code of amax)
        self.qk_codes = (cutlass.Int8, DESCALE_PER_AMAX_INT8, INT8_MAX) if qk_int8 else E4M3_CODES
        self.quantize_q = quantize_q
        self.quantize_v = quantize_v
        self.head_dim = head_dim
        self.lanes = head_dim // VEC  # threads per row
        self.threads = GROUPS * self.lanes  # 128 at head_dim 128, 64 at 64
        self.v_feature_major = v_feature_major
        self.permute_keys = permute_keys
        self.smooth_k = smooth_k
        self.write_shift = smooth_k and quantize_q and write_shift
        self.rotate_qk = rotate_qk
        # After K smoothing's mean launch (sm_90 on): launched as its programmatic dependent, so
        # that q's and v's CTAs run beside it; the CTAs that read m wait for it first.
        self.pdl = pdl and smooth_k
        # q's and k's rows: `chunks` pieces of 8 features a thread (head_dim / 8 / chunks lanes).
        self.chunks = max(1, self.lanes // ROTATED_LANES) if rotate_qk else 1

    def mapping(self, is_v: bool) -> tuple[int, int, int]:
        """A thread's (rows, chunks of 8 features of each, lanes a row): V's 8 rows of one chunk
        (its 8 x 8 transpose), q's and k's 8 / chunks rows; a CTA's threads are the same."""
        chunks = 1 if is_v else self.chunks
        return ROWS // chunks, chunks, self.lanes // chunks

    def slots(self):
        x = pointer(self.in_dtype.__name__, VEC * self.in_dtype.width // 8)
        out, qk = pointer("Float8E4M3FN", VEC), pointer(self.qk_codes[0].__name__, VEC)
        return (x, x, x, qk, qk, out, pointer("Float32", 4), pointer("Float32", MEAN_ALIGN),
                pointer("Float32", 4), *(scalar("Int32"),) * (7 + STRIDES), STREAM)

    def compile_args(self):
        """Stand-ins for the launch arguments (only types and alignments reach codegen)."""
        from cutlass.cute.runtime import make_fake_stream, make_ptr

        gmem = cute.AddressSpace.gmem
        x = make_ptr(self.in_dtype, 0, gmem, assumed_align=VEC * self.in_dtype.width // 8)
        out = make_ptr(cutlass.Float8E4M3FN, 0, gmem, assumed_align=VEC)
        qk = make_ptr(self.qk_codes[0], 0, gmem, assumed_align=VEC)
        f32 = make_ptr(cutlass.Float32, 0, gmem, assumed_align=4)
        mean = make_ptr(cutlass.Float32, 0, gmem, assumed_align=MEAN_ALIGN)
        return (x, x, x, qk, qk, out, f32, mean, f32, *(cutlass.Int32(1),) * (7 + STRIDES),
                make_fake_stream())

    @cute.jit
    def __call__(self, q_ptr: cute.Pointer, k_ptr: cute.Pointer, v_ptr: cute.Pointer,
                 q8_ptr: cute.Pointer, k8_ptr: cute.Pointer, v8_ptr: cute.Pointer,
                 scales_ptr: cute.Pointer, mean_ptr: cute.Pointer, shift_ptr: cute.Pointer,
                 batch: cutlass.Int32, heads: cutlass.Int32, kv_heads: cutlass.Int32,
                 seq_len: cutlass.Int32, padded: cutlass.Int32, seq_len_kv: cutlass.Int32,
                 padded_kv: cutlass.Int32, q_sb: cutlass.Int32, q_ss: cutlass.Int32,
                 q_sh: cutlass.Int32, k_sb: cutlass.Int32, k_ss: cutlass.Int32,
                 k_sh: cutlass.Int32, v_sb: cutlass.Int32, v_ss: cutlass.Int32,
                 v_sh: cutlass.Int32, stream: cuda.CUstream):
        tile_bytes = self.head_dim * TILE_PITCH if cutlass.const_expr(self.v_feature_major) \
            else 16
        mean_floats = self.head_dim if cutlass.const_expr(self.smooth_k) else 4

        @cute.struct
        class SharedStorage:
            tile: cute.struct.Align[cute.struct.MemRange[cutlass.Float8E4M3FN, tile_bytes], 16]
            warp_max: cute.struct.Align[cute.struct.MemRange[cutlass.Float32, GROUPS], 16]
            mean: cute.struct.Align[cute.struct.MemRange[cutlass.Float32, mean_floats], 16]

        q_ctas = batch * heads * ((padded + KV_BLOCK - 1) // KV_BLOCK)
        if cutlass.const_expr(not self.quantize_q):
            q_ctas = 0
        kv_ctas = batch * kv_heads * ((padded_kv + KV_BLOCK - 1) // KV_BLOCK)
        grid = q_ctas + 2 * kv_ctas
        if cutlass.const_expr(not self.quantize_v):
            grid = q_ctas + kv_ctas
        self.kernel(q_ptr, k_ptr, v_ptr, q8_ptr, k8_ptr, v8_ptr, scales_ptr, mean_ptr, shift_ptr,
                    batch, heads, kv_heads, seq_len, padded, seq_len_kv, padded_kv, q_ctas,
                    kv_ctas, q_sb, q_ss, q_sh, k_sb, k_ss, k_sh, v_sb, v_ss, v_sh,
                    SharedStorage).launch(
            grid=[grid, 1, 1], block=[self.threads, 1, 1],
            smem=SharedStorage.size_in_bytes(), stream=stream, use_pdl=self.pdl)

    @cute.kernel
    def kernel(self, q_ptr: cute.Pointer, k_ptr: cute.Pointer, v_ptr: cute.Pointer,
               q8_ptr: cute.Pointer, k8_ptr: cute.Pointer, v8_ptr: cute.Pointer,
               scales_ptr: cute.Pointer, mean_ptr: cute.Pointer, shift_ptr: cute.Pointer,
               batch: cutlass.Int32, heads: cutlass.Int32, kv_heads: cutlass.Int32,
               seq_len: cutlass.Int32, padded: cutlass.Int32, seq_len_kv: cutlass.Int32,
               padded_kv: cutlass.Int32, q_ctas: cutlass.Int32, kv_ctas: cutlass.Int32,
               q_sb: cutlass.Int32, q_ss: cutlass.Int32, q_sh: cutlass.Int32,
               k_sb: cutlass.Int32, k_ss: cutlass.Int32, k_sh: cutlass.Int32,
               v_sb: cutlass.Int32, v_ss: cutlass.Int32, v_sh: cutlass.Int32,
               SharedStorage: cutlass.Constexpr):
        cta, _, _ = cute.arch.block_idx()
        smem = cutlass.memory.SmemAllocator()
        storage = smem.allocate(SharedStorage)
        blocks = (padded_kv + KV_BLOCK - 1) // KV_BLOCK
        kv_size = batch * kv_heads * blocks
        k_scales = scales_ptr + batch * heads * padded
        kv_args = (k_ptr, v_ptr, (k_sb, k_ss, k_sh), (v_sb, v_ss, v_sh), k8_ptr, v8_ptr,
                   k_scales, mean_ptr, storage, kv_ctas, batch * kv_heads, seq_len_kv, padded_kv,
                   kv_heads, blocks, kv_size)
        if cutlass.const_expr(self.quantize_q):  # quant_kv: no q code at all
            if cta < q_ctas:
                self._q_cta(q_ptr, (q_sb, q_ss, q_sh), q8_ptr, scales_ptr, mean_ptr,
                            shift_ptr, storage, cta, batch * heads, seq_len, padded, heads,
                            kv_heads)
            else:
                self._k_or_v(cta - q_ctas, *kv_args)
        else:
            self._k_or_v(cta, *kv_args)

    @cute.jit
    def _k_or_v(self, cta, k_ptr, v_ptr, k_strides, v_strides, k8_ptr, v8_ptr, k_scales,
                mean_ptr, storage, kv_ctas, bh_count, seq_len_kv, padded_kv, kv_heads, blocks,
                kv_size):
        if cutlass.const_expr(self.quantize_v):
            if cta < kv_ctas:
                self._kv_cta(k_ptr, k_strides, k8_ptr, k_scales, mean_ptr, storage, cta,
                             bh_count, seq_len_kv, padded_kv, kv_heads, blocks, kv_size, False)
            else:
                self._kv_cta(v_ptr, v_strides, v8_ptr, k_scales, mean_ptr, storage,
                             cta - kv_ctas, bh_count, seq_len_kv, padded_kv, kv_heads, blocks,
                             kv_size, True)
        else:  # no v CTAs
            self._kv_cta(k_ptr, k_strides, k8_ptr, k_scales, mean_ptr, storage, cta, bh_count,
                         seq_len_kv, padded_kv, kv_heads, blocks, kv_size, False)

    @cute.jit
    def _load(self, x_ptr, strides, b, h, first, length, permute: cutlass.Constexpr,
              is_v: cutlass.Constexpr):
        """The thread's rows (stored slots first .., each the key at that slot when permuted) of
        its features as fp32 (rows, chunks, 8); rows at or past `length` are zero. strides:
        the input's (batch, token, head) strides in elements (its head_dim is contiguous)."""
        rows, chunks, lanes = self.mapping(is_v)
        tidx, _, _ = cute.arch.thread_idx()
        col = (tidx % lanes) * VEC
        values = cute.make_rmem_tensor(
            cute.make_layout((rows, chunks, VEC), stride=(chunks * VEC, VEC, 1)),
            cutlass.Float32)
        values.fill(0.0)
        for i in cutlass.range_constexpr(rows):
            row = first + i
            if cutlass.const_expr(permute):
                row = key_at_slot(first + i)
            if row < length:
                # The host passes strides of whole 16-byte pieces (input_layout): vector loads.
                at = x_ptr + cute.assume(b * strides[0] + row * strides[1] + h * strides[2]
                                         + col, divby=VEC)
                for c in cutlass.range_constexpr(chunks):
                    src = cute.make_tensor(at + c * (self.head_dim // chunks),
                                           cute.make_layout(VEC))
                    values[i, c, None].store(src.load().to(cutlass.Float32))
        return values

    @cute.jit
    def _stage_mean(self, mean_ptr, bh, storage):
        """m of (batch, KV head) bh (fp32, head_dim) copied to shared memory by the CTA, 16 bytes
        a thread: read there per chunk, it holds no registers while the rows do."""
        tidx, _, _ = cute.arch.thread_idx()
        shared = storage.mean.get_tensor(cute.make_layout(self.head_dim))
        if cutlass.const_expr(self.pdl):  # the mean launch before this one has written m
            cute.arch.griddepcontrol_wait()
        if tidx < self.head_dim // 4:
            src = cute.make_tensor(mean_ptr + (bh * self.head_dim + tidx * 4),
                                   cute.make_layout(4))
            cute.make_tensor(shared.iterator + tidx * 4, cute.make_layout(4)).store(src.load())
        cute.arch.sync_threads()
        return shared

    @cute.jit
    def _mean_chunk(self, shared, c):
        """The thread's 8 features of m in chunk c (of its row's features), from shared memory."""
        _, chunks, lanes = self.mapping(False)
        tidx, _, _ = cute.arch.thread_idx()
        at = cute.assume((tidx % lanes) * VEC + c * (self.head_dim // chunks), divby=VEC)
        return cute.make_tensor(shared.iterator + at, cute.make_layout(VEC)).load()

    @cute.jit
    def _rotate(self, values, first, length):
        """q's or k's rows rotated (hadamard_dsl.rotate); padding rows back to +0 (the rotation
        of a zero row holds -0s, whose codes would not be the formula's zero bytes)."""
        rows, _, lanes = self.mapping(False)
        tidx, _, _ = cute.arch.thread_idx()
        hadamard_dsl.rotate(values, tidx % lanes, lanes)
        for i in cutlass.range_constexpr(rows):
            if first + i >= length:
                values[i, None, None].fill(0.0)

    @cute.jit
    def _store_token_major(self, out_ptr, values, scale, b, h, first, padded, heads, i,
                           is_v: cutlass.Constexpr):
        """Row first + i of the codes (batch, padded, heads, head_dim): 8 bytes a chunk."""
        _, chunks, lanes = self.mapping(is_v)
        tidx, _, _ = cute.arch.thread_idx()
        col = (tidx % lanes) * VEC
        if first + i < padded:
            at = out_ptr + ((b * padded + first + i) * heads + h) * self.head_dim + col
            for c in cutlass.range_constexpr(chunks):
                dst = cute.make_tensor(at + c * (self.head_dim // chunks), cute.make_layout(VEC))
                scaled = values[i, c, None].load() * scale
                if cutlass.const_expr(self.qk_int8 and not is_v):
                    # Rounded to the nearest integer (ties to even) in f32, then converted
                    # exactly: the DSL's f32 -> int8 conversion alone truncates.
                    dst.store(cute.math.roundeven(scaled).to(cutlass.Int8))
                else:
                    # f32 -> e4m3 is cvt.rn.satfinite: round to nearest even, +-448 past it.
                    dst.store(scaled.to(cutlass.Float8E4M3FN))

    @cute.jit
    def _q_cta(self, x_ptr, strides, out_ptr, scales_ptr, mean_ptr, shift_ptr, storage, cta,
               bh_count, seq_len, padded, heads, kv_heads):
        """64 rows of one (batch, head) of q: a scale per row, from the row's lanes; with
        write_shift each row's q . m first (from the caller's q), with rotate_qk rotated rows."""
        rows, chunks, lanes = self.mapping(False)
        tidx, _, _ = cute.arch.thread_idx()
        bh = cta % bh_count
        b, h = bh // heads, bh % heads
        first = (cta // bh_count) * KV_BLOCK + (tidx // lanes) * rows
        values = self._load(x_ptr, strides, b, h, first, seq_len, False, False)
        if cutlass.const_expr(self.write_shift):
            shared = self._stage_mean(mean_ptr, b * kv_heads + h // (heads // kv_heads), storage)
            dots = cute.make_rmem_tensor(cute.make_layout(rows), cutlass.Float32)
            dots.fill(0.0)
            for c in cutlass.range_constexpr(chunks):  # each chunk of m read once
                mean = self._mean_chunk(shared, c)
                for i in cutlass.range_constexpr(rows):
                    for j in cutlass.range_constexpr(VEC):
                        dots[i] = cute.math.fma(values[i, c, j], mean[j], dots[i])
            for i in cutlass.range_constexpr(rows):
                dot = cute.arch.warp_reduction(dots[i], hadamard_dsl.add_exact,
                                               threads_in_group=lanes)
                if tidx % lanes == 0 and first + i < seq_len:
                    put(shift_ptr + (bh * seq_len + first + i), dot)
        if cutlass.const_expr(self.rotate_qk):
            self._rotate(values, first, seq_len)
        for i in cutlass.range_constexpr(rows):
            m = cutlass.Float32(0.0)
            for c in cutlass.range_constexpr(chunks):
                for j in cutlass.range_constexpr(VEC):
                    m = cute.arch.fmax(m, abs(values[i, c, j]), nan=True)
            # The row's lanes are consecutive lanes of one warp, aligned to their count.
            m = cute.arch.warp_reduction(m, lambda x, y: cute.arch.fmax(x, y, nan=True),
                                         threads_in_group=lanes)
            amax = cute.arch.fmax(m, TINY_AMAX, nan=True)
            _, per_amax, top = self.qk_codes
            # fl(fl(1 / amax) * 448): torch's amax.reciprocal() * 448 (127 for int8 codes).
            self._store_token_major(out_ptr, values, (1.0 / amax) * top, b, h, first,
                                    padded, heads, i, False)
            row = first + i
            if tidx % lanes == 0 and row < padded:
                descale = cutlass.Float32(1.0)  # padding rows: neutral
                if row < seq_len:
                    descale = amax * per_amax
                put(scales_ptr + (bh * padded + row), descale)

    @cute.jit
    def _kv_cta(self, x_ptr, strides, out_ptr, scales_ptr, mean_ptr, storage, cta, bh_count,
                seq_len_kv, padded_kv, kv_heads, blocks, kv_size, is_v: cutlass.Constexpr):
        """One 64-key block of one (batch, KV head) of k or v: one scale for the block; k's rows
        less m with smooth_k, then rotated with rotate_qk."""
        rows, chunks, lanes = self.mapping(is_v)
        tidx, _, _ = cute.arch.thread_idx()
        bh = cta % bh_count
        block = cta // bh_count
        b, h = bh // kv_heads, bh % kv_heads
        first = block * KV_BLOCK + (tidx // lanes) * rows
        permute = is_v and self.permute_keys
        values = self._load(x_ptr, strides, b, h, first, seq_len_kv, permute, is_v)
        if cutlass.const_expr(not is_v and self.smooth_k):
            shared = self._stage_mean(mean_ptr, bh, storage)
            if cutlass.const_expr(chunks == 1):  # unrotated rows: m's chunk read once
                mean = self._mean_chunk(shared, 0)
                for i in cutlass.range_constexpr(rows):
                    keep = first + i < seq_len_kv  # padding rows stay zero
                    for j in cutlass.range_constexpr(VEC):
                        values[i, 0, j] = cutlass.select_(
                            keep, hadamard_dsl.sub_exact(values[i, 0, j], mean[j]),
                            values[i, 0, j])
            else:  # a rotated row: each chunk of m read as it is used (no registers held)
                for i in cutlass.range_constexpr(rows):
                    if first + i < seq_len_kv:
                        for c in cutlass.range_constexpr(chunks):
                            mean = self._mean_chunk(shared, c)
                            for j in cutlass.range_constexpr(VEC):
                                values[i, c, j] = hadamard_dsl.sub_exact(values[i, c, j],
                                                                         mean[j])
        if cutlass.const_expr(not is_v and self.rotate_qk):
            self._rotate(values, first, seq_len_kv)
        m = cutlass.Float32(0.0)
        for i in cutlass.range_constexpr(rows):
            for c in cutlass.range_constexpr(chunks):
                for j in cutlass.range_constexpr(VEC):
                    m = cute.arch.fmax(m, abs(values[i, c, j]), nan=True)
        m = cute.arch.warp_reduction(m, lambda x, y: cute.arch.fmax(x, y, nan=True))
        warp_max = storage.warp_max.get_tensor(cute.make_layout(GROUPS))
        warps = self.threads // 32
        if tidx % 32 == 0:
            warp_max[tidx // 32] = m
        cute.arch.sync_threads()
        for w in cutlass.range_constexpr(warps):
            m = cute.arch.fmax(m, warp_max[w], nan=True)
        amax = cute.arch.fmax(m, TINY_AMAX, nan=True)
        _, per_amax, top = E4M3_CODES if is_v else self.qk_codes
        scale = (1.0 / amax) * top
        if cutlass.const_expr(is_v and self.v_feature_major):
            self._store_feature_major(out_ptr, storage, values, scale, bh, first, padded_kv)
        else:
            for i in cutlass.range_constexpr(rows):
                self._store_token_major(out_ptr, values, scale, b, h, first, padded_kv,
                                        kv_heads, i, is_v)
        if tidx == 0:
            descale = cutlass.Float32(1.0)  # a block of padding only: neutral
            if block * KV_BLOCK < seq_len_kv:
                descale = amax * per_amax
            at = bh * blocks + block
            if cutlass.const_expr(is_v):
                # log2 of V's descale and its inverse for the softmax, and V's own for readers.
                put(scales_ptr + (kv_size + at), cute.math.log2(descale, fastmath=False))
                put(scales_ptr + (2 * kv_size + at), 1.0 / descale)
                put(scales_ptr + (3 * kv_size + at), descale)
            else:
                put(scales_ptr + at, descale)
                if cutlass.const_expr(not self.quantize_v):  # no v CTA: V's scales neutral
                    put(scales_ptr + (kv_size + at), cutlass.Float32(0.0))
                    put(scales_ptr + (2 * kv_size + at), cutlass.Float32(1.0))
                    put(scales_ptr + (3 * kv_size + at), cutlass.Float32(1.0))

    @cute.jit
    def _store_feature_major(self, out_ptr, storage, values, scale, bh, first, padded_kv):
        """The block's codes to (batch, kv_heads, head_dim, padded_kv) through shared memory:
        the thread's 8 x 8 codes transposed in registers into 8-byte pieces of 8 feature rows of
        the tile, then the CTA writes each feature row's 64 bytes as 8 pieces of 8 consecutive
        lanes. padded_kv % 8 == 0 (prepare checks it)."""
        tidx, _, _ = cute.arch.thread_idx()
        col = (tidx % self.lanes) * VEC
        local = (tidx // self.lanes) * ROWS  # the thread's first slot in the block
        tile = storage.tile.get_tensor(cute.make_layout(self.head_dim * TILE_PITCH)).iterator
        codes = cute.make_rmem_tensor(cute.make_layout((ROWS, VEC), stride=(VEC, 1)),
                                      cutlass.Float8E4M3FN)
        for i in cutlass.range_constexpr(ROWS):
            codes[i, None].store((values[i, 0, None].load() * scale).to(cutlass.Float8E4M3FN))
        for j in cutlass.range_constexpr(VEC):
            feature = cute.make_rmem_tensor((ROWS,), cutlass.Float8E4M3FN)
            for i in cutlass.range_constexpr(ROWS):
                feature[i] = codes[i, j]
            at = cute.assume((col + j) * TILE_PITCH + local, divby=ROWS)
            cute.make_tensor(tile + at, cute.make_layout(ROWS)).store(feature.load())
        cute.arch.sync_threads()
        block_start = first - local
        pieces = KV_BLOCK // ROWS  # 8-byte pieces of one feature row
        for r in cutlass.range_constexpr(self.head_dim * pieces // self.threads):
            piece = tidx + r * self.threads
            d = piece // pieces
            slot = (piece % pieces) * ROWS
            if block_start + slot < padded_kv:
                src = cute.make_tensor(tile + cute.assume(d * TILE_PITCH + slot, divby=ROWS),
                                       cute.make_layout(ROWS))
                at = cute.assume((bh * self.head_dim + d) * padded_kv + block_start + slot,
                                 divby=ROWS)
                cute.make_tensor(out_ptr + at, cute.make_layout(ROWS)).store(src.load())



KERNELS = ("quant", "quant_kv", "expand", "mean")


def pdl_arch(arch: str) -> bool:
    """Whether `arch` (sm_89, sm_90a, sm_120a, ...) has programmatic dependent launch (sm_90
    on): K smoothing's mean launch and the quantization after it overlap there."""
    return int(arch.removeprefix("sm_").rstrip("af")) >= 90


def _make(name: str, in_dtype, head_dim: int, v_feature_major: bool, permute_keys: bool,
          smooth_k: bool = False, rotate_qk: bool = False, quantize_v: bool = True,
          qk_int8: bool = False, write_shift: bool = True, pdl: bool = False):
    if name not in KERNELS:
        raise ValueError(f"unknown kernel {name!r}; one of {KERNELS}")
    if name in ("expand", "mean"):
        if smooth_k or rotate_qk or not quantize_v or qk_int8:
            raise ValueError(f"{name!r} quantizes nothing: it has no smooth_k, rotate_qk or "
                             "quantize_v=False (nor qk_int8); quantize with 'quant' for those")
        return ExpandScales() if name == "expand" else KeyMean(_dsl_dtype(in_dtype), head_dim,
                                                               pdl)
    if rotate_qk and name == "quant_kv":
        raise ValueError("rotate_qk needs q rotated like k, and 'quant_kv' leaves q to the "
                         "attention kernel: quantize q here ('quant') or leave rotate_qk off")
    if rotate_qk:
        hadamard_dsl.check_head_dim(head_dim)  # a power of two up to 128, or a ValueError
    return BlockQuant(_dsl_dtype(in_dtype), head_dim, v_feature_major, permute_keys,
                      quantize_q=name == "quant", smooth_k=smooth_k, rotate_qk=rotate_qk,
                      quantize_v=quantize_v, qk_int8=qk_int8, write_shift=write_shift,
                      pdl=pdl)


def compile_kernel(name: str, in_dtype: torch.dtype, head_dim: int, arch: str,
                   v_feature_major: bool = True, permute_keys: bool = False, *,
                   smooth_k: bool = False, rotate_qk: bool = False, quantize_v: bool = True,
                   qk_int8: bool = False, write_shift: bool = True,
                   keep_ptx_in: str | None = None):
    """(compiled function, its launch slots) of "quant" (BlockQuant), "quant_kv" (BlockQuant
    without q's CTAs), "expand" (ExpandScales; dtype and head_dim unused) or "mean"
    (variants/key_mean_kernel.KeyMean; the V layout unused) for `arch`, without
    a GPU; quantize_v=False: no v CTAs (V's scales neutral); qk_int8: int8 q and k codes;
    write_shift=False: with smooth_k, no q . m (for a call that drops the LSE); keep_ptx_in: a
    directory to leave the PTX and the cubin in (the CPU tests read them). On an arch with
    programmatic dependent launch (pdl_arch) the mean launch and a smoothing quantization after
    it overlap."""
    from variants.dsl_compile import compile_for_arch

    kernel = _make(name, in_dtype, head_dim, v_feature_major, permute_keys, smooth_k, rotate_qk,
                   quantize_v, qk_int8, write_shift, pdl_arch(arch))
    fn, _, _ = compile_for_arch(kernel, arch, kernel.compile_args(),
                                keep="--keep-ptx --keep-cubin" if keep_ptx_in else "",
                                dump_dir=keep_ptx_in)
    return fn, kernel.slots()


def compiled(name: str, in_dtype: torch.dtype, head_dim: int, device: torch.device, *,
             v_feature_major: bool = True, permute_keys: bool = False, smooth_k: bool = False,
             rotate_qk: bool = False, quantize_v: bool = True, qk_int8: bool = False,
             write_shift: bool = True, compile_now: bool = True) -> FastLaunch | None:
    """The launcher of one of KERNELS for this GPU, or None where there is none
    (variants/launch.LauncherCache: compiled on first use, a failure logged once)."""
    write_shift = write_shift and smooth_k and name == "quant"  # one build where it is moot
    key = (name, in_dtype, head_dim, device_arch(device), v_feature_major, permute_keys,
           smooth_k, rotate_qk, quantize_v, qk_int8, write_shift)

    def build():
        return compile_kernel(*key[:6], smooth_k=smooth_k, rotate_qk=rotate_qk,
                              quantize_v=quantize_v, qk_int8=qk_int8, write_shift=write_shift)

    return LAUNCHERS.get(key, build, compile_now=compile_now)
