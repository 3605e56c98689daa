"""wgmma's pv_dtype knob on the CPU: the space and old rows, what can_implement refuses and why,
the shared memory and registers it counts, the codegen key, the V layout prepare is asked for,
prepare's unquantized V with neutral scales, the launch's refusal of mislaid inputs, and the
gate's own quantization with V unquantized."""

import dataclasses

import pytest
import torch

from tests.test_wgmma_config import H200, PROBLEM, _cfg
from tuner.problem import Problem
from variants import wgmma
from variants.block_scales import PackedLayout
from variants.build import CompiledKernel, codegen_key
from variants.prepare import quantize_inputs
from variants.prepare_check import prepare_mismatch
from variants.reference import quantize_reference
from variants.reference_bounds import thresholds
from variants.wgmma.config import register_estimate, smem_bytes

SRC = __import__("pathlib").Path(wgmma.__file__).parent


def test_the_space_holds_both_values_and_old_rows_load_as_e4m3():
    assert wgmma.space("sm_90a")["pv_dtype"] == ["e4m3", "bf16"]
    assert wgmma.default("sm_90a", PROBLEM).pv_dtype == "e4m3"
    old = {k: v for k, v in _cfg().to_dict().items() if k != "pv_dtype"}
    assert wgmma.Config.from_dict(old) == _cfg(pv_dtype="e4m3")


@pytest.mark.parametrize(("overrides", "problem", "words"), [
    ({"pv_dtype": "fp16"}, PROBLEM, ["pv_dtype='fp16'", "e4m3", "bf16"]),
    ({"v_layout": "kernel"}, PROBLEM, ["v_layout=kernel", "MN-major", "v_layout=prepared"]),
    # S 96 + O 64 + P in bf16 48 (twice e4m3's 24) + 24 beside the next S + scales and
    # overhead 43 > 240.
    ({"block_n": 192}, PROBLEM, ["register estimate 275 > 240", "P in bf16 48"]),
    ({"consumer_wgs": 3, "block_n": 128}, Problem(1, 2, 4096, 64),
     ["register estimate 184 > 160", "P in bf16 32"]),
    # bf16 P beside the next strip's S: these two builds spill (the compile test).
    ({"consumer_wgs": 1, "pingpong": False, "block_n": 192}, PROBLEM,
     ["register estimate 275 > 256"]),
    ({"block_n": 192}, Problem(1, 2, 4096, 64), ["register estimate 243 > 240"]),
    # The bf16 V ring: 2 x 256 x 128 x 2 B = 128 KiB.
    ({"block_n": 256, "p_source": "smem", "intra_wg_overlap": False}, PROBLEM,
     ["shared memory", "V ring in bf16: 131072 B"]),
    ({"kv_stages": 4, "q_quant": "kernel"}, PROBLEM, ["shared memory", "V ring in bf16"]),
])
def test_bf16_pv_rejections_name_the_constraint_and_its_numbers(overrides, problem, words):
    cfg = _cfg(**{"pv_dtype": "bf16", **overrides})
    ok, reason = wgmma.can_implement(cfg, problem, H200)
    assert not ok
    for word in words:
        assert word in reason, reason
    # The same config with e4m3 P.V is within the limits (where its knobs are valid).
    if "pv_dtype" not in overrides:
        assert wgmma.can_implement(dataclasses.replace(cfg, pv_dtype="e4m3"), problem, H200) \
            == (True, None)


def test_the_widest_bf16_configs_the_estimate_takes():
    """At head_dim 128 one warpgroup keeps 192-key strips without overlap (251 of 256), two with
    P from smem (203 of 240), three 64-key strips with overlap (157 of 160); at head_dim 64 one
    warpgroup 192-key strips with overlap (243 of 256). The compile test builds them."""
    for overrides, problem in (
            ({"consumer_wgs": 1, "pingpong": False, "block_n": 192, "intra_wg_overlap": False},
             PROBLEM),
            ({"block_n": 192, "p_source": "smem", "intra_wg_overlap": False}, PROBLEM),
            ({"consumer_wgs": 3, "block_n": 64}, PROBLEM),
            ({"consumer_wgs": 1, "pingpong": False, "block_n": 192}, Problem(1, 2, 4096, 64))):
        assert wgmma.can_implement(_cfg(pv_dtype="bf16", **overrides), problem, H200) \
            == (True, None), overrides


