"""prepare's GPU work as CuTe DSL kernels: per input, the per-head amax, then the e4m3 cast.

    HeadAbsMax:  amax[b, h] = max |x[b, s, h, :]| over s < seq_len (amax zeroed before)
    ScaledCast:  out[b, s, h, :] = e4m3(x[b, s, h, :] * (448 / max(amax[b, h], tiny))), zero past
                 seq_len, and descale[b, h] = max(amax[b, h], tiny) * fl32(1 / 448)

With feature_major (V for a kernel that reads it K-major) the cast writes out[b, h, :, pos(s)],
pos(s) = s or, with permute_keys, its slot in key_order.register_p_key_order, so the transpose
and the key permutation cost no pass of their own. With rescale=False (the FP8 entry point) the
codes are copied as they are (e4m3 -> f32 -> e4m3 is exact) into the layout the kernel reads.

Both kernels split a (batch, head) slice into chunks of tokens_per_chunk rows; a CTA owns one
chunk of one (batch, head), with heads fastest in the grid (CTAs resident together read one
contiguous span of tokens): its warps read whole rows of head_dim features (256 contiguous bytes
of bf16 at head_dim 128), 8 rows per thread unrolled, so every thread has 8 16-byte loads in
flight. The
amax is NaN-propagating (IEEE maximum, FMNMX.NaN, then an integer atomic max on the float bits,
where a positive NaN sorts above +Inf): a NaN input gives NaN scales and a NaN output, never a
silently finite one. The cast runs its CTAs in the reverse order of the amax's, so that its first
CTAs read what the amax read last, still in L2 (50 MB on the H200, a whole input up to ~25 M
elements): prepare runs amax then cast per input, not all amaxes first. CastThenAmax does the
cast of one input and the amax of the next in one launch, so that prepare launches
amax(q), cast(q) + amax(k), cast(k) + amax(v), cast(v): four launches, each input's cast still
right after its own amax.

The arithmetic is the plain formula's (x converted to fp32, one fp32 division for the scale, one
fp32 multiply, round to nearest even), and the clamp to +-448 is the saturation every PTX f32 ->
e4m3 cvt performs (.satfinite is mandatory there), so the codes are bit for bit those of the torch
path: tests/test_prepare.py checks that on the GPU.

One compiled function per (kernel, input dtype, head_dim, layout, arch) and process, compiled on
first use (~0.1 s each) and then only launched through variants/launch.py, on torch's current
stream. Where it cannot compile, prepare falls back to the torch ops (compiled() is None).
"""

from __future__ import annotations

import functools
import logging
import threading

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import torch

from variants.key_order import key_at_slot
from variants.launch import STREAM, FastLaunch, pointer, scalar

VEC = 8  # features per thread and row: 16 bytes of bf16 in, 8 bytes of e4m3 out
THREADS = 256
ROWS_PER_THREAD = 8  # rows of a chunk each thread handles, unrolled: the loads in flight
CHUNKS_PER_CTA = 1  # chunks a CTA handles one after the other (benchmarks/quant_profile.py)
E4M3_MAX = 448.0
DESCALE_PER_AMAX = 1.0 / E4M3_MAX  # descale = amax * fl32(1 / 448), as prepare's torch path
TINY_AMAX = 1e-12  # an all-zero head gets scale 448e12 instead of a division by zero

# (kernel name, dtype, head_dim, arch, feature_major, permute_keys, rescale) -> FastLaunch or None.
_COMPILED: dict[tuple, FastLaunch | None] = {}
log = logging.getLogger(__name__)
_LOCK = threading.Lock()


def _dsl_dtype(dtype: torch.dtype):
    return {torch.bfloat16: cutlass.BFloat16, torch.float16: cutlass.Float16,
            torch.float8_e4m3fn: cutlass.Float8E4M3FN}[dtype]


def tokens_per_chunk(head_dim: int) -> int:
    """Rows of one CTA: THREADS // (head_dim // VEC) rows per pass, ROWS_PER_THREAD passes."""
    return ROWS_PER_THREAD * THREADS // (head_dim // VEC)


def _input_align(dtype) -> int:
    return VEC * dtype.width // 8


