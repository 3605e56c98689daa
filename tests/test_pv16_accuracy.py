"""P.V in 16 bits on the CPU, before any GPU run: the kernels' arithmetic with bf16 P and V
unquantized (block_scales.folded_attention on what quantize_inputs writes) against fp32 attention
on the original inputs, and the gate's bf16-P thresholds (variants/reference_bounds.py) against
emulated kernels: a correct one with a truncating QK^T accumulator passes, one that rounds P or V
to e4m3 does not.

What the emulation says (B=1 H=2 S=1024 head_dim 128, tuner.activations seed 0): e4m3 Q, K, P
and V each cost about 0.025 relative RMS, adding in quadrature to FP8's 0.051; bf16 P.V removes
two of the four (0.0375, and with K smoothing the same on the K-bias kinds), the rest is QK^T's
(0.0022 with Q and K unquantized). docs/accuracy.md has the table.
"""

from __future__ import annotations

import math

import pytest
import torch

from tests.doubles import folded
from tuner.activations import activations
from tuner.gate import case_inputs, gate_cases, validate_kernel
from tuner.problem import Problem
from variants.block_scales import folded_attention, quantize_key_blocks
from variants.prepare import quantize_inputs
from variants.reference import (
    accuracy,
    causal_masked,
    end_to_end_error,
    quantize_reference,
    reference_attention,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROBLEM = Problem(1, 2, 1024, 128)


def _emulated_error(kind: str, smoothing: str, pv_dtype: str) -> float:
    """End-to-end relative RMS of the kernels' arithmetic (folded_attention, 128-key strips)
    on the codes prepare writes for this setting."""
    q, k, v = activations(kind, PROBLEM, "cpu", seed=0)
    unquantized = pv_dtype == "bf16"
    prepared = quantize_inputs(q, k, v, pad_to=128, v_feature_major=False,
                               k_smoothing=smoothing, v_unquantized=unquantized)
    skv = prepared.seq_len_kv
    q_codes, q_descale = prepared.q_codes_and_descales()
    scales = prepared.scales
    out, _ = folded_attention(
        q_codes, q_descale.permute(0, 2, 1), prepared.k[:, :skv], scales.k.permute(0, 2, 1),
        prepared.v[:, :skv], scales.v.permute(0, 2, 1), softmax_scale=prepared.softmax_scale,
        p_dtype=torch.bfloat16 if unquantized else torch.float8_e4m3fn)
    return end_to_end_error(out.bfloat16(), q, k, v)


@pytest.mark.parametrize("kind, smoothing", [("randn", "off"), ("k_bias_8", "mean"),
                                             ("k_bias_20", "mean")])
def test_bf16_pv_removes_the_p_and_v_rounding_of_fp8(kind, smoothing):
    ours = _emulated_error(kind, smoothing, "bf16")
    fp8 = _emulated_error(kind, smoothing, "e4m3")
    assert ours <= 0.04 and ours <= 0.8 * fp8, (ours, fp8)


def test_what_bf16_pv_leaves_is_the_e4m3_rounding_of_q_and_k():
    """With Q and K unquantized (scales 1, fp32 values as codes) the same arithmetic is within
    bf16's own rounding of fp32 attention: the floor above is QK^T's."""
    q, k, v = activations("randn", PROBLEM, "cpu", seed=0)
    ones_q, ones_kv = torch.ones(1, 1024, 2), torch.ones(1, 16, 2)
    out, _ = folded_attention(q.float(), ones_q, k.float(), ones_kv, v, ones_kv,
                              softmax_scale=128**-0.5, p_dtype=torch.bfloat16)
    assert end_to_end_error(out.bfloat16(), q, k, v) <= 0.005


def _emulated_kernel(ref_inputs, causal: bool, *, truncation: float = 0.0,
                     p_dtype=torch.bfloat16, v_e4m3: bool = False):
    """(out, lse) of a kernel on the gate's inputs: scores less `truncation` x scale x
    sum_d |q_d k_d| (a truncating accumulator), P = 256 exp(s - m) rounded to p_dtype, V as the
    gate holds it (bf16) or rounded to e4m3 with its block scales, l from the unrounded P."""
    q, k, v = ref_inputs.dequantized()
    if v_e4m3:
        codes, descale = quantize_key_blocks(v)
        v = codes.float() * descale.repeat_interleave(64, dim=1)[:, :v.shape[1], :, None]
    batch, seq, heads, _ = q.shape
    group, scale = ref_inputs.group, ref_inputs.softmax_scale
    out = torch.zeros(batch, seq, heads, q.shape[-1])
    lse = torch.full((batch, heads, seq), -math.inf)
    rows = torch.arange(seq)
    for b in range(batch):
        for h in range(heads):
            qh, kh, vh = q[b, :, h], k[b, :, h // group], v[b, :, h // group]
            s = (qh @ kh.t() - truncation * (qh.abs() @ kh.abs().t())) * scale
            if causal:
                s = s.masked_fill(causal_masked(rows, seq, kh.shape[0]), -math.inf)
            m = s.amax(-1, keepdim=True)
            m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
            p = torch.exp(s - m)
            total = p.sum(-1, keepdim=True)
            seen = total > 0
            p_rounded = (p * 256).to(p_dtype).float() / 256
            out[b, :, h] = torch.where(seen, (p_rounded @ vh) / total.clamp_min(1e-30), 0.0)
            lse[b, h] = torch.where(seen, m + total.log(), -math.inf)[:, 0]
    return out.bfloat16(), lse


def _gate_metrics(problem, **kernel):
    """The gate's metrics of the emulated kernel on each of the gate's cases (P.V in 16 bits:
    the reference with V unquantized, the bf16 thresholds)."""
    metrics = []
    for index, case in enumerate(gate_cases(problem)):
        q, k, v = case_inputs(case, problem.head_dim, "cpu", seed=7 + index)
        ref_inputs = quantize_reference(q, k, v, case.softmax_scale(problem.head_dim),
                                        v_unquantized=True)
        out, lse = _emulated_kernel(ref_inputs, case.causal, **kernel)
        metrics.append(accuracy(out, lse, reference_attention(ref_inputs, causal=case.causal)))
    return metrics


GATE_PROBLEMS = [Problem(1, 2, 300, 128), Problem(2, 4, 70, 64, True, 50, 2)]


@pytest.mark.parametrize("problem", GATE_PROBLEMS, ids=lambda p: p.key())
def test_the_bf16_thresholds_leave_room_for_the_qk_accumulator(problem):
    """A truncating accumulator at 2e-3 of the score magnitude (1.4x the wgmma kernel's LSE
    slope on the H200) passes every case, within half of each bound."""
    for m in _gate_metrics(problem, truncation=2e-3):
        assert m.passed, m.reason
        assert m.p16 and m.rel_rms <= 0.5 * 2**-6 and m.worst_row <= 0.5 * 2**-4, m


@pytest.mark.parametrize("problem", GATE_PROBLEMS, ids=lambda p: p.key())
@pytest.mark.parametrize("wrong", [dict(p_dtype=torch.float8_e4m3fn), dict(v_e4m3=True)],
                         ids=["p-e4m3", "v-e4m3"])
def test_a_kernel_that_rounds_p_or_v_to_e4m3_fails_the_bf16_thresholds(problem, wrong):
    random_case = _gate_metrics(problem, **wrong)[0]
    assert not random_case.passed and "relative RMS" in random_case.reason, random_case
    # The same kernel passes as an e4m3 one: it is the bf16 bound that catches it.
    assert random_case.rel_rms <= 2**-4


def test_the_folded_bf16_arithmetic_passes_the_gate():
    """The folded CPU family with pv_dtype=bf16 (the real prepare, then folded_attention with
    bf16 P) through the whole gate, with K smoothing, causal with grouped KV heads."""
    for problem, knobs in ((Problem(1, 4, 300, 128), {}),
                           (Problem(2, 8, 77, 128, True, kv_heads=2), {"k_smoothing": "mean"})):
        kernel = folded.compile(folded.Config(64, pv_dtype="bf16", **knobs), problem, "cpu")
        report = validate_kernel(kernel, problem, "cpu", seed=11)
        assert report.passed, report.reason
        assert report.rel_rms < 0.005