@pytest.mark.parametrize("p_source", ["registers", "smem"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_bf16_pv_doubles_the_v_ring_and_the_p_tile_and_p_registers(p_source, head_dim):
    e4m3 = _cfg(p_source=p_source, kv_stages=3)
    bf16 = dataclasses.replace(e4m3, pv_dtype="bf16")
    p_tile = 0 if p_source == "registers" else e4m3.block_m * e4m3.block_n
    assert smem_bytes(bf16, head_dim) - smem_bytes(e4m3, head_dim) == \
        3 * e4m3.block_n * head_dim + p_tile
    # Twice e4m3 P's block_n/8, and with overlap from registers block_n/8 beside the next S.
    extra = e4m3.block_n // 8 if p_source == "registers" else 0
    assert register_estimate(bf16, head_dim) - register_estimate(e4m3, head_dim) == \
        e4m3.block_n // 8 + extra


def test_pv_dtype_enters_the_codegen_key_and_the_v_layout():
    e4m3, bf16 = _cfg(), _cfg(pv_dtype="bf16")
    assert codegen_key("wgmma", e4m3, 128, "sm_90a", SRC) != \
        codegen_key("wgmma", bf16, 128, "sm_90a", SRC)
    assert (e4m3.v_unquantized, e4m3.v_feature_major, e4m3.v_key_permuted) == (False, True, True)
    assert (bf16.v_unquantized, bf16.v_feature_major, bf16.v_key_permuted) == \
        (True, False, False)


def test_fp8_callers_get_the_e4m3_twin_and_fp16_callers_keep_bf16_pv():
    cfg = _cfg(pv_dtype="bf16", k_smoothing="mean")
    assert cfg.for_q_dtype("bfloat16") is cfg
    assert cfg.for_q_dtype("float16") == cfg
    assert cfg.for_q_dtype("float8_e4m3fn") == _cfg(k_smoothing="off")


def _qkv(seq_len=77, seq_len_kv=None, dtype=torch.bfloat16):
    gen = torch.Generator().manual_seed(3)
    skv = seq_len_kv or seq_len
    return (torch.randn(1, seq_len, 4, 64, generator=gen).to(dtype),
            *(torch.randn(1, skv, 2, 64, generator=gen).to(dtype) for _ in range(2)))


def test_prepare_leaves_v_to_the_kernel_with_neutral_scales():
    q, k, v = _qkv(77, 100)
    ours = quantize_inputs(q, k, v, pad_to=128, v_feature_major=False, v_unquantized=True)
    e4m3 = quantize_inputs(q, k, v, pad_to=128, v_feature_major=False)
    assert ours.v_unquantized and not e4m3.v_unquantized
    assert ours.v.data_ptr() == v.data_ptr()  # the caller's tensor, not a copy
    _, _, log2_v, inv_v, sv = PackedLayout(1, 4, 128, 2, 128).views(ours.packed)
    assert bool((log2_v == 0).all() and (inv_v == 1).all() and (sv == 1).all())
    assert torch.equal(ours.dequantized()[2], v.float())
    # Q and K exactly as for e4m3 P.V (their codes and scales).
    for a, b in zip(ours.dequantized()[:2], e4m3.dequantized()[:2], strict=True):
        assert torch.equal(a, b)
    assert ours.padding()[2].numel() == 0  # TMA fills the keys past seq_len_kv


def test_prepare_casts_fp16_v_and_copies_a_strided_or_misaligned_v():
    q, k, v = _qkv(dtype=torch.float16)
    ours = quantize_inputs(q, k, v, pad_to=128, v_feature_major=False, v_unquantized=True)
    assert ours.v.dtype == torch.bfloat16 and torch.equal(ours.v, v.to(torch.bfloat16))
    q, k, v = _qkv()
    strided = torch.cat([v, v], dim=-1)[..., :64]
    ours = quantize_inputs(q, k, strided, pad_to=128, v_feature_major=False, v_unquantized=True)
    assert ours.v.is_contiguous() and torch.equal(ours.v, strided)
    misaligned = torch.empty(v.numel() + 1, dtype=v.dtype)[1:].view(v.shape).copy_(v)
    ours = quantize_inputs(q, k, misaligned, pad_to=128, v_feature_major=False,
                           v_unquantized=True)
    assert ours.v.data_ptr() % 16 == 0 and torch.equal(ours.v, v)
    with pytest.raises(ValueError, match="natural layout"):
        quantize_inputs(q, k, v, pad_to=128, v_unquantized=True)


def test_the_launch_refuses_inputs_prepared_for_the_other_pv_dtype():
    q, k, v = _qkv()

    def kernel(cfg):
        return CompiledKernel(config=cfg, problem=Problem(1, 4, 77, 64, kv_heads=2),
                              arch="sm_90a", resources=None, compile_seconds=0.0, _fn=object())

    # K smoothing off: prepare_fp8 refuses a config with a transform before anything else.
    bf16 = kernel(_cfg(pv_dtype="bf16", q_quant="prepare", k_smoothing="off"))
    natural_e4m3 = kernel(_cfg(v_layout="kernel", p_source="registers", q_quant="prepare",
                               k_smoothing="off"))
    with pytest.raises(ValueError, match="prepared v is e4m3 codes, this kernel reads bf16"):
        bf16.run(natural_e4m3.prepare(q, k, v))
    with pytest.raises(ValueError, match="prepared v is bf16, this kernel reads e4m3 codes"):
        natural_e4m3.run(bf16.prepare(q, k, v))
    # V's strides come from seq_len_kv: a shorter length over the same V would misread it.
    shorter = dataclasses.replace(bf16.prepare(q, k, v), seq_len_kv=76)
    with pytest.raises(ValueError, match="exactly seq_len_kv = 76 keys"):
        bf16.run(shorter)
    codes = q.to(torch.float8_e4m3fn)
    ones = torch.ones(1, 2)
    with pytest.raises(ValueError, match="reads a bf16 v.*for_q_dtype"):
        bf16.prepare_fp8(codes, codes[:, :, :2], codes[:, :, :2], (ones, ones, ones))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_gates_quantization_keeps_v_and_asks_prepare_for_exactly_that(dtype):
    q, k, v = _qkv(77, 100, dtype)
    ref = quantize_reference(q, k, v, v_unquantized=True)
    assert ref.v_unquantized and torch.equal(ref.v, v.to(torch.bfloat16))
    assert bool((ref.scales.v == 1).all())
    ours = quantize_inputs(q, k, v, pad_to=128, v_feature_major=False, v_unquantized=True)
    assert prepare_mismatch(ours, ref) is None
    # A prepare that quantizes V while the config declares it unquantized fails, naming it.
    quantized = quantize_inputs(q, k, v, pad_to=128, v_feature_major=False)
    assert (prepare_mismatch(quantized, ref) or "").startswith("prepare: v descale differs")
    assert all(a < b for a, b in zip(thresholds(True), thresholds(False), strict=True))
