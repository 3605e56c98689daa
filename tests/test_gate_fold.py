"""The kernels' block-scale arithmetic passes the correctness gate (CPU): a stand-in kernel whose
prepare is the real `quantize_inputs` and whose run is `block_scales.folded_attention`, the torch
emulation of what both families compute (Q's and K's scales in the exponent's factor, V's as
log2 sv in the exponent, P' = P * sv rounded to e4m3, the row sum of P' / sv). The gate's random
and structured cases (peaked rows, an attention sink, a head with 1000x the amax of the others)
must accept it with the thresholds the real kernels meet, at the strip widths the spaces hold,
so a GPU kernel that computes the fold faithfully cannot be rejected for its scale granularity.
The kernels themselves are checked on the GPU (tests/gpu/test_gate_gpu.py, test_shapes_gpu.py)."""

from __future__ import annotations

import pytest

from tuner.gate import validate_kernel
from tuner.problem import Problem
from variants.block_scales import folded_attention
from variants.prepare import quantize_inputs

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class _FoldedKernel:
    def __init__(self, problem: Problem, block_n: int) -> None:
        self.problem, self.block_n = problem, block_n

    def prepare(self, q, k, v, softmax_scale=None, validate=True):
        return quantize_inputs(q, k, v, pad_to=128, softmax_scale=softmax_scale,
                               v_feature_major=False)

    def run(self, prepared, out=None, lse=None):
        s, skv = prepared.seq_len, prepared.seq_len_kv
        scales = prepared.scales
        o, lse_ = folded_attention(
            prepared.q[:, :s], scales.q.permute(0, 2, 1), prepared.k[:, :skv],
            scales.k.permute(0, 2, 1), prepared.v[:, :skv], scales.v.permute(0, 2, 1),
            softmax_scale=prepared.softmax_scale, block_n=self.block_n,
            causal=self.problem.causal)
        out.copy_(o)
        lse.copy_(lse_)
        return out, lse


PROBLEMS = [
    (Problem(1, 4, 300, 128), 128),
    (Problem(2, 8, 77, 128, True, kv_heads=2), 64),  # causal, grouped KV heads
    (Problem(1, 4, 90, 64, True, 200), 192),  # causal cross-attention, head_dim 64
    (Problem(1, 4, 150, 128, False, 70, 2), 32),  # strips inside one scale block
]


@pytest.mark.parametrize(("problem", "block_n"), PROBLEMS,
                         ids=[f"{p.key()}-n{n}" for p, n in PROBLEMS])
def test_the_folded_arithmetic_passes_the_gate(problem, block_n):
    report = validate_kernel(_FoldedKernel(problem, block_n), problem, "cpu", seed=11)
    assert report.passed, report.reason
    assert [c["case"] for c in report.cases] == ["random", "structured"]
