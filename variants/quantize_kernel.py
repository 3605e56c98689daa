"""The e4m3 cast of prepare as one CuTe DSL kernel: read bf16/fp16 once, write fp8 once.

out[b, s, h, :] = e4m3(x[b, s, h, :] * scale[b, h]) for s < seq_len, 0 for seq_len <= s < padded.
With feature_major (V for a kernel that reads it K-major): out[b, h, :, pos(s)] instead, where
pos is s, or with permute_keys its slot in prepare.register_p_key_order, so the transpose and
the key permutation cost no pass of their own.

In torch ops the same cast is a promoted multiply to an fp32 temporary, a clamp of it and a
cast of it into the padded buffer: ~17 bytes of memory traffic per element instead of 3, and
prepare took longer than the attention kernel itself up to S = 8192 on the H200
(benchmarks/RESULTS.md). The arithmetic is the same (x converted to fp32, one fp32 multiply,
round to nearest even), and the clamp to +-448 is the saturation every PTX f32 -> e4m3 cvt
performs (.satfinite is mandatory there), so the codes are bit for bit those of the torch path:
tests/test_prepare.py checks that on the GPU.

Each thread casts 8 consecutive features (one 16-byte load, one 8-byte store; feature-major:
8 one-byte stores, one per feature row, where the 32 threads of a warp hold 32 consecutive keys,
so every store instruction of a warp fills one 32-byte span); one compiled function per (input
dtype, head_dim, layout, arch) and process, compiled on first use (~0.1 s) and then only
launched, on torch's current stream. Where it cannot compile, prepare falls back to the torch
ops (compiled() is None).
"""

from __future__ import annotations

import logging
import threading

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import torch

from variants.key_order import key_slot

VEC = 8  # features per thread: 16 bytes of bf16 in, 8 bytes of e4m3 out
THREADS = 256

# (dtype, head_dim, arch) -> compiled function, or None where compiling failed.
_COMPILED: dict[tuple, object] = {}
log = logging.getLogger(__name__)
_LOCK = threading.Lock()


def _dsl_dtype(dtype: torch.dtype):
    return {torch.bfloat16: cutlass.BFloat16, torch.float16: cutlass.Float16}[dtype]


