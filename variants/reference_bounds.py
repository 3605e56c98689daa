"""The correctness gate's acceptance thresholds, each with its derivation: the only place they
live. variants/reference.py computes the fp32 reference and compares a kernel's output with it
under these bounds; variants/prepare_check.py holds prepare's transforms to the last two of
them. docs/gate.md summarizes them."""

from __future__ import annotations

# The kernel rounds P = 256 * exp(s - m) to e4m3 before P @ V. e4m3 keeps 3 mantissa bits, so a
# normal value is off by at most half an ulp: a relative error of 2^-4 (uniform rounding error
# has an RMS of 2^-4/sqrt(3) = 3.6%). Each output element O_j = sum_i p_i v_ij / l is then off by
# a p-weighted average of per-key errors each within 2^-4 |p_i v_ij|: relative RMS over the whole
# output is at most 2^-4.
REL_RMS_MAX = 2.0**-4
# Per query row, the error vector e = sum_i d_i p_i v_i / l (|d_i| <= 2^-4, independent roundings)
# has E|e|^2 <= 2^-8 sum_i p_i^2 |v_i|^2 / l^2: its scale is the `noise` norm
# sqrt(sum_i p_i^2 |v_i|^2) of the normalized weights, which equals |O_row| for a row peaked on
# one key and exceeds it for a diffuse row, whose output averages V rows that cancel. So the row
# error is measured relative to max(|ref row|, noise, floor) and may reach 2x the per-element
# 2^-4: the margin covers P values in e4m3's subnormal range (absolute spacing 2^-17 in units of
# the row maximum, so an incoherent sum over S keys of at most sqrt(S) 2^-18 max|v|: the floor
# below), the QK^T accumulator error of LSE_QK_REL (scores off by at most a few percent of a
# unit in the gate's inputs) and bf16 output rounding (2^-9). A row mix-up, a masking bug or an
# unwritten row is an O(1) error on this scale.
ROW_REL_MAX = 2.0**-3
ROW_FLOOR_PER_SQRT_KEY = 2.0**-16  # x sqrt(S) x RMS of |v_i|: 4x the subnormal bound above
# The least-squares slope of a head's output on its reference, sum(o r) / sum(r r), is 1 up to
# unbiased rounding (round-to-nearest-even P and bf16; their mean over S x D elements vanishes
# like 1/sqrt(S D)) plus the systematic part of the accumulators' error (< 2^-10 measured on the
# H200, docs/gate.md). A wrong descale, a missing 1/l term or a dropped tile of keys
# scales a head by a few percent or more; 2^-6 = 1.6% catches a 3% error with 2x margin.
HEAD_SLOPE_MAX = 2.0**-6
# A head of few rows averages little: a row whose weight sits on one key takes that key's P
# rounding (up to half an e4m3 step, 2^-4) as its scale, and n independent rows 2^-4 / sqrt(n).
# So a head of n checked rows may be off by max(HEAD_SLOPE_MAX, ROW_SCALE_NOISE / sqrt(n)):
# HEAD_SLOPE_MAX from 16 rows on.
ROW_SCALE_NOISE = 2.0**-4
# ROW_REL_MAX's margin covers QK^T accumulator errors of a few percent of a unit: LSE_QK_REL
# (below) of a score magnitude up to ROW_QK_COVERED, which the random and structured cases stay
# under (~7 for unit-variance inputs at head_dim 128, ~11 on peaked rows). The realistic case's
# K bias and outlier channels reach magnitudes of ~250 without smoothing (~30 with it), where
# the FP8 wgmma accumulator moves scores by up to ~0.5 of a unit, differently per key: to first
# order the output moves by sum_i p_i (d_i - mean d)(v_i - o), at most max |d_i - mean d| times
# the p-weighted spread of the V rows around o, sqrt(sum_i p_i |v_i - o|^2). So a row's scale
# gains (LSE_QK_REL / ROW_REL_MAX) x (magnitude - ROW_QK_COVERED, if positive) x that spread.
# (A truncating accumulator emulated on the CPU, -4e-4 of the magnitude on same-sign operands,
# below the H200's -6.1e-4, puts a correct unsmoothed kernel's realistic rows at 0.128 without
# this term, at 0.01 with it; the random and structured cases do not move.)
ROW_QK_COVERED = 16.0
# LSE = m + log(l) with m from the QK^T accumulator and l an fp32 sum of exp2.approx values
# (relative error 2^-22 each; a sum of S <= 2^17 terms loses at most ~S 2^-24 relative, in
# practice sqrt(S) 2^-24): 2^-8 absolute covers that and lg2.approx. On top of it comes the error
# of the scores, which LSE averages with the row's own weights (d LSE / d s_j = p_j). The FP8
# wgmma accumulator is no fp32 accumulator: it truncates (docs/gate.md, "QK^T
# accumulator", H200): a score's error grows with sum_d |q_d k_d| (cuBLAS FP8 GEMM with the
# tensor core accumulating alone: -6.1e-4 mean, 1.9e-3 max of it at K = 128 on same-sign
# operands, 10x less at K = 32), and the wgmma kernel's LSE on peaked rows is off by up to
# 1.47e-3 of that magnitude at head_dim 128 (0.125 at LSE = 111; 2.0 at LSE = 1856), 8.8e-4 at
# head_dim 64, while mma_sync (fp32 accumulation) stays at 3e-7. So the bound grows with the
# row's p-weighted score magnitude sum_j p_j scale sum_d |q_d k_jd|, with a 2.7x margin over the
# H200 measurement. A masking bug moves LSE by O(0.1 .. 1) at any magnitude.
LSE_ABS_MAX = 2.0**-8
LSE_QK_REL = 2.0**-8
# Masks and other key/value lengths change none of the above: every sum runs over the keys a row
# sees (a causal row i: the first i + seq_len_kv - seq_len + 1; masked keys have p = 0 in the
# reference and must have it in the kernel), so each bound holds per row with S the number of
# keys it sees. The floor's sqrt(S) x RMS |v_i| is computed as the norm of the visible keys' V
# rows, sqrt(sum_visible |v_i|^2) (the same number for an unmasked row). The noise, the score
# magnitude and the head slope weight keys by p and so exclude masked ones already. A row that
# sees no key has nothing to round: its output must be exactly 0 and its LSE exactly -inf.
# K smoothing (variants/transforms.py). The candidate's m and the gate's are fp32 sums of the
# same n keys in different orders (a GPU reduction, torch's, the gate's), then one division: each
# is within (n - 1) 2^-24 sum_i |k_id| of the exact sum, so they differ by at most about
# 2 n 2^-24 mean_i |k_id| (the division's rounding is below an ulp of |m_d| <= mean_i |k_id|).
# The sample holds n < 2 MEAN_SAMPLE_KEYS = 512 keys: 2^-14 of the sample's mean |k_d|, with 2x
# margin below. Another head's or batch's mean differs by the keys' spread over sqrt(n), >= 2^-5
# of it, and the gate then quantizes k - m with the candidate's m, so its codes compare exactly.
MEAN_SUM_REL = 2.0**-13
# The LSE shift softmax_scale * q . m: the candidate's dot product (the GPU quantization's, or
# torch's) and the gate's sum the same head_dim products in other orders, each within
# d 2^-24 sum_d |q_d m_d| of the exact one: 2^-16 of scale * sum_d |q_d m_d| at d = 128 for both,
# 2x margin below; the add to the LSE rounds once more, inside LSE_ABS_MAX. A shift left out, or
# of another head's m, is off by scale * |q . m|, which the realistic case makes O(10..100).
LSE_SHIFT_REL = 2.0**-15
# P.V in 16 bits (wgmma pv_dtype="bf16"): P is rounded to bf16 (8 significant bits: 2^-8 of
# itself at most) and V is not quantized, so P's share of the bounds above shrinks 16x and the
# QK^T accumulator's error, hidden under e4m3 P's, is the largest term: a truncating accumulator
# at 1.4x the H200's measured LSE slope (2e-3 of the score magnitude, emulated on the CPU) moves
# the structured case's worst row by 0.021 of its scale and the realistic case's (magnitudes
# ~250 unsmoothed) relative RMS by 0.0065. So a row may reach 2^-4 and the RMS 2^-6 (2.4x and
# 3x that). A kernel that rounds P or V to e4m3 anyway is off by e4m3's 2^-4 / sqrt(3) RMS per
# element: 0.022-0.028 relative RMS on the random case (tests/test_pv16_accuracy.py), so it
# fails the RMS bound; the row bound is for bugs of O(1).
REL_RMS_MAX_BF16_P = 2.0**-6
ROW_REL_MAX_BF16_P = 2.0**-4


def thresholds(p16: bool) -> tuple[float, float]:
    """(relative RMS bound, worst-row bound) for P in e4m3, or in bf16 with V unquantized."""
    return (REL_RMS_MAX_BF16_P, ROW_REL_MAX_BF16_P) if p16 else (REL_RMS_MAX, ROW_REL_MAX)
