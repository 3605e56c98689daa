"""The random-sign Hadamard rotation of variants/transforms.py in CuTe DSL, on the rows a thread of
the one-pass quantization holds (variants/block_quantize_kernel.py), bit for bit transforms.rotate.

A row of head_dim features lies across `lanes` consecutive lanes of a warp (aligned to their
count), each lane holding `chunks` pieces of 8 features: feature c * (head_dim / chunks) + 8 *
lane + j is element (c, j) of the lane's row. So the feature index's bits are, low to high, j's
3 bits (in the thread), the lane's (across lanes), c's (in the thread), and the butterflies of
strides 1, 2, 4, ..., head_dim / 2 run in that order over them: in-thread pairs, then lane pairs
through shfl.sync.bfly, then in-thread pairs again.

Bit for bit: every in-thread add and subtract is add.rn.f32 / sub.rn.f32, which neither NVVM
nor ptxas contracts into an FMA with a neighbouring multiply. Across lanes a pair (lower, upper)
becomes (lower + upper, lower - upper) on both of its lanes as one fma.rn.f32(own, +-1, other):
the product by +-1 is exact, so the single rounding is that of other +- own (IEEE's a - b is
a + (-b), signed zeros included), one instruction where a sign flip and an add would be two.
The signs flip the sign bit (x * -1.0 exactly, -0 included); the one multiply by rotation_norm
comes last and is correctly rounded (mul.rn.f32).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute

from variants.transforms import HADAMARD_SIGN_BITS, rotation_norm, rotation_signs

RN = cute.math.RoundingMode.NEAREST_EVEN


@cute.jit
def add_exact(a, b):
    """fl32(a + b), never fused with a multiply."""
    return cute.math.add(a, b, rounding=RN)


@cute.jit
def sub_exact(a, b):
    """fl32(a - b), never fused with a multiply."""
    return cute.math.add(a, -b, rounding=RN)


@cute.jit
def flip_sign(x, mask):
    """x with its sign bit xor mask (0 or 1 << 31): x or -x, exactly."""
    return (x.bitcast(cutlass.Int32) ^ mask).bitcast(cutlass.Float32)


def check_head_dim(head_dim: int) -> None:
    """A ValueError unless the rotation has signs for head_dim (a power of two up to 128)."""
    rotation_signs(head_dim)


def sign_pattern(c: int, j: int, lanes: int, vec: int) -> int:
    """Bit l set: the sign of element (c, j) is flipped on the row's lane l (feature
    c * lanes * vec + l * vec + j); a compile-time constant of the layout."""
    first = c * lanes * vec + j
    return sum(((HADAMARD_SIGN_BITS >> (first + lane * vec)) & 1) << lane
               for lane in range(lanes))


@cute.jit
def _pairs_in_thread(values, stride: cutlass.Constexpr, in_chunk: cutlass.Constexpr):
    """One butterfly stage between elements of the thread: pairs (j, j + stride) of every chunk
    (in_chunk), else pairs of chunks (c, c + stride)."""
    rows, chunks, vec = values.shape
    for i in cutlass.range_constexpr(rows):
        for c in cutlass.range_constexpr(chunks):
            for j in cutlass.range_constexpr(vec):
                lower = (j & stride) == 0 if in_chunk else (c & stride) == 0
                if cutlass.const_expr(lower):
                    c2, j2 = (c, j + stride) if in_chunk else (c + stride, j)
                    a, b = values[i, c, j], values[i, c2, j2]
                    values[i, c, j] = add_exact(a, b)
                    values[i, c2, j2] = sub_exact(a, b)


@cute.jit
def rotate(values, lane, lanes: cutlass.Constexpr):
    """values (rows, chunks, 8) fp32 registers, row-wise, replaced by their rotation; every lane of
    the warp must call it (lane: this thread's index among its row's `lanes`)."""
    rows, chunks, vec = values.shape
    head_dim = chunks * lanes * vec
    check_head_dim(head_dim)
    for c in cutlass.range_constexpr(chunks):
        for j in cutlass.range_constexpr(vec):
            pattern = sign_pattern(c, j, lanes, vec)
            # Most elements need no lane-dependent work: kept (no lane flips) or flipped on all.
            if cutlass.const_expr(pattern != 0):
                mask = cutlass.Int32(-(2**31))
                if cutlass.const_expr(pattern != (1 << lanes) - 1):
                    mask = ((pattern >> lane) & 1) << 31
                for i in cutlass.range_constexpr(rows):
                    values[i, c, j] = flip_sign(values[i, c, j], mask)
    for s in cutlass.range_constexpr(vec.bit_length() - 1):
        _pairs_in_thread(values, 1 << s, True)
    for p in cutlass.range_constexpr(lanes.bit_length() - 1):
        # +1 on the lower lane, -1 on the upper: its sum is the lower's value less its own.
        own_sign = flip_sign(cutlass.Float32(1.0), ((lane >> p) & 1) << 31)
        for i in cutlass.range_constexpr(rows):
            for c in cutlass.range_constexpr(chunks):
                for j in cutlass.range_constexpr(vec):
                    mine = values[i, c, j]
                    other = cute.arch.shuffle_sync_bfly(mine, offset=1 << p)
                    values[i, c, j] = cute.math.fma(mine, own_sign, other, rounding=RN)
    for s in cutlass.range_constexpr(chunks.bit_length() - 1):
        _pairs_in_thread(values, 1 << s, False)
    norm = cutlass.Float32(rotation_norm(head_dim))
    for i in cutlass.range_constexpr(rows):
        for c in cutlass.range_constexpr(chunks):
            for j in cutlass.range_constexpr(vec):
                values[i, c, j] = cute.math.mul(values[i, c, j], norm, rounding=RN)
