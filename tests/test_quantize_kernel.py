"""The fused e4m3 cast of prepare (variants/quantize_kernel.py) compiles without a GPU for every
target arch, and its PTX does what the torch path's clamp + cast is replaced by: a saturating,
round-to-nearest-even f32 -> e4m3 conversion, with 16-byte loads and 8-byte stores. Bit-for-bit
equality with the plain formula on a GPU: tests/test_prepare.py (cuda parameter)."""

from pathlib import Path

import pytest
import torch

from variants.quantize_kernel import compile_scaled_cast

pytestmark = pytest.mark.compile


@pytest.mark.parametrize("arch", ["sm_90a", "sm_120a", "sm_89"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_ptx_casts_with_saturation_and_wide_accesses(arch, dtype, tmp_path):
    compile_scaled_cast(dtype, 128, arch, keep_ptx_in=str(tmp_path))
    ptx = "".join(p.read_text() for p in Path(tmp_path).glob("*.ptx"))
    assert ptx.count("cvt.rn.satfinite.e4m3x2.f32") == 4  # 8 values a thread, 2 per cvt
    assert "ld.global.v4.b32" in ptx  # 8 x 16-bit in
    assert "st.global.v2.b32" in ptx  # 8 x e4m3 out
    assert "mul.f32" in ptx and "fma" not in ptx  # one rounding: the product, as in torch


@pytest.mark.parametrize("permute_keys", [False, True])
def test_feature_major_ptx_stores_one_byte_per_feature_row(permute_keys, tmp_path):
    """V written (batch, heads, head_dim, padded) by the cast itself: one 16-byte load, the same
    saturating cvt, then 8 one-byte stores (one per feature row)."""
    compile_scaled_cast(torch.bfloat16, 128, "sm_90a", True, permute_keys,
                        keep_ptx_in=str(tmp_path))
    ptx = "".join(p.read_text() for p in Path(tmp_path).glob("*.ptx"))
    assert ptx.count("cvt.rn.satfinite.e4m3x2.f32") == 4
    assert "ld.global.v4.b32" in ptx
    assert ptx.count("st.global.b8") == 8


def test_a_compile_failure_falls_back_once_and_says_so(monkeypatch, caplog):
    """An arch the DSL cannot target must not break prepare: compiled() is None, the failure
    is logged and remembered (one compile attempt), and the torch path is used instead."""
    from variants import quantize_kernel

    calls = []

    def failing_compile(*key):
        calls.append(key)
        raise RuntimeError("unsupported arch sm_999")

    monkeypatch.setattr(quantize_kernel, "_COMPILED", {})
    monkeypatch.setattr(quantize_kernel, "_device_arch", lambda device: "sm_999")
    monkeypatch.setattr(quantize_kernel, "compile_scaled_cast", failing_compile)
    device = torch.device("cpu")
    with caplog.at_level("WARNING"):
        assert quantize_kernel.compiled(torch.bfloat16, 128, device) is None
        assert quantize_kernel.compiled(torch.bfloat16, 128, device) is None
    assert calls == [(torch.bfloat16, 128, "sm_999", False, False)]
    assert "unsupported arch sm_999" in caplog.text and "torch ops" in caplog.text
    assert quantize_kernel.compiled(torch.bfloat16, 128, device, compile_now=False) is None
