"""wgmma's qk_dtype knob on the CPU: the space and old rows, what can_implement refuses, the FP8
twin, the codegen key and the launch ABI, prepare's int8 codes against the formula written by
hand, the gate's own int8 quantization, S's in-place s32 -> f32 conversion, and the accuracy the
kernels' arithmetic reaches with int8 Q and K (block_scales.folded_attention, emulated).

What the emulation says (B=1 H=2 S=1024 head_dim 128, tuner.activations seed 0, bf16 P.V): int8
Q and K with the e4m3 block granularities cost about 0.011 relative RMS against fp32 attention
on random inputs and on K-bias ones with K smoothing, e4m3 Q and K 0.037 (docs/accuracy.md)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from tests.test_wgmma_config import H200, PROBLEM, _cfg
from tuner.activations import activations
from tuner.problem import Problem
from variants import wgmma
from variants.block_scales import folded_attention, quantize_key_blocks, quantize_rows
from variants.build import codegen_key
from variants.common.abi import slots
from variants.prepare import quantize_inputs
from variants.prepare_check import prepare_mismatch
from variants.reference import end_to_end_error, quantize_reference
from variants.wgmma.config import register_estimate, smem_bytes
from variants.wgmma.qk8 import ROUND_MAGIC, ROUND_MAGIC_BITS

SRC = __import__("pathlib").Path(wgmma.__file__).parent
# The rung's goal (docs/accuracy.md): int8 QK^T with bf16 P.V within 0.02 relative RMS.
BUDGET = 0.02
# The outlier-channel goal of docs/accuracy.md for the default config (0.376 with e4m3 plain).
OUTLIER_GOAL = 0.16


def test_the_space_holds_both_values_and_old_rows_load_as_e4m3():
    assert wgmma.space("sm_90a")["qk_dtype"] == ["e4m3", "int8"]
    assert wgmma.default("sm_90a", PROBLEM).qk_dtype == "e4m3"
    assert wgmma.default("sm_90a", Problem(1, 2, 512)).qk_dtype == "e4m3"
    old = {k: v for k, v in _cfg().to_dict().items() if k != "qk_dtype"}
    assert wgmma.Config.from_dict(old) == _cfg(qk_dtype="e4m3")


def test_can_implement_names_what_int8_refuses():
    ok, reason = wgmma.can_implement(_cfg(qk_dtype="s8"), PROBLEM, H200)
    assert not ok and "qk_dtype='s8'" in reason and "int8" in reason
    ok, reason = wgmma.can_implement(_cfg(qk_dtype="int8", q_quant="kernel"), PROBLEM, H200)
    assert not ok and "q_quant=prepare" in reason and "e4m3" in reason
    for overrides in ({}, {"pv_dtype": "bf16"}, {"qk_rotation": "hadamard"}):
        assert wgmma.can_implement(_cfg(qk_dtype="int8", **overrides), PROBLEM, H200) \
            == (True, None), overrides


@pytest.mark.parametrize("head_dim", [64, 128])
def test_int8_costs_the_shared_memory_and_registers_of_e4m3(head_dim):
    for cfg in (_cfg(), _cfg(pv_dtype="bf16", p_source="smem")):
        int8 = dataclasses.replace(cfg, qk_dtype="int8")
        assert smem_bytes(int8, head_dim) == smem_bytes(cfg, head_dim)
        assert register_estimate(int8, head_dim) == register_estimate(cfg, head_dim)


def test_fp8_callers_get_the_e4m3_twin_and_transforms_keep_int8():
    cfg = _cfg(qk_dtype="int8", pv_dtype="bf16", k_smoothing="mean")
    assert cfg.for_q_dtype("bfloat16") is cfg and cfg.for_q_dtype("float16") == cfg
    assert cfg.for_q_dtype("float8_e4m3fn") == _cfg(k_smoothing="off")
    both = cfg.with_transforms()
    assert (both.qk_dtype, both.qk_rotation, both.k_smoothing) == ("int8", "hadamard", "mean")
    assert wgmma.can_implement(both, PROBLEM, H200) == (True, None)


def test_qk_dtype_enters_the_codegen_key_and_the_launch_pointers():
    e4m3, int8 = _cfg(), _cfg(qk_dtype="int8")
    assert codegen_key("wgmma", e4m3, 128, "sm_90a", SRC) != \
        codegen_key("wgmma", int8, 128, "sm_90a", SRC)
    assert (e4m3.qk_int8, int8.qk_int8) == (False, True)
    kinds = [s.dtype for s in slots(1, qk_int8=True)[:3]]
    assert kinds == ["Int8", "Int8", "Float8E4M3FN"]
    assert [s.dtype for s in slots(1, qk_int8=True, v_unquantized=True)[:3]] == \
        ["Int8", "Int8", "BFloat16"]


def _hand_codes(x: np.ndarray, amax: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The formula in numpy float32, one operation at a time: scale = fl(fl(1 / amax) * 127),
    code = the nearest integer to fl(x * scale), ties to even, clamped to +-127; descale =
    fl(amax * fl(1 / 127))."""
    f32 = np.float32
    amax = np.maximum(amax.astype(f32), f32(1e-12))
    scale = (f32(1) / amax).astype(f32) * f32(127)
    codes = np.clip(np.rint((x.astype(f32) * scale).astype(f32)), -127, 127).astype(np.int8)
    return codes, (amax * f32(1 / 127)).astype(f32)