class _Chunked:
    """What both kernels share: a CTA per (chunk of rows, batch * head), and which row and
    features a thread owns in each pass."""

    def __init__(self, in_dtype, head_dim: int, chunks_per_cta: int = CHUNKS_PER_CTA) -> None:
        self.in_dtype = in_dtype
        self.head_dim = head_dim
        self.lanes = head_dim // VEC  # threads per row
        self.rows_per_pass = THREADS // self.lanes
        self.tokens = tokens_per_chunk(head_dim)
        self.chunks_per_cta = chunks_per_cta

    def _groups(self, rows):
        """CTAs along the rows: chunks_per_cta chunks each."""
        chunks = (rows + self.tokens - 1) // self.tokens
        return (chunks + self.chunks_per_cta - 1) // self.chunks_per_cta

    def _load_row(self, x_ptr, b, s, h, col, seq_len, heads):
        """x[b, s, h, col:col + 8] as fp32 (16-byte load)."""
        src = cute.make_tensor(x_ptr + ((b * seq_len + s) * heads + h) * self.head_dim + col,
                               cute.make_layout(VEC))
        return src.load().to(cutlass.Float32)


class HeadAbsMax(_Chunked):
    """amax (batch * heads) fp32, atomically maxed (zero it first)."""

    def slots(self):
        return (pointer(self.in_dtype.__name__, _input_align(self.in_dtype)),
                pointer("Float32", 4), scalar("Int32"), scalar("Int32"), scalar("Int32"),
                STREAM)

    def compile_args(self):
        from cutlass.cute.runtime import make_fake_stream, make_ptr

        gmem = cute.AddressSpace.gmem
        return (make_ptr(self.in_dtype, 0, gmem, assumed_align=_input_align(self.in_dtype)),
                make_ptr(cutlass.Float32, 0, gmem, assumed_align=4),
                cutlass.Int32(1), cutlass.Int32(1), cutlass.Int32(1), make_fake_stream())

    @cute.jit
    def __call__(self, x_ptr: cute.Pointer, amax_ptr: cute.Pointer, batch: cutlass.Int32,
                 seq_len: cutlass.Int32, heads: cutlass.Int32, stream: cuda.CUstream):
        self.kernel(x_ptr, amax_ptr, seq_len, heads).launch(
            grid=[batch * heads, self._groups(seq_len), 1], block=[THREADS, 1, 1],
            stream=stream)

    @cute.kernel
    def kernel(self, x_ptr: cute.Pointer, amax_ptr: cute.Pointer, seq_len: cutlass.Int32,
               heads: cutlass.Int32):
        # Heads fastest: the CTAs resident at one time read one contiguous span of tokens
        # (all heads of them), which DRAM serves faster than one head's rows across the input.
        bh, group, _ = cute.arch.block_idx()
        self.amax_cta(x_ptr, amax_ptr, bh, group, seq_len, heads)

    @cute.jit
    def amax_cta(self, x_ptr, amax_ptr, bh, group, seq_len, heads):
        """One CTA's part: the max over its chunks of (batch, head) bh, into amax[bh]."""
        tidx, _, _ = cute.arch.thread_idx()
        b = bh // heads
        h = bh % heads
        row = tidx // self.lanes
        col = (tidx % self.lanes) * VEC
        m = cutlass.Float32(0.0)
        for c in cutlass.range_constexpr(self.chunks_per_cta):
            first = (group * self.chunks_per_cta + c) * self.tokens
            if first + self.tokens <= seq_len:  # a full chunk: no bounds checks between loads
                for i in cutlass.range_constexpr(ROWS_PER_THREAD):
                    values = self._load_row(x_ptr, b, first + i * self.rows_per_pass + row, h,
                                            col, seq_len, heads)
                    for j in cutlass.range_constexpr(VEC):
                        m = cute.arch.fmax(m, abs(values[j]), nan=True)
            elif first < seq_len:
                for i in cutlass.range_constexpr(ROWS_PER_THREAD):
                    s = first + i * self.rows_per_pass + row
                    if s < seq_len:
                        values = self._load_row(x_ptr, b, s, h, col, seq_len, heads)
                        for j in cutlass.range_constexpr(VEC):
                            m = cute.arch.fmax(m, abs(values[j]), nan=True)
        m = cute.arch.warp_reduction(m, lambda x, y: cute.arch.fmax(x, y, nan=True))
        if tidx % 32 == 0:
            # |x| >= 0 (a NaN's sign bit cleared too): an integer max on the bits is a float max.
            cute.arch.atomic_fmax(amax_ptr + bh, m, sign_bit=False)


