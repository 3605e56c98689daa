"""qk_dtype=int8: QK^T as an s8 wgmma (m64 n<block_n> k32, s32 accumulator) on int8 Q and K codes
with the same block scales as e4m3's (amax / 127: variants/block_scales.py).

The accumulator is exact: |S| <= head_dim * 127^2 = 2,064,512 at head_dim 128, below 2^22. It
lives in S's f32 registers seen as s32 (`s32_view`), and `scores_to_f32` turns it into f32 in
place before the mask and the softmax, which then run as with e4m3: an integer add of the bits
of 1.5 * 2^23 puts s in the low mantissa bits of an f32 of exponent 23 (exact for |s| < 2^22),
and one f32 subtraction of 1.5 * 2^23 leaves s exactly. Two full-rate instructions a score,
where I2F converts 16 values a clock per SM on sm_90 (the CUDA programming guide's table), the
rate of MUFU's ex2 that the softmax already keeps busy.
"""

from __future__ import annotations

import struct

import cutlass
import cutlass.cute as cute

QK8 = cutlass.Int8
# 1.5 * 2^23 and its f32 bits: adding s to the bits adds s to the value for |s| < 2^22.
ROUND_MAGIC = 12582912.0
ROUND_MAGIC_BITS = struct.unpack("<i", struct.pack("<f", ROUND_MAGIC))[0]


def qk_operand(qk_int8: bool):
    """The element type of Q's and K's shared tiles and of the QK^T wgmma's operands."""
    return QK8 if qk_int8 else cutlass.Float8E4M3FN


def qk_accumulator(qk_int8: bool):
    """The QK^T wgmma's accumulator type."""
    return cutlass.Int32 if qk_int8 else cutlass.Float32


def s32_view(acc_S):
    """S's f32 accumulator registers as the s32 accumulator of the s8 wgmma."""
    return cute.recast_tensor(acc_S, cutlass.Int32)


@cute.jit
def scores_to_f32(acc_S):
    """S's s32 values (in its registers) made f32, exactly, in place."""
    bits = s32_view(acc_S)
    bits.store(bits.load() + ROUND_MAGIC_BITS)
    acc_S.store(acc_S.load() - ROUND_MAGIC)
