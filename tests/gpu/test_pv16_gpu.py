"""P.V in 16 bits on the GPU (wgmma pv_dtype="bf16", docs/family-wgmma.md): a covering set of
bf16 configs through the correctness gate (random, structured and realistic inputs; the
reference with V unquantized and the bf16-P thresholds of variants/reference_bounds.py), prepare's
launch without v CTAs against the gate's quantization, the end-to-end error through
tuner.attention below the e4m3 kernel's on random and K-bias activations (K smoothing on), a
kernel that reads V rounded to e4m3 while declaring it unquantized rejected, and a repeated
call's launch plan giving prepare + run's bits. `-m gpu` runs each config on one problem
(cycling); `-m gpu_full` every config on every problem."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

import tuner
from tests.gpu import assert_passes_the_gate, tiered
from tuner.activations import activations
from tuner.gate import validate_kernel
from tuner.gpus import PROFILES
from tuner.problem import Problem
from variants import wgmma
from variants.block_scales import PackedLayout
from variants.prepare import quantize_inputs
from variants.prepare_check import prepare_mismatch
from variants.reference import end_to_end_error, quantize_reference

pytestmark = pytest.mark.usefixtures("empty_db")

H200 = PROFILES["h200"]
BASE = Problem(1, 2, 77)
# The head_dim-128 recipe with P.V in bf16, Q from prepare; each entry changes it.
CONFIGS = {
    "recipe": {},
    "smem-P": {"p_source": "smem"},
    "plain-64": {"block_n": 64, "intra_wg_overlap": False, "pingpong": False,
                 "persistent": False, "kv_stages": 3},
    "q-in-kernel-exp2": {"q_quant": "kernel", "fma_exp2": 2, "tile_order": "longest_first"},
    "split-tail": {"split_tail": True},
    "3wg-64": {"consumer_wgs": 3, "block_n": 64, "kv_stages": 4},
    "1wg-192": {"consumer_wgs": 1, "pingpong": False, "block_n": 192,
                "intra_wg_overlap": False},
    "smoothed": {"k_smoothing": "mean"},
    "rotated": {"k_smoothing": "mean", "qk_rotation": "hadamard"},
}
PROBLEMS = {
    "one-key": Problem(1, 2, 1),
    "ragged": Problem(2, 3, 4097),
    "causal-gqa-cross": Problem(1, 8, 1500, seq_len_kv=1100, kv_heads=2, causal=True),
    "d64-cross": Problem(2, 4, 777, 64, seq_len_kv=2000, kv_heads=2),
    "split": Problem(1, 9, 4097, kv_heads=3),  # 297 tiles: split_tail splits its tail
}


def _config(name: str, problem) -> wgmma.Config:
    # The rotation only where a case names it: q-in-kernel cases cannot rotate.
    base = dataclasses.replace(wgmma.default("sm_90a", Problem(1, 2, 4096)), q_quant="prepare",
                               split_tail=False, pv_dtype="bf16", qk_rotation="none")
    cfg = dataclasses.replace(base, **CONFIGS[name])
    if problem.head_dim == 64 and name == "1wg-192":
        cfg = dataclasses.replace(cfg, intra_wg_overlap=True)  # 243 of 256 registers
    return cfg


def _in_gpu(index, case) -> bool:
    name, shape = case
    return list(PROBLEMS).index(shape) == list(CONFIGS).index(name) % len(PROBLEMS)


@pytest.mark.parametrize("name, shape", tiered(
    [(n, s) for n in CONFIGS for s in PROBLEMS], _in_gpu, ids=lambda case: f"{case[0]}-{case[1]}"))
def test_bf16_pv_configs_pass_the_gate(name, shape):
    problem = PROBLEMS[shape]
    cfg = _config(name, problem)
    ok, reason = wgmma.can_implement(cfg, problem, H200)
    if not ok:
        pytest.skip(reason)
    assert_passes_the_gate(wgmma, cfg, problem)


@pytest.mark.gpu
@pytest.mark.parametrize("knobs", [{}, dict(k_smoothing="mean", qk_rotation="hadamard")],
                         ids=["plain", "transforms"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_launch_without_v_writes_the_gates_codes_and_neutral_v_scales(knobs, dtype):
    problem = Problem(2, 8, 1000, 128, seq_len_kv=777, kv_heads=2)
    q, k, v = activations("realistic", problem, "cuda", seed=4, dtype=dtype)
    prepared = quantize_inputs(q, k, v, pad_to=128, v_feature_major=False, v_unquantized=True,
                               **knobs)
    if dtype == torch.bfloat16:
        assert prepared.v.data_ptr() == v.data_ptr()
    k_mean = prepared.k_mean
    ref = quantize_reference(q, k, v, k_mean=k_mean, rotate=bool(knobs), v_unquantized=True)
    assert prepare_mismatch(prepared, ref) is None
    _, _, log2_v, inv_v, sv = PackedLayout(2, 8, 1024, 2, 896).views(prepared.packed)
    assert bool((log2_v == 0).all() and (inv_v == 1).all() and (sv == 1).all())


@pytest.mark.gpu
@pytest.mark.parametrize("name, shape", [("recipe", "causal-gqa-cross"),
                                         ("q-in-kernel-exp2", "d64-cross"),
                                         ("rotated", "ragged"), ("split-tail", "split")])
def test_a_repeated_call_gives_the_bits_of_prepare_and_run(name, shape):
    """A repeated tuner.attention call's launch plan (variants/launch_plan.py: q and k quantized
    into its scratch block, the kernel handed the caller's v) writes the output and LSE bits of
    the config's prepare + run on the same inputs, K smoothing's LSE shift included."""
    from tuner import api, plans

    problem = PROBLEMS[shape]
    cfg = _config(name, problem)
    q, k, v = activations("realistic", problem, "cuda", seed=9)
    tuner.attention(q, k, v, causal=problem.causal, config=cfg)  # the first call makes the plan
    plan = plans.CALLS[api.signature(q, k, v, problem.causal, cfg, "auto", None, None)]
    assert plan.launch is not None and plan.launch.parts()["v8"] is None
    planned = plan.launch(q, k, v, None, True, True)
    assert planned is not None  # these inputs take the plan, not prepare + run
    want, want_lse = plan.kernel.run(plan.kernel.prepare(q, k, v))
    assert torch.equal(planned[0], want) and torch.equal(planned[1], want_lse)


# The CPU emulation of the kernels' arithmetic (tests/test_pv16_accuracy.py, B=1 H=2 S=1024):
# bf16 P.V 0.0375 against e4m3's 0.051 on every kind below; what is left is e4m3 Q and K.
PV16_MAX = 0.04
PV16_VS_FP8 = 0.85


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [128, 64])
def test_end_to_end_error_is_below_fp8s_on_random_and_k_bias_activations(head_dim):
    problem = Problem(1, 8, 2048, head_dim)
    e4m3 = dataclasses.replace(wgmma.default("sm_90a", problem), k_smoothing="mean")
    ours = dataclasses.replace(e4m3, pv_dtype="bf16")
    if not wgmma.can_implement(ours, problem, H200)[0]:  # head_dim 64's three warpgroups
        ours = dataclasses.replace(ours, consumer_wgs=2, block_n=128)
    errors = {}
    for kind in ("randn", "k_bias_8", "k_bias_20"):
        q, k, v = activations(kind, problem, "cuda", seed=7)
        errors[kind] = [end_to_end_error(tuner.attention(q, k, v, config=cfg), q, k, v)
                        for cfg in (ours, e4m3)]
    print(f"\n{ours.short()}: " + " ".join(f"{k} {a:.4f} (e4m3 {b:.4f})"
                                         for k, (a, b) in errors.items()))
    for kind, (bf16, fp8) in errors.items():
        assert bf16 <= PV16_MAX and bf16 <= PV16_VS_FP8 * fp8, (kind, bf16, fp8)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", ["ragged", "causal-gqa-cross"])
def test_a_kernel_reading_v_rounded_to_e4m3_is_rejected(shape):
    from tests.doubles import planted_wgmma

    problem = PROBLEMS[shape]
    kernel = planted_wgmma.compile(planted_wgmma.Config("pv16_v_rounded_e4m3"), problem,
                                   "sm_90a")
    assert kernel.config.pv_dtype == "bf16"
    seed = int.from_bytes(os.urandom(4), "little")
    report = validate_kernel(kernel, problem, torch.device("cuda"), seed)
    assert not report.passed and "relative RMS" in report.reason, f"seed={seed}: {report.reason}"


def gpu_builds(name, params):
    """The kernels a test here builds (tests/conftest.py compiles them ahead, in parallel)."""
    if "name" in params:
        problem = PROBLEMS[params["shape"]]
        return [("wgmma", _config(params["name"], problem), problem)]
    return []
