"""Inline PTX of the wgmma family: the FMA-pipe exp2 (fma_exp2) and the ldmatrix/stmatrix
pair of the in-smem V transpose (v_layout=kernel). tests/test_wgmma_exp2.py executes the
exp2 string on the CPU."""

from __future__ import annotations

import struct

import cutlass
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op


def _f32_hex(value: float) -> str:
    """A PTX f32 immediate (0fXXXXXXXX) holding `value` rounded to f32."""
    bits = struct.unpack("<I", struct.pack("<f", value))[0]
    return f"0f{bits:08X}"


# 2^f on [0, 1) by a cubic with p(0) = 1 and minimax relative error 8.6e-5 (fitted by iteratively
# reweighted least squares; far below e4m3's 2^-4 step, and P is rounded to e4m3 right after).
# p stays in [1, 2), so its f32 exponent is 127 and adding floor(x) << 23 cannot wrap.
EXP2_CUBIC = (1.0, 0.6951167204170259, 0.2276452835588959, 0.0770667753608423)
# 1.5 * 2^23: adding it rounds to an integer (f32 spacing 1 there) and leaves that integer in the
# low mantissa bits, two's complement, for |x| < 2^22.
_ROUND_MAGIC = 12582912.0
# Clamp: below it the exponent field would underflow. -127 (masked keys: -inf) gives exactly +0;
# (-127, -126) gives a denormal up to 2x off, which rounds to e4m3 zero like the true value.
# Valid range [-126, 128); the kernel's arguments are <= 8 (the row max minus itself plus 8).
_EXP2_FLOOR = -127.0

_EXP2_POLYNOMIAL_PTX = (
    "{\n"
    ".reg .f32 x, t, j, f, p;\n"
    ".reg .b32 e, b;\n"
    f"max.NaN.f32 x, $1, {_f32_hex(_EXP2_FLOOR)};\n"   # NaN stays NaN, as ex2 keeps it
    f"add.rm.f32 t, x, {_f32_hex(_ROUND_MAGIC)};\n"   # floor(x) in t's low bits
    f"sub.rn.f32 j, t, {_f32_hex(_ROUND_MAGIC)};\n"   # floor(x), exact
    "sub.rn.f32 f, x, j;\n"                            # fraction in [0, 1)
    f"fma.rn.f32 p, f, {_f32_hex(EXP2_CUBIC[3])}, {_f32_hex(EXP2_CUBIC[2])};\n"
    f"fma.rn.f32 p, p, f, {_f32_hex(EXP2_CUBIC[1])};\n"
    f"fma.rn.f32 p, p, f, {_f32_hex(EXP2_CUBIC[0])};\n"
    "mov.b32 e, t;\n"
    "shl.b32 e, e, 23;\n"                              # floor(x) << 23: the exponent step
    "mov.b32 b, p;\n"
    "add.s32 b, b, e;\n"
    "mov.b32 $0, b;\n"
    "}"
)


@dsl_user_op
def _exp2_polynomial(x, *, loc=None, ip=None):
    """2^x on the FMA and integer pipes (no MUFU): 2^floor(x) * cubic(x - floor(x)), the power of
    two added to the f32 exponent bits. Relative error <= 1.5e-4 on [-126, 128) (the cubic's
    8.6e-5 plus f32 rounding); -inf gives +0 and NaN gives NaN, as MUFU ex2 does."""
    return cutlass.Float32(llvm.inline_asm(
        T.f32(), [cutlass.Float32(x).ir_value(loc=loc, ip=ip)], _EXP2_POLYNOMIAL_PTX, "=f,f",
        has_side_effects=False, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
        loc=loc, ip=ip))


@dsl_user_op
def _ldmatrix_x4_trans(ptr, *, loc=None, ip=None):
    """ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 from the row address `ptr` (smem) of
    this lane: lanes 8t .. 8t + 7 address rows 0-7 of tile t; returns the 4 tiles' words."""
    words = llvm.inline_asm(
        llvm.StructType.get_literal([T.i32()] * 4),
        [cutlass.Int32(ptr.toint()).ir_value(loc=loc, ip=ip)],
        "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {$0, $1, $2, $3}, [$4];",
        "=r,=r,=r,=r,r,~{memory}", has_side_effects=True, is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip)
    return [cutlass.Uint32(llvm.extractvalue(T.i32(), words, [t], loc=loc, ip=ip))
            for t in range(4)]


@dsl_user_op
def _stmatrix_x4(ptr, words, *, loc=None, ip=None):
    """stmatrix.sync.aligned.m8n8.x4.shared.b16 of `words` (tile t = words[t]) to the row
    address `ptr` (smem) of this lane: lanes 8t .. 8t + 7 address rows 0-7 of tile t."""
    operands = [cutlass.Int32(ptr.toint()).ir_value(loc=loc, ip=ip)]
    operands += [cutlass.Uint32(w).ir_value(loc=loc, ip=ip) for w in words]
    llvm.inline_asm(
        None, operands,
        "stmatrix.sync.aligned.m8n8.x4.shared.b16 [$0], {$1, $2, $3, $4};",
        "r,r,r,r,r,~{memory}", has_side_effects=True, is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip)
