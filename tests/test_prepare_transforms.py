"""prepare's exact transforms on its torch path (CPU): K smoothing and the Q/K rotation give the
codes and scales of variants/transforms.py followed by the block-scale formula, with the shift
q . m the LSE needs; Fp8Inputs describes the transformed inputs the kernel sees and restores the
LSE; CompiledKernel.run adds the shift where the caller wants the LSE and nowhere else.
(The GPU path: tests/test_prepare.py's cuda cases and tests/gpu/test_accuracy_gpu.py.)"""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import pytest
import torch

from tuner.activations import activations
from tuner.problem import Problem
from variants import block_scales, fp8_inputs, transforms
from variants.prepare import quantize_inputs

KNOBS = [dict(k_smoothing="mean"), dict(qk_rotation="hadamard"),
         dict(k_smoothing="mean", qk_rotation="hadamard")]
KNOB_IDS = ["smoothed", "rotated", "both"]


def _inputs(batch, seq, seq_kv, heads, kv_heads, head_dim, dtype=torch.bfloat16, seed=0):
    """q, k, v with a per-channel bias in k (what smoothing removes) and an outlier channel."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, seq, heads, head_dim, generator=g)
    k = torch.randn(batch, seq_kv, kv_heads, head_dim, generator=g)
    k += 6 * torch.randn(batch, 1, kv_heads, head_dim, generator=g)
    q[..., 3] *= 20
    k[..., 3] *= 20
    v = torch.randn(batch, seq_kv, kv_heads, head_dim, generator=g)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _expected(q, k, v, k_smoothing="off", qk_rotation="none"):
    """(codes, BlockScales, m, q . m) by transforms.py and block_scales.py, the statement."""
    m = transforms.smoothing_vector(k) if k_smoothing == "mean" else None
    q_t, k_t = q, k
    if m is not None:
        k_t = k.float() - m[:, None]
    if qk_rotation == "hadamard":
        q_t, k_t = transforms.rotate(q_t), transforms.rotate(k_t)
    codes, scales = block_scales.quantize(q_t, k_t, v)
    shift = None if m is None else transforms.lse_shift(q, m, 1.0)
    return codes, scales, m, shift


@pytest.mark.parametrize("knobs", KNOBS, ids=KNOB_IDS)
@pytest.mark.parametrize(("batch", "seq", "seq_kv", "heads", "kv_heads", "head_dim", "layout"), [
    (2, 77, 300, 8, 2, 128, dict(pad_to=64, permute_keys=True)),  # GQA, cross, ragged tails
    (1, 1000, 130, 6, 1, 64, dict(pad_to=128, v_feature_major=False)),  # one KV head
    (3, 129, 129, 4, 4, 128, dict(pad_to=32)),
    (1, 5, 600, 2, 2, 64, dict(pad_to=1)),  # a strided key sample (600 // 256 = 2)
])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_torch_path_is_the_transforms_then_the_block_formula(knobs, batch, seq, seq_kv, heads,
                                                             kv_heads, head_dim, layout, dtype):
    q, k, v = _inputs(batch, seq, seq_kv, heads, kv_heads, head_dim, dtype)
    prepared = quantize_inputs(q, k, v, **layout, **knobs)
    (q8, k8, v8), scales, m, shift = _expected(q, k, v, **knobs)
    assert torch.equal(prepared.q[:, :seq].view(torch.uint8), q8.view(torch.uint8))
    assert torch.equal(prepared.k[:, :seq_kv].view(torch.uint8), k8.view(torch.uint8))
    for name in "qkv":
        assert torch.equal(getattr(prepared.scales, name), getattr(scales, name)), name
    # V is untouched by either transform, through whatever layout was asked for.
    want_v = v8.float() * scales.per_key("v")[:, :seq_kv]
    assert torch.equal(prepared.dequantized()[2], want_v)
    assert prepared.qk_rotated == (knobs.get("qk_rotation") == "hadamard")
    if m is None:
        assert prepared.k_mean is None and prepared.lse_shift() is None
    else:
        assert torch.equal(prepared.k_mean, m) and prepared.k_mean.shape == (batch, kv_heads,
                                                                               head_dim)
        assert torch.equal(prepared.q_dot_mean, shift)
    # Every real key is transformed, the padding stays zero codes.
    for pad in prepared.padding():
        assert not bool(pad.any())


@pytest.mark.parametrize("knobs", KNOBS, ids=KNOB_IDS)
def test_dequantized_is_the_transformed_inputs_within_half_an_ulp(knobs):
    """What the kernel sees: k - m and q R, k R, each within e4m3's half ulp of the block."""
    q, k, v = _inputs(2, 90, 150, 4, 2, 128)
    prepared = quantize_inputs(q, k, v, pad_to=64, **knobs)
    q_t, k_t = q.float(), k.float()
    if prepared.k_mean is not None:
        k_t = k_t - prepared.k_mean[:, None]
    if prepared.qk_rotated:
        q_t, k_t = transforms.rotate(q_t), transforms.rotate(k_t)
    dq, dk = prepared.scales.q.permute(0, 2, 1)[..., None], prepared.scales.per_key("k")[:, :150]
    for want, got, d in ((q_t, prepared.dequantized()[0], dq), (k_t, prepared.dequantized()[1],
                                                                dk)):
        bound = torch.maximum(want.abs() * 2.0**-4, d * 2.0**-10) * (1 + 1e-6)
        assert bool(((got - want).abs() <= bound).all())


