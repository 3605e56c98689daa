"""K smoothing's vector on the GPU: m (batch, kv_heads, head_dim) fp32, the mean of keys 0, s,
2s, ... of each (batch, KV head) (variants/transforms.sample_stride), in one small launch.

torch.mean over the strided sample costs ~9.5 us of host time per call (its dispatch and
TensorIterator), a third of a repeated call's; a FastLaunch of this kernel costs a few. Any
vector keeps smoothing exact, so m need not match torch's rounding: prepare's GPU path and the
launch plans both use this kernel (their codes agree bit for bit), the torch path torch.mean,
and the gate bounds the difference (docs/gate.md, "smoothing vector").

One CTA per (batch, KV head). A thread owns 8 features (one 16-byte load) of every
`groups`-th sampled key, summed in fp32 in key order; the CTA then adds its groups' partial sums
in group order through shared memory and divides by the sample's size, as torch.mean does.

With pdl (sm_90 and later) each CTA first lets the launch after it start (programmatic dependent
launch: griddepcontrol.launch_dependents), so the quantization's q and v CTAs, which need
nothing of m, run beside this launch; its k CTAs wait for m (griddepcontrol.wait,
block_quantize_kernel.py).
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute

from variants.launch import STREAM, pointer, scalar

VEC = 8  # features per thread: one 16-byte load of bf16 or fp16
THREADS = 512  # 32 keys side by side at head_dim 128: a thread has at most 16 sampled keys
MEAN_ALIGN = 16  # bytes: the quantization reads m 16 bytes at a time


class KeyMean:
    """The launch for one input dtype and head_dim. Arguments: k, m, batch * kv_heads,
    seq_len_kv, kv_heads, the sample's stride and size, k's (batch, token, head) element strides
    (input_layout.row_strides), stream."""

    def __init__(self, in_dtype, head_dim: int, pdl: bool = False) -> None:
        self.pdl = pdl  # let the quantization launched after it start (PDL, sm_90 on)
        self.in_dtype = in_dtype
        self.head_dim = head_dim
        self.lanes = head_dim // VEC  # threads per key
        self.groups = THREADS // self.lanes  # keys summed side by side

    def slots(self):
        return (pointer(self.in_dtype.__name__, VEC * self.in_dtype.width // 8),
                pointer("Float32", MEAN_ALIGN), *(scalar("Int32"),) * 8, STREAM)

    def compile_args(self):
        """Stand-ins for the launch arguments (only types and alignments reach codegen)."""
        from cutlass.cute.runtime import make_fake_stream, make_ptr

        gmem = cute.AddressSpace.gmem
        k = make_ptr(self.in_dtype, 0, gmem, assumed_align=VEC * self.in_dtype.width // 8)
        mean = make_ptr(cutlass.Float32, 0, gmem, assumed_align=MEAN_ALIGN)
        return (k, mean, *(cutlass.Int32(1),) * 8, make_fake_stream())

    @cute.jit
    def __call__(self, k_ptr: cute.Pointer, mean_ptr: cute.Pointer, bh_count: cutlass.Int32,
                 seq_len_kv: cutlass.Int32, kv_heads: cutlass.Int32, stride: cutlass.Int32,
                 count: cutlass.Int32, k_sb: cutlass.Int32, k_ss: cutlass.Int32,
                 k_sh: cutlass.Int32, stream: cuda.CUstream):
        @cute.struct
        class SharedStorage:
            partial: cute.struct.Align[
                cute.struct.MemRange[cutlass.Float32, self.groups * self.head_dim], 16]

        self.kernel(k_ptr, mean_ptr, seq_len_kv, kv_heads, stride, count, k_sb, k_ss, k_sh,
                    SharedStorage).launch(
            grid=[bh_count, 1, 1], block=[THREADS, 1, 1], smem=SharedStorage.size_in_bytes(),
            stream=stream)

    @cute.kernel
    def kernel(self, k_ptr: cute.Pointer, mean_ptr: cute.Pointer, seq_len_kv: cutlass.Int32,
               kv_heads: cutlass.Int32, stride: cutlass.Int32, count: cutlass.Int32,
               k_sb: cutlass.Int32, k_ss: cutlass.Int32, k_sh: cutlass.Int32,
               SharedStorage: cutlass.Constexpr):
        if cutlass.const_expr(self.pdl):  # the quantization's q and v CTAs need nothing of m
            cute.arch.griddepcontrol_launch_dependents()
        bh, _, _ = cute.arch.block_idx()
        tidx, _, _ = cute.arch.thread_idx()
        storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
        b, h = bh // kv_heads, bh % kv_heads
        group = tidx // self.lanes
        col = (tidx % self.lanes) * VEC
        acc = cute.make_rmem_tensor(cute.make_layout(VEC), cutlass.Float32)
        acc.fill(0.0)
        for j in cutlass.range(group, count, self.groups, unroll=8):  # 8 loads in flight
            # Strides of whole 16-byte pieces (input_layout.row_strides): vector loads.
            at = k_ptr + cute.assume(b * k_sb + j * stride * k_ss + h * k_sh + col, divby=VEC)
            src = cute.make_tensor(at, cute.make_layout(VEC))
            acc.store(acc.load() + src.load().to(cutlass.Float32))
        partial = storage.partial.get_tensor(
            cute.make_layout((self.groups, self.head_dim), stride=(self.head_dim, 1)))
        for i in cutlass.range_constexpr(VEC):
            partial[group, col + i] = acc[i]
        cute.arch.sync_threads()
        if tidx < self.head_dim:
            total = cutlass.Float32(0.0)
            for g in cutlass.range_constexpr(self.groups):
                total = total + partial[g, tidx]
            dst = cute.make_tensor(mean_ptr + (bh * self.head_dim + tidx), cute.make_layout(1))
            dst[0] = total / count.to(cutlass.Float32)


def launch_scalars(k_shape) -> tuple[int, ...]:
    """The launch's scalars that k's shape (batch, seq_len_kv, kv_heads, head_dim) decides:
    batch * kv_heads, seq_len_kv, kv_heads, stride and size of the sample. The caller appends
    k's (batch, token, head) strides (input_layout.row_strides), which each call's k decides."""
    from variants.transforms import sample_stride

    batch, seq_len_kv, kv_heads, _ = k_shape
    stride = sample_stride(seq_len_kv)
    return batch * kv_heads, seq_len_kv, kv_heads, stride, -(-seq_len_kv // stride)
