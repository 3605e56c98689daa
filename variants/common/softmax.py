"""The online softmax arithmetic both families share, in the log2 domain.

Scores arrive as raw QK^T accumulator values; qk_log2 = dq * dk * softmax_scale * log2(e) turns
them into log2 units. P = 2^(s - m + shift): the row maximum m subtracted, and exp scaled by
2^shift (256 by default) so that P uses e4m3's range when it is rounded for P @ V; l sums the
unrounded P. Then LSE = ln 2 * (m - shift + log2 l) and O = (sum P V) * dv / l.

These are functions of DSL values, traced inline where the kernels call them (each kernel's
fragment layouts stay its own), so that the formulas exist once. A row's values are spread over
the four threads of a quad in both families' accumulators (quad_max, quad_sum).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute

LOG2_E = 1.4426950408889634
LN_2 = 0.6931471805599453
# P = exp(s - m) * 256 before rounding to e4m3: 2^8 folded into the exponent.
P_SHIFT_LOG2 = 8.0


def rescale_factor(m_old, m_new):
    """alpha = 2^(m_old - m_new): what O and l are multiplied by when the row maximum grows."""
    return cute.math.exp2(m_old - m_new, fastmath=True)


def exp2_argument(raw, qk_log2, m_new, shift=P_SHIFT_LOG2):
    """The exponent of P for raw scores: raw * qk_log2 - m + shift."""
    return raw * qk_log2 - (m_new - shift)


def block_exp2_argument(raw, coef, log2_sv, m_new, shift=P_SHIFT_LOG2):
    """With block scales (variants/block_scales.py): the exponent of P' = P * sv for raw scores
    of one 64-key block, raw * coef + log2 sv - m' + shift, coef = q_scale * k_scale * scale *
    log2(e); m' is the row maximum of raw * coef + log2 sv."""
    return raw * coef + (log2_sv - (m_new - shift))


def lse_natural(m, total, shift=P_SHIFT_LOG2):
    """LSE in natural-log units from the log2-domain maximum m and the sum l of P."""
    return (m - shift + cute.math.log2(total, fastmath=True)) * LN_2


def quad_max(x):
    """The maximum of x over the four threads of the quad (a row's max of the C fragment)."""
    x = cute.arch.fmax(x, cute.arch.shuffle_sync_bfly(x, offset=1))
    return cute.arch.fmax(x, cute.arch.shuffle_sync_bfly(x, offset=2))


def quad_sum(x):
    """The sum of x over the four threads of the quad (a row's sum l in the epilogue)."""
    total = x + cute.arch.shuffle_sync_bfly(x, offset=1)
    return total + cute.arch.shuffle_sync_bfly(total, offset=2)


@cute.jit
def max_to_subtract(m_new, causal: cutlass.Constexpr):
    """The row maximum the exponents subtract: with a causal mask a row that has seen no key
    yet (all -inf) subtracts 0, not -inf, so that its P and alpha are 0 instead of NaN."""
    m_use = m_new
    if cutlass.const_expr(causal):
        if m_new == -cutlass.Float32.inf:
            m_use = cutlass.Float32(0.0)
    return m_use


@cute.jit
def inverse_sum(total, causal: cutlass.Constexpr):
    """1 / l, O's normalization; with a causal mask a row that sees no key gets 0 (its output
    0, its LSE -inf)."""
    scale = 1.0 / total
    if cutlass.const_expr(causal):
        if total == 0.0:
            scale = cutlass.Float32(0.0)
    return scale
