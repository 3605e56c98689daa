"""The kernels' block-scale arithmetic passes the correctness gate (CPU): the folded CPU family
(tests/doubles/folded.py: the real `quantize_inputs`, then `block_scales.folded_attention`, the
torch emulation of what both families compute, then the LSE restored as CompiledKernel.run does).
The gate's random, structured and realistic cases (peaked rows, an attention sink, a head with
1000x the amax of the others, a K channel bias with Q/K outlier channels) must accept it with the
thresholds the real kernels meet, at the strip widths the spaces hold and with prepare's exact
transforms on, so a GPU kernel that computes the fold faithfully cannot be rejected for its scale
granularity or for a transform. The kernels themselves are checked on the GPU
(tests/gpu/test_gate_gpu.py, test_shapes_gpu.py, test_accuracy_gpu.py)."""

from __future__ import annotations

import pytest

from tests.doubles import folded
from tuner.gate import validate_kernel
from tuner.problem import Problem

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROBLEMS = [
    (Problem(1, 4, 300, 128), 128),
    (Problem(2, 8, 77, 128, True, kv_heads=2), 64),  # causal, grouped KV heads
    (Problem(1, 4, 90, 64, True, 200), 192),  # causal cross-attention, head_dim 64
    (Problem(1, 4, 150, 128, False, 70, 2), 32),  # strips inside one scale block
]


@pytest.mark.parametrize(("problem", "block_n"), PROBLEMS,
                         ids=[f"{p.key()}-n{n}" for p, n in PROBLEMS])
def test_the_folded_arithmetic_passes_the_gate(problem, block_n):
    kernel = folded.compile(folded.Config(block_n), problem, "cpu")
    report = validate_kernel(kernel, problem, "cpu", seed=11)
    assert report.passed, report.reason
    assert [c["case"] for c in report.cases] == ["random", "structured", "realistic"]


@pytest.mark.parametrize("knobs", [dict(k_smoothing="mean"), dict(qk_rotation="hadamard"),
                                   dict(k_smoothing="mean", qk_rotation="hadamard"),
                                   dict(qk_dtype="int8"),
                                   dict(k_smoothing="mean", qk_dtype="int8", pv_dtype="bf16"),
                                   dict(kv_scales="head"),
                                   dict(kv_scales="head", k_smoothing="mean",
                                        qk_rotation="hadamard", qk_dtype="int8")],
                         ids=["smoothed", "rotated", "both", "int8", "int8-bf16-smoothed",
                              "head-scales", "head-scales-transforms-int8"])
@pytest.mark.parametrize("problem", [PROBLEMS[1][0], PROBLEMS[2][0], PROBLEMS[3][0]],
                         ids=lambda p: p.key())
def test_the_folded_arithmetic_with_prepares_transforms_passes_the_gate(problem, knobs):
    """Causal with grouped KV heads, causal cross-attention (rows that see no key keep LSE
    -inf after the shift), ragged key tails: the transforms change nothing the gate sees, nor
    do int8 Q and K codes (wgmma's qk_dtype, with and without bf16 P.V) or one K and V scale
    per head (wgmma's kv_scales="head": the gate quantizes per head as well)."""
    kernel = folded.compile(folded.Config(64, **knobs), problem, "cpu")
    report = validate_kernel(kernel, problem, "cpu", seed=5)
    assert report.passed, report.reason


class _Recording:
    """The folded kernel, recording what the gate passes it; `restore_always` ignores
    want_lse=False; `config` may be another (what the gate reads the q dtypes from)."""

    def __init__(self, inner, restore_always=False, config=None):
        self.inner, self.restore_always = inner, restore_always
        self.config = inner.config if config is None else config
        self.dtypes, self.scales, self.want_lse = [], [], []

    def prepare(self, q, k, v, softmax_scale=None, **kwargs):
        self.dtypes.append(q.dtype)
        self.scales.append(softmax_scale)
        return self.inner.prepare(q, k, v, softmax_scale, **kwargs)

    def run(self, prepared, out=None, lse=None, *, want_lse=True):
        self.want_lse.append(want_lse)
        return self.inner.run(prepared, out, lse, want_lse=want_lse or self.restore_always)


@pytest.mark.parametrize("restore_always", [False, True])
def test_want_lse_false_runs_in_a_case_and_either_lse_passes_there(restore_always):
    """The gate runs one case with want_lse=False (as the runtime does for a caller without
    return_lse): the LSE may then be the smoothed scores' or the caller's, both pass."""
    problem = PROBLEMS[1][0]
    inner = folded.compile(folded.Config(64, k_smoothing="mean"), problem, "cpu")
    kernel = _Recording(inner, restore_always)
    report = validate_kernel(kernel, problem, "cpu", seed=3)
    assert report.passed, report.reason
    assert kernel.want_lse == [True, False, True]


def test_the_gate_passes_fp16_and_a_softmax_scale_where_the_config_takes_them():
    import torch

    problem = PROBLEMS[0][0]
    kernel = _Recording(folded.compile(folded.Config(64), problem, "cpu"))
    assert validate_kernel(kernel, problem, "cpu", seed=3).passed
    assert kernel.dtypes == [torch.bfloat16, torch.float16, torch.bfloat16]
    assert kernel.scales == [None, pytest.approx(0.7 * 128**-0.5), None]

    class ReadsBf16Only(folded.Config):  # as wgmma q_quant=kernel: fp16 runs on another config
        def for_q_dtype(self, dtype_name):
            return self if dtype_name == "bfloat16" else folded.Config(32)

    kernel = _Recording(kernel.inner, config=ReadsBf16Only(64))
    assert validate_kernel(kernel, problem, "cpu", seed=3).passed
    assert kernel.dtypes == [torch.bfloat16] * 3


@pytest.mark.parametrize("declared, written", [("head", "block"), ("block", "head")])
def test_the_gate_rejects_a_prepare_whose_kv_scales_are_not_the_configs(declared, written):
    """A config that reads one K and V scale per head must get per-head scales from prepare,
    and a block config block ones: either mix-up fails naming prepare, before any run."""
    problem = PROBLEMS[1][0]
    inner = folded.compile(folded.Config(64, kv_scales=written), problem, "cpu")
    kernel = _Recording(inner, config=folded.Config(64, kv_scales=declared))
    report = validate_kernel(kernel, problem, "cpu", seed=3)
    assert not report.passed
    assert "prepare" in report.reason, report.reason
    assert kernel.want_lse == []