def test_smoothing_gives_the_scores_back_their_resolution():
    """The reason for the knob: with a per-channel K bias (std 20) the scores from the codes are
    off by a few percent of their spread; smoothed (and the shift restored) far less."""
    problem = Problem(1, 2, 256, 128)
    q, k, v = activations("k_bias_20", problem, "cpu", seed=3)
    exact = torch.einsum("bshd,bthd->bhst", q.float(), k.float())
    errors = {}
    for smoothing in ("off", "mean"):
        p = quantize_inputs(q, k, v, k_smoothing=smoothing)
        dq, dk, _ = p.dequantized()
        scores = torch.einsum("bshd,bthd->bhst", dq, dk)
        if p.k_mean is not None:
            scores = scores + p.raw_lse_shift()[..., None]
        # The part that varies over keys (the softmax's input), relative to its spread.
        centered = exact - exact.mean(-1, keepdim=True)
        errors[smoothing] = float((scores - exact).std(-1).mean() / centered.std(-1).mean())
    assert errors["mean"] * 4 < errors["off"], errors


def test_restore_lse_adds_the_scaled_shift_and_keeps_minus_infinity():
    q, k, v = _inputs(1, 40, 70, 4, 2, 64)
    prepared = quantize_inputs(q, k, v, softmax_scale=0.3, k_smoothing="mean")
    lse = torch.zeros(1, 4, 40)
    lse[..., :3] = -math.inf  # rows that see no key
    prepared.restore_lse(lse)
    want = 0.3 * transforms.lse_shift(q, prepared.k_mean, 1.0)
    assert torch.equal(lse[..., :3], torch.full((1, 4, 3), -math.inf))
    torch.testing.assert_close(lse[..., 3:], want[..., 3:], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(prepared.lse_shift(), want, rtol=1e-6, atol=1e-6)
    plain = quantize_inputs(q, k, v, qk_rotation="hadamard")
    untouched = torch.ones(1, 4, 40)
    assert torch.equal(plain.restore_lse(untouched), torch.ones(1, 4, 40))


def test_a_q_left_for_the_kernel_gets_its_shift_when_asked(monkeypatch):
    """q_quant=kernel: the quantization launch does not read q, so q . m waits for a caller that
    wants the LSE; computed from the caller's q, in row chunks."""
    q, k, v = _inputs(2, 300, 200, 4, 2, 128)
    monkeypatch.setattr(fp8_inputs, "SHIFT_ROWS", 128)  # three chunks, the last one ragged
    prepared = quantize_inputs(q, k, v, pad_to=128, q_in_kernel=True, k_smoothing="mean")
    assert prepared.q_in_kernel and prepared.q_dot_mean is None
    calls = []
    monkeypatch.setattr(fp8_inputs, "q_dot", lambda *a: calls.append(1) or real_q_dot(*a))
    raw = prepared.raw_lse_shift()
    torch.testing.assert_close(raw, transforms.lse_shift(q, prepared.k_mean, 1.0), rtol=0, atol=0)
    prepared.restore_lse(torch.zeros(2, 4, 300))
    assert len(calls) == 2  # each caller that wants it reads q: a timed run pays it too
    full = quantize_inputs(q, k, v, pad_to=128, k_smoothing="mean")
    assert torch.equal(prepared.k.view(torch.uint8), full.k.view(torch.uint8))
    with pytest.raises(ValueError, match="q_in_kernel=False"):
        quantize_inputs(q, k, v, q_in_kernel=True, qk_rotation="hadamard")


real_q_dot = fp8_inputs.q_dot


def test_unknown_knob_values_are_named():
    q, k, v = _inputs(1, 8, 8, 2, 2, 64)
    with pytest.raises(ValueError, match="k_smoothing='median'"):
        quantize_inputs(q, k, v, k_smoothing="median")
    with pytest.raises(ValueError, match="qk_rotation='random'"):
        quantize_inputs(q, k, v, qk_rotation="random")


def _kernel_with_a_silent_launch(monkeypatch, cfg):
    """A CompiledKernel whose launch writes nothing: what run does around the launch shows."""
    from variants import build, launch
    from variants.base import ResourceUsage

    monkeypatch.setattr(launch, "current_stream_handle", lambda device: 0)
    kernel = build.CompiledKernel(config=cfg, problem=SimpleNamespace(head_dim=64), arch="sm_90a",
                                  resources=ResourceUsage(0, 0, 0), compile_seconds=0.0,
                                  _fn=object())
    monkeypatch.setattr(kernel, "_launcher", lambda device: (lambda *values: None, ()))
    return kernel


@pytest.mark.parametrize("want_lse", [True, False])
def test_run_restores_the_lse_where_it_is_wanted(monkeypatch, want_lse):
    from variants import mma_sync

    cfg = dataclasses.replace(mma_sync.default("sm_90a"), k_smoothing="mean")
    kernel = _kernel_with_a_silent_launch(monkeypatch, cfg)
    q, k, v = _inputs(1, 40, 70, 4, 2, 64)
    prepared = kernel.prepare(q, k, v)
    out, lse = torch.empty(1, 40, 4, 64), torch.zeros(1, 4, 40)
    lse[..., 0] = -math.inf
    kernel.run(prepared, out, lse, want_lse=want_lse)
    if want_lse:
        torch.testing.assert_close(lse[..., 1:], prepared.lse_shift()[..., 1:])
        assert bool((lse[..., 0] == -math.inf).all()) and bool((lse[..., 1:] != 0).any())
    else:
        assert bool((lse[..., 1:] == 0).all())
    # Inputs another config's prepare made are refused, naming the knob.
    plain = quantize_inputs(q, k, v, pad_to=cfg.pad_to(), permute_keys=True)
    with pytest.raises(ValueError, match="k_smoothing='mean'"):
        kernel.run(plain, out, lse)


@pytest.mark.parametrize("want_lse", [True, False])
def test_the_runtime_passes_want_lse_to_the_kernel(monkeypatch, want_lse):
    from tuner import runtime
    from tuner.plans import CallPlan

    seen = []

    class Kernel:
        def prepare(self, q, k, v, softmax_scale=None, *, validate=True, want_lse=True):
            return "prepared"

        def run(self, prepared, out=None, lse=None, *, want_lse=True):
            seen.append(want_lse)
            return "out", "lse"

    monkeypatch.setattr(runtime, "attention_plan", lambda *args: CallPlan(Kernel()))
    q = torch.empty(1, 4, 2, 64)
    runtime.run_attention(q, q, q, None, "", "auto", None, False, False, None, want_lse)
    assert seen == [want_lse]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_inputs_prepared_without_the_lse_have_the_same_codes_and_refuse_to_restore_it(device):
    """want_lse=False (a caller that drops the LSE, and the search's timed prepare): the same
    codes and scales (on a GPU the quantization's build without the dot), no q . m, and an LSE
    restore refused by name instead of adding a shift computed from q's codes."""
    from variants.prepare import quantize_inputs

    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 40, 4, 64, generator=g).bfloat16().to(device)
    k = (torch.randn(1, 40, 2, 64, generator=g) + 5).bfloat16().to(device)
    v = torch.randn(1, 40, 2, 64, generator=g).bfloat16().to(device)
    knobs = dict(pad_to=64, k_smoothing="mean", qk_rotation="hadamard")
    kept = quantize_inputs(q, k, v, **knobs)
    dropped = quantize_inputs(q, k, v, **knobs, want_lse=False)
    for name in ("q", "k", "v", "packed", "k_mean"):
        a, b = getattr(kept, name), getattr(dropped, name)
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), name
    assert kept.q_dot_mean is not None and dropped.q_dot_mean is None
    assert not kept.lse_dropped and dropped.lse_dropped
    lse = torch.zeros(1, 4, 40, device=device)
    with pytest.raises(ValueError, match="want_lse=True"):
        dropped.restore_lse(lse)
    assert not quantize_inputs(q, k, v, pad_to=64, want_lse=False).lse_dropped  # no smoothing