class ScaledCast:
    """The kernel for one input dtype, head_dim and output layout; batch, lengths and heads are
    runtime."""

    def __init__(self, in_dtype, head_dim: int, feature_major: bool = False,
                 permute_keys: bool = False):
        self.in_dtype = in_dtype
        self.head_dim = head_dim
        self.feature_major = feature_major
        self.permute_keys = permute_keys

    def compile_args(self):
        """Stand-ins for the launch arguments (only types and alignments reach codegen)."""
        from cutlass.cute.runtime import make_fake_stream, make_ptr

        gmem = cute.AddressSpace.gmem
        return (make_ptr(self.in_dtype, 0, gmem, assumed_align=16),
                make_ptr(cutlass.Float32, 0, gmem, assumed_align=4),
                make_ptr(cutlass.Float8E4M3FN, 0, gmem, assumed_align=8),
                cutlass.Int32(1), cutlass.Int32(1), cutlass.Int32(1), cutlass.Int32(1),
                make_fake_stream())

    @cute.jit
    def __call__(self, x_ptr: cute.Pointer, scale_ptr: cute.Pointer, out_ptr: cute.Pointer,
                 batch: cutlass.Int32, seq_len: cutlass.Int32, padded: cutlass.Int32,
                 heads: cutlass.Int32, stream: cuda.CUstream):
        groups = batch * padded * heads * (self.head_dim // VEC)
        self.kernel(x_ptr, scale_ptr, out_ptr, seq_len, padded, heads, groups).launch(
            grid=[(groups + THREADS - 1) // THREADS, 1, 1], block=[THREADS, 1, 1],
            stream=stream)

    @cute.kernel
    def kernel(self, x_ptr: cute.Pointer, scale_ptr: cute.Pointer, out_ptr: cute.Pointer,
               seq_len: cutlass.Int32, padded: cutlass.Int32, heads: cutlass.Int32,
               groups: cutlass.Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        group = bidx * THREADS + tidx
        if group < groups:
            if cutlass.const_expr(self.feature_major):
                self._cast_feature_major(x_ptr, scale_ptr, out_ptr, seq_len, padded, heads,
                                         group)
            else:
                self._cast_token_major(x_ptr, scale_ptr, out_ptr, seq_len, padded, heads,
                                       group)

    @cute.jit
    def _cast_token_major(self, x_ptr, scale_ptr, out_ptr, seq_len, padded, heads, group):
        """Group = ((b * padded + s) * heads + h) * (d / 8) + feature block: the output's own
        order, so a thread's 8 codes are one 8-byte store."""
        d = self.head_dim
        row = group // (d // VEC)  # (b, s, h) of the padded output, row-major
        col = (group % (d // VEC)) * VEC
        h = row % heads
        s = (row // heads) % padded
        b = row // (heads * padded)
        dst = cute.make_tensor(out_ptr + row * d + col, cute.make_layout(VEC))
        values = cute.full((VEC,), 0.0, cutlass.Float32)
        if s < seq_len:
            src = cute.make_tensor(x_ptr + ((b * seq_len + s) * heads + h) * d + col,
                                   cute.make_layout(VEC))
            values = src.load().to(cutlass.Float32) * scale_ptr[b * heads + h]
        # f32 -> e4m3 is cvt.rn.satfinite: round to nearest even, +-448 past the range.
        dst.store(values.to(cutlass.Float8E4M3FN))

    @cute.jit
    def _cast_feature_major(self, x_ptr, scale_ptr, out_ptr, seq_len, padded, heads, group):
        """Group = ((b * heads + h) * (d / 8) + feature block) * padded + s: keys fastest, so a
        warp reads 32 keys' 16 bytes (the other half of each 32-byte sector is read by the next
        feature block's warp, from L2) and writes 32 consecutive bytes per feature row."""
        d = self.head_dim
        s = group % padded
        rest = group // padded
        col = (rest % (d // VEC)) * VEC
        bh = rest // (d // VEC)
        values = cute.full((VEC,), 0.0, cutlass.Float32)
        if s < seq_len:
            b = bh // heads
            h = bh % heads
            src = cute.make_tensor(x_ptr + ((b * seq_len + s) * heads + h) * d + col,
                                   cute.make_layout(VEC))
            values = src.load().to(cutlass.Float32) * scale_ptr[bh]
        codes = cute.make_rmem_tensor((VEC,), cutlass.Float8E4M3FN)
        codes.store(values.to(cutlass.Float8E4M3FN))
        slot = s
        if cutlass.const_expr(self.permute_keys):
            slot = key_slot(s)
        base = (bh * d + col) * padded + slot
        for j in cutlass.range_constexpr(VEC):
            dst = cute.make_tensor(out_ptr + base + j * padded, cute.make_layout(1))
            dst[0] = codes[j]


def compile_scaled_cast(in_dtype: torch.dtype, head_dim: int, arch: str,
                        feature_major: bool = False, permute_keys: bool = False, *,
                        keep_ptx_in: str | None = None):
    """cute.compile the cast for `arch` (no GPU needed, like the attention kernels);
    keep_ptx_in: a directory to leave the PTX in (the CPU test reads it)."""
    from variants.dsl_compile import compile_for_arch

    kernel = ScaledCast(_dsl_dtype(in_dtype), head_dim, feature_major, permute_keys)
    fn, _, _ = compile_for_arch(kernel, arch, kernel.compile_args(),
                                keep="--keep-ptx" if keep_ptx_in else "", dump_dir=keep_ptx_in)
    return fn


def _device_arch(device: torch.device) -> str:
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"


def compiled(in_dtype: torch.dtype, head_dim: int, device: torch.device, *,
             feature_major: bool = False, permute_keys: bool = False, compile_now: bool = True):
    """The launchable cast for this dtype, head_dim and GPU, or None where there is none:
    compiled on first use (compile_now=False: only if compiled already, as inside a CUDA-graph
    capture, which must not see a module load). A compile failure (an arch this DSL build
    cannot target, say) is logged once and remembered: prepare then uses torch ops, which give
    the same codes, instead of failing."""
    key = (in_dtype, head_dim, _device_arch(device), feature_major, permute_keys)
    with _LOCK:
        if key not in _COMPILED and compile_now:
            try:
                _COMPILED[key] = compile_scaled_cast(*key)
            except Exception as exc:  # noqa: BLE001 - any DSL failure: fall back, loudly
                log.warning("fused e4m3 cast unavailable for %s (%s); prepare uses torch ops",
                            key, str(exc).strip().splitlines()[-1][:200] if str(exc) else exc)
                _COMPILED[key] = None
        return _COMPILED.get(key)


def scaled_cast_into(fn, out: torch.Tensor, x: torch.Tensor, scale: torch.Tensor, *,
                     feature_major: bool = False) -> None:
    """out (batch, padded, heads, head_dim) e4m3 <- x (batch, seq_len, heads, head_dim) times
    scale (batch, heads) fp32, zero rows past seq_len, with fn = compiled(...) for x; on x's
    device and torch's current stream. x must be contiguous and 16-byte aligned, head_dim a
    multiple of 8. feature_major (fn compiled so): out is (batch, heads, head_dim, padded)."""
    from cutlass.cute.runtime import make_ptr

    batch, seq_len, heads, head_dim = x.shape
    gmem = cute.AddressSpace.gmem
    stream = cuda.CUstream(torch.cuda.current_stream(x.device).cuda_stream)
    fn(make_ptr(_dsl_dtype(x.dtype), x.data_ptr(), gmem, assumed_align=16),
       make_ptr(cutlass.Float32, scale.data_ptr(), gmem, assumed_align=4),
       make_ptr(cutlass.Float8E4M3FN, out.data_ptr(), gmem, assumed_align=8),
       cutlass.Int32(batch), cutlass.Int32(seq_len),
       cutlass.Int32(out.shape[-1] if feature_major else out.shape[1]),
       cutlass.Int32(heads), stream)