def test_prepares_int8_codes_are_the_formula_written_by_hand():
    """Rows whose amax is 127 scale by exactly 1, so x.5 values are ties: round half to even
    (2.5 -> 2, 3.5 -> 4, -0.5 -> 0), which truncation or rounding half away from zero miss."""
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(1, 70, 4, 64, generator=gen).bfloat16()
    k = torch.randn(1, 100, 2, 64, generator=gen).bfloat16()
    v = torch.randn(1, 100, 2, 64, generator=gen).bfloat16()
    ties = torch.tensor([127.0, 2.5, 3.5, -0.5, -1.5, 0.5, 126.5, -2.5])
    q[0, 3, 1, :8] = ties
    q[0, 3, 1, 8:] = 0
    prepared = quantize_inputs(q, k, v, pad_to=128, v_feature_major=False, qk_dtype="int8")
    assert (prepared.q.dtype, prepared.k.dtype, prepared.v.dtype) == \
        (torch.int8, torch.int8, torch.float8_e4m3fn)
    assert prepared.q[0, 3, 1, :8].tolist() == [127, 2, 4, 0, -2, 0, 126, -2]
    codes, descale = _hand_codes(q.float().numpy(), q.float().abs().amax(-1).numpy()[..., None])
    assert np.array_equal(prepared.q[:, :70].numpy(), codes)
    assert np.array_equal(prepared.scales.q.permute(0, 2, 1).numpy(), descale[..., 0])
    blocks = torch.zeros(1, 128, 2, 64)
    blocks[:, :100] = k.float()
    amax = blocks.view(1, 2, 64, 2, 64).abs().amax(dim=(2, 4))  # (batch, blocks, kv_heads)
    per_key = amax.repeat_interleave(64, dim=1)[:, :100, :, None].numpy()
    k_codes, k_descale = _hand_codes(k.float().numpy(), per_key)
    assert np.array_equal(prepared.k[:, :100].numpy(), k_codes)
    assert np.array_equal(prepared.scales.k.permute(0, 2, 1).numpy(), k_descale[:, ::64, :, 0])
    assert not prepared.k[:, 100:].any() and not prepared.q[:, 70:].any()  # zero padding
    # V keeps e4m3 codes: the same as with e4m3 Q and K.
    e4m3 = quantize_inputs(q, k, v, pad_to=128, v_feature_major=False)
    assert torch.equal(prepared.v.view(torch.uint8), e4m3.v.view(torch.uint8))


def test_the_gates_own_int8_quantization_matches_prepare_and_tells_e4m3_apart():
    gen = torch.Generator().manual_seed(8)
    q = torch.randn(2, 77, 4, 64, generator=gen).bfloat16()
    k, v = (torch.randn(2, 150, 2, 64, generator=gen).bfloat16() for _ in range(2))
    int8 = quantize_inputs(q, k, v, pad_to=128, v_feature_major=False, qk_dtype="int8",
                           k_smoothing="mean", qk_rotation="hadamard")
    e4m3 = quantize_inputs(q, k, v, pad_to=128, v_feature_major=False)
    ref = quantize_reference(q, k, v, k_mean=int8.k_mean, rotate=True, qk_int8=True)
    assert ref.q.dtype == ref.k.dtype == torch.int8 and ref.v.dtype == torch.float8_e4m3fn
    assert prepare_mismatch(int8, ref) is None
    assert "q descale" in prepare_mismatch(e4m3, quantize_reference(q, k, v, qk_int8=True))
    assert prepare_mismatch(int8, quantize_reference(q, k, v, k_mean=int8.k_mean,
                                                     rotate=True)) is not None


