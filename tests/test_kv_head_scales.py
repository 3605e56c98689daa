"""K's and V's scales per (batch, KV head) (block_scales.KV_SCALES "head", wgmma's kv_scales), on
the CPU: the formula, prepare's torch path against the gate's own quantization bit for bit, and
the knob's constraints. The gate with the folded arithmetic: tests/test_gate_fold.py; the
kernels' builds: tests/test_wgmma_compile.py; on the GPU: tests/gpu/test_kv_head_scales_gpu.py."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tuner.gpus import PROFILES
from tuner.problem import Problem
from variants import block_scales, wgmma
from variants.prepare import quantize_inputs
from variants.prepare_check import prepare_mismatch
from variants.reference import quantize_reference

H100 = PROFILES["h100"]


def test_each_kv_head_is_scaled_by_its_own_amax_in_every_block():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 200, 3, 64, generator=g).bfloat16()
    x[1, 150, 2, 5] = 300.0  # one outlier key sets its head's scale, and only its head's
    codes, descale = block_scales.quantize_heads(x)
    assert codes.dtype == torch.float8_e4m3fn and codes.shape == x.shape
    assert descale.shape == (2, 4, 3)  # (batch, blocks of 64 keys, kv_heads), as per block
    assert torch.equal(descale, descale[:, :1].expand_as(descale))
    amax = x.float().abs().amax(dim=(1, 3))  # (batch, kv_heads)
    assert torch.equal(descale[:, 0], amax * block_scales.DESCALE_PER_AMAX)
    assert descale[1, 0, 2] > 30 * descale[1, 0, 1]
    assert codes[1, 150, 2, 5].float() == block_scales.E4M3_MAX
    dequantized = codes.float() * descale[:, :1, :, None]
    error = (dequantized - x.float()).abs()
    step = descale[:, :1, :, None] * 2.0**-9  # e4m3's smallest subnormal, per head
    assert bool((error <= x.float().abs() / 16 + step).all())


def test_an_unknown_granularity_is_refused_by_name():
    q = k = v = torch.randn(1, 64, 2, 64).bfloat16()
    with pytest.raises(ValueError, match="kv_scales='token'"):
        block_scales.quantize(q, k, v, kv_scales="token")
    with pytest.raises(ValueError, match="kv_scales='token'"):
        quantize_inputs(q, k, v, kv_scales="token")


@pytest.mark.parametrize("knobs", [
    {},
    dict(k_smoothing="mean", qk_rotation="hadamard"),
    dict(qk_dtype="int8"),
    dict(v_unquantized=True, v_feature_major=False, permute_keys=False),
], ids=["plain", "transforms", "int8", "bf16-v"])
def test_prepare_writes_the_gates_per_head_codes_and_scales(knobs):
    """Grouped KV heads, ragged lengths, the layouts wgmma reads: prepare's per-head codes and
    packed scales decode to exactly the gate's own per-head quantization, and not to its
    block one (so the gate tells the two apart)."""
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 150, 8, 128, generator=g).bfloat16()
    k, v = (torch.randn(2, 333, 2, 128, generator=g).bfloat16() for _ in range(2))
    k[0, 7, 1] += 40.0  # a loud key: its head's scale differs from its blocks'
    v[1, 300, 0] -= 25.0
    options = {"pad_to": 128, "permute_keys": True, "v_feature_major": True, **knobs}
    smooth, rotate = knobs.get("k_smoothing") == "mean", knobs.get("qk_rotation") == "hadamard"
    prepared = quantize_inputs(q, k, v, kv_scales="head", **options)
    k_mean = prepared.k_mean if smooth else None
    want = dict(k_mean=k_mean, rotate=rotate, v_unquantized=knobs.get("v_unquantized", False),
                qk_int8=knobs.get("qk_dtype") == "int8")
    assert prepare_mismatch(prepared, quantize_reference(q, k, v, kv_scales="head", **want)) \
        is None
    assert "descale" in prepare_mismatch(prepared, quantize_reference(q, k, v, **want))
    block = quantize_inputs(q, k, v, **options)
    assert "descale" in prepare_mismatch(block, quantize_reference(q, k, v, kv_scales="head",
                                                                   **want))


PROBLEM = Problem(1, 4, 1000)
HEAD = dataclasses.replace(wgmma.default("sm_90a", PROBLEM), q_quant="prepare",
                           kv_scales="head")


def test_per_head_scales_take_q_scales_from_prepare():
    assert wgmma.can_implement(HEAD, PROBLEM, H100) == (True, None)
    ok, reason = wgmma.can_implement(dataclasses.replace(HEAD, q_quant="kernel"), PROBLEM, H100)
    assert not ok and "kv_scales=head needs q_quant=prepare" in reason
    ok, reason = wgmma.can_implement(dataclasses.replace(HEAD, kv_scales="token"), PROBLEM,
                                     H100)
    assert not ok and "kv_scales='token' unknown" in reason


def test_per_head_scales_are_a_knob_searches_from_bf16_leave_at_block():
    """The space holds block only (prepare's one-pass launch; per head takes an amax pass), and
    a stored config without the knob reads as block."""
    assert wgmma.space("sm_90a")["kv_scales"] == ["block"]
    stored = {k: v for k, v in HEAD.to_dict().items() if k != "kv_scales"}
    assert wgmma.Config.from_dict(stored).kv_scales == "block"
    assert wgmma.Config.from_dict(HEAD.to_dict()) == HEAD
    assert HEAD.kv_head_scales and not dataclasses.replace(HEAD, kv_scales="block").kv_head_scales


def test_per_head_scales_leave_q_quantization_to_prepare_for_fp8_callers_too():
    twin = HEAD.for_q_dtype("float8_e4m3fn")
    assert twin.kv_scales == "head" and twin.q_quant == "prepare"
    assert wgmma.can_implement(twin, PROBLEM, H100) == (True, None)