class ScaledCast(_Chunked):
    """The cast for one input dtype, head_dim and output layout; batch, lengths and heads are
    runtime. rescale=False copies codes (an e4m3 input) without a scale or a descale."""

    def __init__(self, in_dtype, head_dim: int, feature_major: bool = False,
                 permute_keys: bool = False, rescale: bool = True,
                 chunks_per_cta: int = CHUNKS_PER_CTA) -> None:
        super().__init__(in_dtype, head_dim, chunks_per_cta)
        self.feature_major = feature_major
        self.permute_keys = permute_keys
        self.rescale = rescale

    def slots(self):
        return (pointer(self.in_dtype.__name__, _input_align(self.in_dtype)),
                pointer("Float32", 4), pointer("Float32", 4),
                pointer("Float8E4M3FN", VEC), *(scalar("Int32"),) * 5, STREAM)

    def compile_args(self):
        """Stand-ins for the launch arguments (only types and alignments reach codegen)."""
        from cutlass.cute.runtime import make_fake_stream, make_ptr

        gmem = cute.AddressSpace.gmem
        return (make_ptr(self.in_dtype, 0, gmem, assumed_align=_input_align(self.in_dtype)),
                make_ptr(cutlass.Float32, 0, gmem, assumed_align=4),
                make_ptr(cutlass.Float32, 0, gmem, assumed_align=4),
                make_ptr(cutlass.Float8E4M3FN, 0, gmem, assumed_align=VEC),
                *(cutlass.Int32(1),) * 5, make_fake_stream())

    @cute.jit
    def __call__(self, x_ptr: cute.Pointer, amax_ptr: cute.Pointer, descale_ptr: cute.Pointer,
                 out_ptr: cute.Pointer, batch: cutlass.Int32, seq_len: cutlass.Int32,
                 padded: cutlass.Int32, heads: cutlass.Int32, replicas: cutlass.Int32,
                 stream: cuda.CUstream):
        # The feature-major cast transposes a chunk through shared memory: head_dim rows of
        # tokens slots, each padded by 8 bytes against bank conflicts (the token-major cast
        # needs none; it gets a token allocation).
        tile_bytes = self.head_dim * self._pitch() if cutlass.const_expr(self.feature_major) \
            else 16

        @cute.struct
        class SharedStorage:
            tile: cute.struct.Align[cute.struct.MemRange[cutlass.Float8E4M3FN, tile_bytes], 16]

        self.kernel(x_ptr, amax_ptr, descale_ptr, out_ptr, seq_len, padded, heads, replicas,
                    SharedStorage).launch(
            grid=[batch * heads, self._groups(padded), 1], block=[THREADS, 1, 1],
            smem=SharedStorage.size_in_bytes(), stream=stream)

    def _pitch(self) -> int:
        return self.tokens + ROWS_PER_THREAD

    @cute.kernel
    def kernel(self, x_ptr: cute.Pointer, amax_ptr: cute.Pointer, descale_ptr: cute.Pointer,
               out_ptr: cute.Pointer, seq_len: cutlass.Int32, padded: cutlass.Int32,
               heads: cutlass.Int32, replicas: cutlass.Int32, SharedStorage: cutlass.Constexpr):
        bidx, bidy, _ = cute.arch.block_idx()
        nbh, ngroups, _ = cute.arch.grid_dim()
        # Reverse of HeadAbsMax's order: the first CTAs read what it read last (in L2).
        self.cast_cta(x_ptr, amax_ptr, descale_ptr, out_ptr, nbh - 1 - bidx, ngroups - 1 - bidy,
                      seq_len, padded, heads, replicas, SharedStorage)

    @cute.jit
    def cast_cta(self, x_ptr, amax_ptr, descale_ptr, out_ptr, bh, group, seq_len, padded, heads,
                 replicas, SharedStorage: cutlass.Constexpr):
        """One CTA's part: the codes of its chunks of (batch, head) bh (and, from its group 0,
        the descale, written for each of the `replicas` query heads this head serves: 1 for q,
        heads // kv_heads for k and v)."""
        tidx, _, _ = cute.arch.thread_idx()
        b = bh // heads
        h = bh % heads
        row = tidx // self.lanes
        col = (tidx % self.lanes) * VEC
        scale = cutlass.Float32(1.0)
        if cutlass.const_expr(self.rescale):
            amax = cute.arch.fmax(amax_ptr[bh], TINY_AMAX, nan=True)
            # fl(fl(1 / amax) * 448): torch's 448 / amax is this (Tensor.__rtruediv__).
            scale = (1.0 / amax) * E4M3_MAX
            if group == 0 and tidx == 0:
                # descale (batch, query heads, 3): this input's column, at stride 3, for every
                # query head of the group (query head h * replicas + g reads KV head h).
                for g in cutlass.range(replicas, unroll=1):
                    dst = cute.make_tensor(descale_ptr + (bh * replicas + g) * 3,
                                           cute.make_layout(1))
                    dst[0] = amax * DESCALE_PER_AMAX
        smem = cutlass.memory.SmemAllocator()
        tile = smem.allocate(SharedStorage).tile.get_tensor(
            cute.make_layout(SharedStorage.size_in_bytes())).iterator
        for c in cutlass.range_constexpr(self.chunks_per_cta):
            # Also within the CTA, the last chunk first.
            chunk = group * self.chunks_per_cta + (self.chunks_per_cta - 1 - c)
            if cutlass.const_expr(self.feature_major):
                self._cast_feature_major(x_ptr, out_ptr, tile, scale, b, h, bh, chunk,
                                         seq_len, padded, heads)
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
        cute.arch.sync_threads()  # the next chunk of this CTA reuses the tile


