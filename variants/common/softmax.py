"""The online softmax arithmetic both families share, in the log2 domain.

Scores arrive as raw QK^T accumulator values; qk_log2 = dq * dk * softmax_scale * log2(e) turns
them into log2 units. P = 2^(s - m + shift): the row maximum m subtracted, and exp scaled by
2^shift (256 by default) so that P uses e4m3's range when it is rounded for P @ V; l sums the
unrounded P. Then LSE = ln 2 * (m - shift + log2 l) and O = (sum P V) * dv / l.

These are plain functions of DSL values, traced inline where the kernels call them (each
kernel's fragment layouts, reductions and masks stay its own), so that the formulas exist once.
"""

from __future__ import annotations

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
