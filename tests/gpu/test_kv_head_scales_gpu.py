"""One K and one V scale per (batch, KV head) on the GPU (wgmma kv_scales="head"): configs through
the correctness gate (prepare's per-head torch path against the gate's own per-head
quantization), the FP8 entry point's per-head descales (FA3's convention) on a pinned head
config against the fp32 reference on those codes, and a repeated call giving prepare + run's
bits (a head config has no launch plan: tests/test_call_plans.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import tuner
from tests.gpu import assert_passes_the_gate
from tuner.activations import activations
from tuner.gpus import PROFILES
from tuner.problem import Problem
from variants import wgmma
from variants.reference import accuracy, quantize_reference, reference_attention

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("empty_db")]

H200 = PROFILES["h200"]
CONFIGS = {
    "recipe": {},
    "split-tail": {"split_tail": True, "persistent": True},
    "packed-plain-smem": {"pack_gqa": True, "intra_wg_overlap": False, "pingpong": False,
                          "p_source": "smem"},
    "int8-bf16-pv": {"qk_dtype": "int8", "pv_dtype": "bf16", "k_smoothing": "mean"},
}
PROBLEMS = {
    "ragged": Problem(2, 3, 4097),
    "causal-gqa-cross": Problem(1, 32, 1500, seq_len_kv=1100, kv_heads=8, causal=True),
    "d64": Problem(2, 4, 777, 64, seq_len_kv=2000, kv_heads=2),
}
CASES = [("recipe", "ragged"), ("split-tail", "ragged"), ("packed-plain-smem", "d64"),
         ("int8-bf16-pv", "causal-gqa-cross"), ("recipe", "causal-gqa-cross")]


def _config(name: str, problem) -> wgmma.Config:
    """CONFIGS[name] on the head_dim-128 (or 64) default, Q from prepare, scales per head;
    one the kernel implements for `problem`."""
    base = dataclasses.replace(wgmma.default("sm_90a", Problem(1, 2, 4096, problem.head_dim)),
                               q_quant="prepare", split_tail=False, kv_scales="head")
    cfg = dataclasses.replace(base, **CONFIGS[name])
    assert wgmma.can_implement(cfg, problem, H200) == (True, None)
    return cfg


@pytest.mark.parametrize("name, shape", CASES, ids=[f"{n}-{s}" for n, s in CASES])
def test_per_head_scale_configs_pass_the_gate(name, shape):
    assert_passes_the_gate(wgmma, _config(name, PROBLEMS[shape]), PROBLEMS[shape])


@pytest.mark.parametrize("shape", ["ragged", "causal-gqa-cross"])
def test_the_fp8_entry_reads_per_head_descales_on_a_head_config(shape):
    """Codes quantized per head (k's and v's descales (batch, kv_heads), q's per token), run on
    the pinned head config: the fp32 reference on the same codes accepts the output and LSE."""
    problem = PROBLEMS[shape]
    q, k, v = activations("realistic", problem, "cuda", seed=9)
    ref = quantize_reference(q, k, v, kv_scales="head")
    descales = (ref.scales.q.permute(0, 2, 1).contiguous(), ref.scales.k[:, :, 0].contiguous(),
                ref.scales.v[:, :, 0].contiguous())
    cfg = _config("recipe", problem).for_q_dtype("float8_e4m3fn")
    out, lse = tuner.attention_fp8(ref.q, ref.k, ref.v, *descales, causal=problem.causal,
                                   return_lse=True, config=cfg)
    metrics = accuracy(out, lse, reference_attention(ref, causal=problem.causal))
    assert metrics.passed, metrics.reason


def test_a_repeated_call_gives_prepare_and_runs_bits():
    problem = PROBLEMS["causal-gqa-cross"]
    cfg = _config("recipe", problem)
    kernel = wgmma.compile(cfg, problem, "sm_90a")
    q, k, v = activations("realistic", problem, "cuda", seed=3)
    want, _ = kernel.run(kernel.prepare(q, k, v), want_lse=False)
    for _ in range(3):
        got = tuner.attention(q, k, v, causal=True, config=cfg)
        assert torch.equal(got, want)


def gpu_builds(name, params):
    """The kernels a test here builds (tests/conftest.py compiles them ahead, in parallel)."""
    if "name" in params:
        problem = PROBLEMS[params["shape"]]
        return [("wgmma", _config(params["name"], problem), problem)]
    return []