class CastThenAmax:
    """One launch for two steps of prepare: the token-major cast of one input (q or k) and the amax
    of the next (k or v), so that prepare launches four kernels for three inputs, not six (each
    launch costs ~8 us of host time in the DSL's host stub on the H200's host, and at B=4 S=1024
    H=32 the host was the bound). The grid is 1-D: the cast's CTAs first, in the reverse of the
    amax's order as ScaledCast runs them (their first CTAs read what the previous launch's amax
    read last, from L2), then the next input's amax CTAs, heads fastest as HeadAbsMax, whose
    reads leave that input's tail in L2 for its cast in the next launch."""

    def __init__(self, in_dtype, head_dim: int, amax_chunks_per_cta: int = CHUNKS_PER_CTA) -> None:
        self.in_dtype = in_dtype
        self.cast = ScaledCast(in_dtype, head_dim)
        self.amax = HeadAbsMax(in_dtype, head_dim, amax_chunks_per_cta)

    def slots(self):
        x = pointer(self.in_dtype.__name__, _input_align(self.in_dtype))
        f32 = pointer("Float32", 4)
        return (x, f32, f32, pointer("Float8E4M3FN", VEC), x, f32,
                *(scalar("Int32"),) * 7, STREAM)

    def compile_args(self):
        from cutlass.cute.runtime import make_fake_stream, make_ptr

        gmem = cute.AddressSpace.gmem
        x = make_ptr(self.in_dtype, 0, gmem, assumed_align=_input_align(self.in_dtype))
        f32 = make_ptr(cutlass.Float32, 0, gmem, assumed_align=4)
        return (x, f32, f32, make_ptr(cutlass.Float8E4M3FN, 0, gmem, assumed_align=VEC), x, f32,
                *(cutlass.Int32(1),) * 7, make_fake_stream())

    @cute.jit
    def __call__(self, x_ptr: cute.Pointer, amax_ptr: cute.Pointer, descale_ptr: cute.Pointer,
                 out_ptr: cute.Pointer, next_ptr: cute.Pointer, next_amax_ptr: cute.Pointer,
                 batch: cutlass.Int32, seq_len: cutlass.Int32, padded: cutlass.Int32,
                 heads: cutlass.Int32, replicas: cutlass.Int32, next_seq_len: cutlass.Int32,
                 next_heads: cutlass.Int32, stream: cuda.CUstream):
        @cute.struct
        class SharedStorage:  # the token-major cast needs no tile: a token allocation
            tile: cute.struct.Align[cute.struct.MemRange[cutlass.Float8E4M3FN, 16], 16]

        cast_ctas = batch * heads * self.cast._groups(padded)
        amax_ctas = batch * next_heads * self.amax._groups(next_seq_len)
        self.kernel(x_ptr, amax_ptr, descale_ptr, out_ptr, next_ptr, next_amax_ptr, seq_len,
                    padded, heads, replicas, next_seq_len, next_heads, batch * heads, cast_ctas,
                    batch * next_heads, SharedStorage).launch(
            grid=[cast_ctas + amax_ctas, 1, 1], block=[THREADS, 1, 1],
            smem=SharedStorage.size_in_bytes(), stream=stream)

    @cute.kernel
    def kernel(self, x_ptr: cute.Pointer, amax_ptr: cute.Pointer, descale_ptr: cute.Pointer,
               out_ptr: cute.Pointer, next_ptr: cute.Pointer, next_amax_ptr: cute.Pointer,
               seq_len: cutlass.Int32, padded: cutlass.Int32, heads: cutlass.Int32,
               replicas: cutlass.Int32, next_seq_len: cutlass.Int32, next_heads: cutlass.Int32,
               cast_bh: cutlass.Int32,
               cast_ctas: cutlass.Int32, next_bh: cutlass.Int32,
               SharedStorage: cutlass.Constexpr):
        cta, _, _ = cute.arch.block_idx()
        if cta < cast_ctas:
            reverse = cast_ctas - 1 - cta
            self.cast.cast_cta(x_ptr, amax_ptr, descale_ptr, out_ptr, reverse % cast_bh,
                               reverse // cast_bh, seq_len, padded, heads, replicas,
                               SharedStorage)
        else:
            rest = cta - cast_ctas
            self.amax.amax_cta(next_ptr, next_amax_ptr, rest % next_bh, rest // next_bh,
                               next_seq_len, next_heads)


