"""QK^T in int8 on the GPU (wgmma qk_dtype="int8", docs/family-wgmma.md): a few configs through
the correctness gate (the reference on the gate's own int8 quantization of q and k), prepare's
GPU launch giving the gate's codes and scales bit for bit, the end-to-end error through
tuner.attention within the 0.02 budget with bf16 P.V (where e4m3 Q and K miss it), and a
repeated call's launch plan giving prepare + run's bits."""

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
from variants.prepare_check import prepare_mismatch
from variants.reference import end_to_end_error, quantize_reference

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("empty_db")]

H200 = PROFILES["h200"]
# The head_dim-128 recipe with int8 Q and K, Q from prepare; each entry changes it.
CONFIGS = {
    "recipe": {},
    "bf16-pv": {"pv_dtype": "bf16", "k_smoothing": "mean"},
    "3wg-64-smem": {"consumer_wgs": 3, "block_n": 64, "kv_stages": 3, "p_source": "smem",
                    "qk_rotation": "hadamard"},
    "bf16-pv-packed": {"pv_dtype": "bf16", "consumer_wgs": 2, "intra_wg_overlap": True,
                       "pack_gqa": True},
}
PROBLEMS = {
    "ragged": Problem(2, 3, 4097),
    "causal-gqa-cross": Problem(1, 32, 1500, seq_len_kv=1100, kv_heads=8, causal=True),
    "d64": Problem(2, 4, 777, 64, seq_len_kv=2000, kv_heads=2),
}
CASES = [("recipe", "ragged"), ("bf16-pv", "causal-gqa-cross"), ("3wg-64-smem", "d64"),
         ("bf16-pv-packed", "d64")]
# The CPU emulation (tests/test_wgmma_qk8.py, B=1 H=2 S=1024): 0.011 with bf16 P.V on random
# and smoothed K-bias inputs, 0.037 with e4m3 Q and K.
BUDGET = 0.02


def _config(name: str, problem) -> wgmma.Config:
    # The rotation only where a case names it ("plain" cases are compared unrotated).
    base = dataclasses.replace(wgmma.default("sm_90a", Problem(1, 2, 4096, problem.head_dim)),
                               q_quant="prepare", split_tail=False, qk_dtype="int8",
                               qk_rotation="none")
    return dataclasses.replace(base, **CONFIGS[name])


@pytest.mark.parametrize("name, shape", CASES, ids=[f"{n}-{s}" for n, s in CASES])
def test_int8_configs_pass_the_gate(name, shape):
    problem = PROBLEMS[shape]
    cfg = _config(name, problem)
    assert wgmma.can_implement(cfg, problem, H200) == (True, None)
    assert_passes_the_gate(wgmma, cfg, problem)


@pytest.mark.parametrize("knobs", [{}, dict(k_smoothing="mean", qk_rotation="hadamard")],
                         ids=["plain", "transforms"])
@pytest.mark.parametrize("pv_dtype", ["e4m3", "bf16"])
def test_the_gpu_prepare_writes_the_gates_int8_codes(knobs, pv_dtype):
    """The one-launch quantization (int8 q and k, e4m3 or no v) decodes to exactly the gate's
    own quantization, as the torch path does (tests/test_wgmma_qk8.py)."""
    problem = Problem(2, 8, 1000, 128, seq_len_kv=777, kv_heads=2)
    cfg = dataclasses.replace(_config("recipe", problem), pv_dtype=pv_dtype, **knobs)
    q, k, v = activations("realistic", problem, "cuda", seed=4)
    prepared = wgmma.compile(cfg, problem, "sm_90a").prepare(q, k, v)
    assert prepared.q.dtype == prepared.k.dtype == torch.int8
    cpu = wgmma.compile(cfg, problem, "sm_90a").prepare(q.cpu(), k.cpu(), v.cpu())
    assert torch.equal(prepared.q.cpu(), cpu.q) and torch.equal(prepared.k.cpu(), cpu.k)
    ref = quantize_reference(q, k, v, k_mean=prepared.k_mean, rotate=bool(knobs),
                             v_unquantized=pv_dtype == "bf16", qk_int8=True)
    assert prepare_mismatch(prepared, ref) is None


@pytest.mark.parametrize("head_dim", [128, 64])
def test_end_to_end_error_meets_the_budget_with_bf16_pv(head_dim):
    problem = Problem(1, 8, 2048, head_dim)
    e4m3 = dataclasses.replace(wgmma.default("sm_90a", problem), k_smoothing="mean",
                               pv_dtype="bf16", q_quant="prepare")
    if not wgmma.can_implement(e4m3, problem, H200)[0]:  # head_dim 64's three warpgroups
        e4m3 = dataclasses.replace(e4m3, consumer_wgs=2, block_n=128)
    ours = dataclasses.replace(e4m3, qk_dtype="int8")
    errors = {}
    for kind in ("randn", "k_bias_8"):
        q, k, v = activations(kind, problem, "cuda", seed=7)
        errors[kind] = [end_to_end_error(tuner.attention(q, k, v, config=cfg), q, k, v)
                        for cfg in (ours, e4m3)]
    print(f"\n{ours.short()}: " + " ".join(f"{k} {a:.4f} (e4m3 {b:.4f})"
                                         for k, (a, b) in errors.items()))
    for kind, (int8, fp8) in errors.items():
        assert int8 <= BUDGET < fp8, (kind, int8, fp8)


def test_a_repeated_call_gives_the_bits_of_prepare_and_run():
    from tuner import api, plans

    problem = PROBLEMS["causal-gqa-cross"]
    cfg = _config("bf16-pv", problem)
    q, k, v = activations("realistic", problem, "cuda", seed=9)
    tuner.attention(q, k, v, causal=problem.causal, config=cfg)  # the first call makes the plan
    plan = plans.CALLS[api.signature(q, k, v, problem.causal, cfg, "auto", None, None)]
    planned = plan.launch(q, k, v, None, True, True)
    assert planned is not None  # these inputs take the plan, not prepare + run
    want, want_lse = plan.kernel.run(plan.kernel.prepare(q, k, v))
    assert torch.equal(planned[0], want) and torch.equal(planned[1], want_lse)


def gpu_builds(name, params):
    """The kernels a test here builds (tests/conftest.py compiles them ahead, in parallel)."""
    if "name" in params:
        problem = PROBLEMS[params["shape"]]
        return [("wgmma", _config(params["name"], problem), problem)]
    return []
