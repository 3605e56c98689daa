"""The gate on causal, cross-attention and grouped-KV-head problems (CPU): its cases keep the
problem's group size and mask, its inputs have their own shapes and structure, and a correct
kernel passes while a causal off-by-one, a top-left mask or a wrong KV-head mapping fails."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from tests.doubles.dense import dense_attention
from tuner.gate import case_inputs, gate_cases, validate_kernel
from tuner.problem import Problem
from variants.reference import quantize_reference

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("problem, structured", [
    (Problem(1, 32, 64, 64, True, kv_heads=8), (2, 8, 65, 65, 2, True)),  # group 4
    (Problem(1, 8, 100, 64, False, 37, 8), (2, 8, 101, 37, 8, False)),
    (Problem(3, 64, 77, 64, True, 16, 4), (3, 32, 77, 17, 2, True)),  # group 16: 2 KV heads
    (Problem(1, 4, 50, 64), (2, 4, 51, 51, 4, False)),  # group 1: 2 to 8 query heads
])
def test_cases_keep_the_group_and_mask_and_are_ragged_on_both_axes(problem, structured):
    random, struct, realistic = gate_cases(problem)
    assert random.problem(64) == problem
    assert (struct.batch, struct.heads, struct.seq_len, struct.seq_len_kv, struct.kv_heads,
            struct.causal) == structured
    assert struct.problem(64).group == problem.group
    assert realistic.problem(64) == struct.problem(64)  # the realistic case: its small shape


def test_structured_inputs_per_kv_head():
    case = gate_cases(Problem(1, 8, 300, 128, False, 200, 2))[1]
    q, k, v = case_inputs(case, 128, "cpu", seed=5)
    assert q.shape == (2, 301, 8, 128) and k.shape == v.shape == (2, 201, 2, 128)
    qf, kf = q.float(), k.float()
    scale = case.softmax_scale(128)  # the case's own, which its structure is built for
    for g in range(2):
        lead = g * 4  # the first query head of KV head g's group
        p = torch.softmax(qf[0, :, lead] @ kf[0, :, g].t() * scale, -1)
        # Query i < 201 is dominated by key 200 - i.
        diagonal = p[torch.arange(201), torch.arange(201).flip(0)]
        assert float(diagonal.median()) > 0.8
        sink = torch.softmax(qf[1, :, lead + 3] @ kf[1, :, g].t() * scale, -1)[:, 0]
        assert float(sink.median()) > 0.15
    # The outlier: the last KV head and all four query heads of its group.
    assert float(q[..., 4:, :].abs().amax() / q[..., :4, :].abs().amax()) > 300
    assert float(v[..., 1, :].abs().amax() / v[..., 0, :].abs().amax()) > 300


@dataclass
class _Prepared:
    """The gate's own quantization handed back as a candidate's prepared inputs."""

    ref: object

    def __getattr__(self, name):
        return getattr(self.ref, name)

    q_in_kernel = False  # codes, as every Fp8Inputs of a kernel that reads e4m3 q

    @property
    def padded_len(self):
        return self.ref.q.shape[1]

    def padding(self):
        return torch.empty(0), torch.empty(0), torch.empty(0)

    @property
    def packed(self):  # the kernels' buffer of the same scales (no padding)
        return self.ref.scales.packed(self.ref.q.shape[1], self.ref.k.shape[1])


class _DenseKernel:
    """A CPU 'kernel': dense fp32 attention on the prepared codes, with an optional bug."""

    def __init__(self, problem, bug=None):
        self.problem, self.bug = problem, bug

    def prepare(self, q, k, v, softmax_scale=None, validate=True, want_lse=True):
        return _Prepared(quantize_reference(q, k, v, softmax_scale))

    def run(self, prepared, out=None, lse=None, *, want_lse=True):
        bug = {"off-by-one": dict(diagonal_shift=1), "top-left": dict(top_left=True),
               "kv-head": dict(kv_head=lambda h, group, kv: h % kv)}.get(self.bug, {})
        o, lse_ = dense_attention(prepared, self.problem.causal, **bug)
        out.copy_(o)
        lse.copy_(lse_)
        return out, lse


PROBLEMS = [Problem(1, 8, 77, 64, True, kv_heads=2), Problem(1, 4, 90, 64, True, 40),
            Problem(2, 8, 40, 64, True, 90, 4), Problem(1, 4, 60, 64, False, 130, 2)]


@pytest.mark.parametrize("problem", PROBLEMS, ids=[p.key() for p in PROBLEMS])
@pytest.mark.parametrize("bug", [None, "off-by-one", "top-left", "kv-head"])
def test_a_correct_kernel_passes_and_mask_and_head_bugs_fail(problem, bug):
    applies = {"off-by-one": problem.causal, "kv-head": problem.group > 1,
               "top-left": problem.causal and problem.seq_len != problem.seq_len_kv}
    if bug is not None and not applies[bug]:
        pytest.skip("the bug changes nothing for this problem")
    report = validate_kernel(_DenseKernel(problem, bug), problem, "cpu", seed=3)
    if bug is None:
        assert report.passed, report.reason
        assert [c["case"] for c in report.cases] == ["random", "structured", "realistic"]
    else:
        assert not report.passed, f"{bug} passed the gate"
