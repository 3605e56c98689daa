"""The launch ABI every family's compiled function takes, declared once.

    q, k, v, scales, o, lse, workspace pointers; batch, heads, seq_len, padded_len, softmax_scale,
    kv_heads, seq_len_kv, padded_len_kv; then a family's extra scalars (wgmma: the persistent
    grid size); then the CUDA stream.

heads, seq_len and padded_len are q's (and O's and LSE's); kv_heads, seq_len_kv and
padded_len_kv are k's and v's (grouped-query attention: query head h reads KV head
h // (heads // kv_heads)). `scales` is the packed block scales (block_scale_views).
`workspace` is fp32 scratch sized per launch by the family's workspace_words hook
(build.compile_cached; wgmma's split_tail: the tail pieces' partial O and the counters,
variants/wgmma/split_tail.py); the address is 0 where a kernel needs none, and kernels that
need none ignore it.

`fake_args` gives the stand-ins a compile traces with (only types and alignments reach code
generation), `slots` the argument kinds variants/launch.py launches with, `launch_values` the
raw values from prepared inputs and output buffers, and
`block_scale_views` and `output_views` the kernel-side tensors of the buffers every family
shares. A kernel's @cute.jit
`__call__` spells the same parameters (CuTe DSL needs them written out):
tests/test_import_graph.py checks each one against ABI_NAMES.
"""

from __future__ import annotations

# (name, element type name in cutlass, assumed alignment in bytes) of the pointer arguments.
POINTERS = (("q_ptr", "Float8E4M3FN", 16), ("k_ptr", "Float8E4M3FN", 16),
            ("v_ptr", "Float8E4M3FN", 16), ("scales_ptr", "Float32", 4),
            ("o_ptr", "BFloat16", 16), ("lse_ptr", "Float32", 4),
            ("workspace_ptr", "Float32", 16))
# (name, cutlass scalar type name) of the scalars after them.
SCALARS = (("batch", "Int32"), ("heads", "Int32"), ("seq_len", "Int32"),
           ("padded_len", "Int32"), ("softmax_scale", "Float32"), ("kv_heads", "Int32"),
           ("seq_len_kv", "Int32"), ("padded_len_kv", "Int32"))
ABI_NAMES = tuple(n for n, _, _ in POINTERS) + tuple(n for n, _ in SCALARS)
# q_ptr's element type when the kernel quantizes Q itself (Config.q_in_kernel): the caller's
# bf16 (batch, seq_len, heads, head_dim), unpadded.
Q_IN_KERNEL_DTYPE = "BFloat16"
# v_ptr's element type when the kernel reads V unquantized (Config.v_unquantized): bf16
# (batch, seq_len_kv, kv_heads, head_dim), unpadded.
V_UNQUANTIZED_DTYPE = "BFloat16"
# q_ptr's and k_ptr's element type when QK^T is an integer GEMM (Config.qk_int8): int8 codes in
# the e4m3 codes' layouts.
QK_INT8_DTYPE = "Int8"


def _pointer_types(q_in_kernel: bool, v_unquantized: bool = False, qk_int8: bool = False):
    types = list(POINTERS)
    if qk_int8:
        types[0], types[1] = ("q_ptr", QK_INT8_DTYPE, 16), ("k_ptr", QK_INT8_DTYPE, 16)
    if q_in_kernel:
        types[0] = ("q_ptr", Q_IN_KERNEL_DTYPE, 16)
    if v_unquantized:
        types[2] = ("v_ptr", V_UNQUANTIZED_DTYPE, 16)
    return tuple(types)


def _pointers(addresses, q_in_kernel: bool, v_unquantized: bool = False, qk_int8: bool = False):
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_ptr

    gmem = cute.AddressSpace.gmem
    return tuple(make_ptr(getattr(cutlass, dtype), address, gmem, assumed_align=align)
                 for (_, dtype, align), address in zip(
                     _pointer_types(q_in_kernel, v_unquantized, qk_int8), addresses,
                     strict=True))


def _scalars(values):
    import cutlass

    return tuple(getattr(cutlass, dtype)(value)
                 for (_, dtype), value in zip(SCALARS, values, strict=True))


def fake_args(*, extra: tuple = (), q_in_kernel: bool = False,
              v_unquantized: bool = False, qk_int8: bool = False) -> tuple:
    """Stand-ins for the launch arguments: only types and alignments reach code generation."""
    from cutlass.cute.runtime import make_fake_stream

    return (*_pointers((0,) * len(POINTERS), q_in_kernel, v_unquantized, qk_int8),
            *_scalars((1, 1, 1, 256, 1.0, 1, 1, 256)), *extra, make_fake_stream())