def test_prepare_refuses_int8_with_q_quantized_in_the_kernel():
    q, k, v = (torch.zeros(1, 16, 2, 64, dtype=torch.bfloat16) for _ in range(3))
    with pytest.raises(ValueError, match="q_in_kernel=False"):
        quantize_inputs(q, k, v, pad_to=128, v_feature_major=False, q_in_kernel=True,
                        qk_dtype="int8")
    with pytest.raises(ValueError, match="qk_dtype='fp8'"):
        quantize_inputs(q, k, v, qk_dtype="fp8")


def test_s_made_f32_by_an_integer_add_and_one_subtraction_is_exact():
    """qk8.scores_to_f32's arithmetic on the bits: exact for every |s| < 2^22, which holds the
    largest s32 score of head_dim 128 (128 * 127^2); past 2^22 the exponent moves."""
    top = 128 * 127 * 127
    s = np.concatenate([np.arange(-3000, 3000), np.arange(top - 3000, top + 1),
                        np.arange(-top, -top + 3000),
                        np.random.default_rng(0).integers(-top, top, 100_000)]).astype(np.int32)
    bits = (s + np.int32(ROUND_MAGIC_BITS)).view(np.float32)
    assert np.array_equal(bits - np.float32(ROUND_MAGIC), s.astype(np.float32))
    assert np.all(np.abs(s) < 2**22) and abs(float(s.astype(np.float32).max())) < 2**24
    far = np.int32(2**22 + 1) + np.int32(ROUND_MAGIC_BITS)
    assert far.view(np.float32) - np.float32(ROUND_MAGIC) != 2**22 + 1


def _emulated_error(kind: str, qk_dtype: str, smoothing: str = "off", pv16: bool = True) -> float:
    """End-to-end relative RMS of the kernels' arithmetic with bf16 P.V (e4m3 P and V with
    pv16=False; folded_attention, 128-key strips) on the codes prepare writes for this QK^T
    dtype."""
    problem = Problem(1, 2, 1024, 128)
    q, k, v = activations(kind, problem, "cpu", seed=0)
    prepared = quantize_inputs(q, k, v, pad_to=128, v_feature_major=False, v_unquantized=pv16,
                               k_smoothing=smoothing, qk_dtype=qk_dtype)
    skv, scales = prepared.seq_len_kv, prepared.scales
    out, _ = folded_attention(
        prepared.q[:, :1024], scales.q.permute(0, 2, 1), prepared.k[:, :skv],
        scales.k.permute(0, 2, 1), prepared.v[:, :skv], scales.v.permute(0, 2, 1),
        softmax_scale=prepared.softmax_scale,
        p_dtype=torch.bfloat16 if pv16 else torch.float8_e4m3fn)
    return end_to_end_error(out.bfloat16(), q, k, v)


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("kind, smoothing", [("randn", "off"), ("k_bias_8", "mean")])
def test_int8_qk_with_bf16_pv_meets_the_budget_e4m3_misses(kind, smoothing):
    ours = _emulated_error(kind, "int8", smoothing)
    e4m3 = _emulated_error(kind, "e4m3", smoothing)
    print(f"\n{kind}: int8 {ours:.4f}, e4m3 {e4m3:.4f}")
    assert ours <= BUDGET < e4m3, (ours, e4m3)


@pytest.mark.usefixtures("one_torch_thread")
def test_int8_qk_with_smoothing_alone_keeps_outlier_channels_where_e4m3_needs_the_rotation():
    """e4m3 P.V, the default's transforms (smoothing, no rotation): docs/accuracy.md's goal for
    outlier channels (0.16) is met by int8 Q and K, and missed by e4m3 ones by 2x."""
    ours = _emulated_error("outliers", "int8", "mean", pv16=False)
    e4m3 = _emulated_error("outliers", "e4m3", "mean", pv16=False)
    print(f"\noutliers, smoothed, e4m3 P.V: int8 {ours:.4f}, e4m3 {e4m3:.4f}")
    assert ours <= OUTLIER_GOAL < e4m3 / 2, (ours, e4m3)


def test_quantize_functions_keep_e4m3_by_default():
    x = torch.randn(1, 64, 2, 64)
    assert quantize_rows(x)[0].dtype == quantize_key_blocks(x)[0].dtype == torch.float8_e4m3fn
    assert quantize_rows(x, "int8")[0].dtype == torch.int8
    assert quantize_key_blocks(x, qk_dtype="int8")[0].dtype == torch.int8