def _make(name: str, in_dtype, head_dim: int, feature_major: bool, permute_keys: bool,
          rescale: bool, chunks_per_cta: int):
    if name == "amax":
        return HeadAbsMax(in_dtype, head_dim, chunks_per_cta)
    if name == "cast_then_amax":  # chunks_per_cta: the next input's amax's
        return CastThenAmax(in_dtype, head_dim, chunks_per_cta)
    return ScaledCast(in_dtype, head_dim, feature_major, permute_keys, rescale, chunks_per_cta)


def compile_kernel(name: str, in_dtype: torch.dtype, head_dim: int, arch: str,
                   feature_major: bool = False, permute_keys: bool = False, rescale: bool = True,
                   *, keep_ptx_in: str | None = None, chunks_per_cta: int = CHUNKS_PER_CTA):
    """(compiled function, its launch slots) of "amax", "cast" or "cast_then_amax" for `arch` (no
    GPU needed, like the attention kernels); keep_ptx_in: a directory to leave the PTX in (the CPU
    tests read it)."""
    from variants.dsl_compile import compile_for_arch

    kernel = _make(name, _dsl_dtype(in_dtype), head_dim, feature_major, permute_keys, rescale,
                   chunks_per_cta)
    fn, _, _ = compile_for_arch(kernel, arch, kernel.compile_args(),
                                keep="--keep-ptx" if keep_ptx_in else "", dump_dir=keep_ptx_in)
    return fn, kernel.slots()


def compile_scaled_cast(in_dtype: torch.dtype, head_dim: int, arch: str,
                        feature_major: bool = False, permute_keys: bool = False, *,
                        keep_ptx_in: str | None = None):
    return compile_kernel("cast", in_dtype, head_dim, arch, feature_major, permute_keys,
                          keep_ptx_in=keep_ptx_in)[0]


@functools.cache
def _device_arch(device: torch.device) -> str:
    """Once per device: the capability query costs ~10 us, and prepare asks per call."""
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"


def compiled(name: str, in_dtype: torch.dtype, head_dim: int, device: torch.device, *,
             feature_major: bool = False, permute_keys: bool = False, rescale: bool = True,
             chunks_per_cta: int = CHUNKS_PER_CTA, compile_now: bool = True
             ) -> FastLaunch | None:
    """The launcher of "amax" or "cast" for this dtype, head_dim and GPU, or None where there is
    none: compiled on first use (compile_now=False: only if compiled already, as inside a
    CUDA-graph capture, which must not see a module load). A compile failure (an arch this DSL
    build cannot target, say) is logged once and remembered: prepare then uses torch ops, which
    give the same codes, instead of failing."""
    key = (name, in_dtype, head_dim, _device_arch(device), feature_major, permute_keys, rescale,
           chunks_per_cta)
    hit = _COMPILED.get(key, False)
    if hit is not False or not compile_now:
        return hit or None
    with _LOCK:
        if key not in _COMPILED:
            try:
                _COMPILED[key] = FastLaunch(*compile_kernel(*key[:-1], chunks_per_cta=key[-1]))
            except Exception as exc:  # noqa: BLE001 - any DSL failure: fall back, loudly
                log.warning("fused %s kernel unavailable for %s (%s); prepare uses torch ops",
                            name, key[1:], str(exc).strip().splitlines()[-1][:200]
                            if str(exc) else exc)
                _COMPILED[key] = None
        return _COMPILED[key]


@functools.cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def amax_chunks_per_cta(batch: int, heads: int, seq_len: int, head_dim: int,
                        device: torch.device) -> int:
    """Chunks per CTA of the amax: the most of 8, 4, 2 that still leaves 4 CTAs per SM, else 1.
    Fewer, longer CTAs read faster (per input at B=1 H=56 S=16384 on the H200: 82 us with 1,
    58 us with 8: benchmarks/quant_profile.py --sweep); the cast gained nothing from it."""
    chunks = batch * heads * -(-seq_len // tokens_per_chunk(head_dim))
    for per_cta in (8, 4, 2):
        if chunks >= per_cta * 4 * _sm_count(device):
            return per_cta
    return 1