def slots(extra: int = 0, *, q_in_kernel: bool = False, v_unquantized: bool = False,
          qk_int8: bool = False) -> tuple:
    """The launch slots (variants.launch.Slot) of the ABI with `extra` Int32 scalars."""
    from variants.launch import STREAM, pointer, scalar

    return (*(pointer(dtype, align)
              for _, dtype, align in _pointer_types(q_in_kernel, v_unquantized, qk_int8)),
            *(scalar(dtype) for _, dtype in SCALARS), *(scalar("Int32"),) * extra, STREAM)


def launch_values(prepared, out, lse, stream: int, *, extra: tuple = (),
                  workspace: int = 0) -> tuple:
    """The raw values of one launch on prepared inputs (variants.prepare.Fp8Inputs) into out/lse,
    in the order of slots(): addresses (the workspace's, 0 for none), scalars, the family's
    extra ints, the stream handle."""
    return (prepared.q.data_ptr(), prepared.k.data_ptr(), prepared.v.data_ptr(),
            prepared.packed.data_ptr(), out.data_ptr(), lse.data_ptr(), workspace,
            *launch_scalars(prepared), *extra, stream)


def launch_scalars(prepared) -> tuple:
    """The SCALARS of a launch on prepared inputs, in their order (softmax_scale at SCALE_AT)."""
    batch, _, heads, _ = prepared.q.shape  # q is unpadded when the kernel quantizes it
    _, padded_kv, kv_heads, _ = prepared.k.shape
    return (batch, heads, prepared.seq_len, prepared.padded_len, prepared.softmax_scale,
            kv_heads, prepared.seq_len_kv, padded_kv)


SCALE_AT = [name for name, _ in SCALARS].index("softmax_scale")


def block_scale_views(scales_ptr, batch, heads, padded_len, kv_heads, padded_len_kv) -> tuple:
    """The kernels' views of the packed block scales (variants/block_scales.py), in the order
    prepare writes them behind one pointer (block_scales.PackedLayout): q's (batch, heads,
    padded_len) per token, then K's, log2 of V's and 1 / V's, each (batch, kv_heads,
    ceil(padded_len_kv / 64)) per 64-key block (V's own descale follows; the kernels do not
    read it). Called at trace time from a kernel's @cute.jit entry point."""
    import cutlass.cute as cute

    q_size, blocks, kv_size = _packed_sizes(batch, heads, padded_len, kv_heads, padded_len_kv)
    m_q = cute.make_tensor(
        scales_ptr, cute.make_ordered_layout((batch, heads, padded_len), order=(2, 1, 0)))
    kv_layout = cute.make_ordered_layout((batch, kv_heads, blocks), order=(2, 1, 0))
    kv = tuple(cute.make_tensor(scales_ptr + (q_size + i * kv_size), kv_layout) for i in range(3))
    return (m_q, *kv)


def kv_block_scales_view(scales_ptr, batch, heads, padded_len, kv_heads, padded_len_kv):
    """K's, log2 of V's and 1 / V's block scales of the packed buffer as one (3, batch, kv_heads,
    blocks) tensor (the three views of block_scale_views stacked), so that a thread can pick
    which of the three it loads at run time. Called at trace time from a kernel's @cute.jit
    entry point."""
    import cutlass.cute as cute

    q_size, blocks, kv_size = _packed_sizes(batch, heads, padded_len, kv_heads, padded_len_kv)
    layout = cute.make_layout((3, batch, kv_heads, blocks),
                              stride=(kv_size, kv_heads * blocks, blocks, 1))
    return cute.make_tensor(scales_ptr + q_size, layout)


def _packed_sizes(batch, heads, padded_len, kv_heads, padded_len_kv) -> tuple:
    """(q's values, 64-key blocks per KV head, each K/V part's values) of the packed scales,
    block_scales.PackedLayout's arithmetic on the kernels' run-time values."""
    blocks = (padded_len_kv + 63) // 64
    return batch * heads * padded_len, blocks, batch * kv_heads * blocks


def output_views(o_ptr, lse_ptr, batch, heads, seq_len, head_dim: int) -> tuple:
    """The kernels' views of the output buffers, in the layouts CompiledKernel.run gives them:
    O (batch, seq_len, heads, head_dim) bf16, LSE (batch, heads, seq_len) fp32. Called at trace
    time from a kernel's @cute.jit entry point."""
    import cutlass.cute as cute

    m_o = cute.make_tensor(
        o_ptr, cute.make_ordered_layout((batch, seq_len, heads, head_dim), order=(3, 2, 1, 0)))
    m_lse = cute.make_tensor(
        lse_ptr, cute.make_ordered_layout((batch, heads, seq_len), order=(2, 1, 0)))
    return m_o, m_lse
