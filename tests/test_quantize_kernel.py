"""prepare's GPU kernels (variants/quantize_kernel.py) compile without a GPU for every target arch,
and their PTX does what the torch path is replaced by: a NaN-propagating amax with one integer
atomic max per warp; a saturating, round-to-nearest-even f32 -> e4m3 conversion with the scale
from a correctly rounded division, 16-byte loads and 8-byte stores. Bit-for-bit equality with the
plain formula on a GPU: tests/test_prepare.py (cuda parameter)."""

from pathlib import Path

import pytest
import torch

from variants.quantize_kernel import ROWS_PER_THREAD, compile_kernel, compile_scaled_cast

pytestmark = pytest.mark.compile


@pytest.mark.parametrize("arch", ["sm_90a", "sm_120a", "sm_89"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_ptx_casts_with_saturation_and_wide_accesses(arch, dtype, tmp_path):
    compile_scaled_cast(dtype, 128, arch, keep_ptx_in=str(tmp_path))
    ptx = "".join(p.read_text() for p in Path(tmp_path).glob("*.ptx"))
    # 8 values a row, 2 per cvt, ROWS_PER_THREAD rows a thread
    assert ptx.count("cvt.rn.satfinite.e4m3x2.f32") == 4 * ROWS_PER_THREAD
    assert ptx.count("ld.global.v4.b32") == ROWS_PER_THREAD  # 8 x 16-bit in
    assert ptx.count("st.global.v2.b32") == ROWS_PER_THREAD  # 8 x e4m3 out
    assert "mul.f32" in ptx and "fma" not in ptx  # one rounding: the product, as in torch
    # scale = fl(fl(1 / amax) * 448) and descale = amax * fl32(1 / 448), as in torch; the
    # clamp of amax keeps a NaN (a NaN input must not get a finite scale).
    assert ptx.count("rcp.rn.f32") == 1 and "approx" not in ptx and "div.rn.f32" not in ptx
    assert "mul.rn.f32" in ptx or ptx.count("mul.f32") >= 2
    assert "max.NaN.f32" in ptx


@pytest.mark.parametrize("arch", ["sm_90a", "sm_120a"])
def test_amax_ptx_propagates_nan_and_reduces_per_warp(arch, tmp_path):
    compile_kernel("amax", torch.bfloat16, 128, arch, keep_ptx_in=str(tmp_path))
    ptx = "".join(p.read_text() for p in Path(tmp_path).glob("*.ptx"))
    assert "max.NaN.f32" in ptx and "max.f32" not in ptx  # no NaN-dropping max anywhere
    assert ptx.count("atom.global.max.s32") == 1  # the float bits, one atomic per warp
    assert ptx.count("shfl.sync.bfly.b32") == 5  # the warp's butterfly
    # Full chunks and the tail each load ROWS_PER_THREAD rows of 16 bytes.
    assert ptx.count("ld.global.v4.b32") == 2 * ROWS_PER_THREAD


@pytest.mark.parametrize("arch", ["sm_90a", "sm_120a"])
def test_cast_then_amax_is_one_launch_of_both(arch, tmp_path):
    """The fused launch (cast of one input, amax of the next) holds the cast's arithmetic and the
    amax's NaN-propagating reduction, each once: one kernel, both bodies."""
    compile_kernel("cast_then_amax", torch.bfloat16, 128, arch, keep_ptx_in=str(tmp_path),
                   chunks_per_cta=2)
    ptx = "".join(p.read_text() for p in Path(tmp_path).glob("*.ptx"))
    assert ptx.count(".entry ") == 1
    assert ptx.count("rcp.rn.f32") == 1 and "approx" not in ptx
    assert ptx.count("cvt.rn.satfinite.e4m3x2.f32") == 4 * ROWS_PER_THREAD
    assert ptx.count("st.global.v2.b32") == ROWS_PER_THREAD
    assert "max.NaN.f32" in ptx and "max.f32" not in ptx
    assert ptx.count("atom.global.max.s32") == 1
    # The cast's rows, then the amax's full chunks (2 per CTA, unrolled) and its tail.
    assert ptx.count("ld.global.v4.b32") == ROWS_PER_THREAD * (1 + 2 + 2)


@pytest.mark.parametrize("permute_keys", [False, True])
def test_feature_major_ptx_transposes_through_shared_memory(permute_keys, tmp_path):
    """V written (batch, heads, head_dim, padded) by the cast itself: a thread casts 8 keys' rows
    (16-byte loads, the same saturating cvt), transposes the 8 x 8 codes in registers into the
    shared tile (8-byte stores), and after a barrier the CTA writes the tile's rows out in 8-byte
    pieces: no byte stores anywhere."""
    compile_scaled_cast(torch.bfloat16, 128, "sm_90a", True, permute_keys,
                        keep_ptx_in=str(tmp_path))
    ptx = "".join(p.read_text() for p in Path(tmp_path).glob("*.ptx"))
    assert ptx.count("cvt.rn.satfinite.e4m3x2.f32") == 4 * ROWS_PER_THREAD
    assert ptx.count("ld.global.v4.b32") == ROWS_PER_THREAD
    assert ptx.count("st.shared.v2.b32") == 8 and ptx.count("ld.shared.v2.b32") == 8
    assert ptx.count("st.global.v2.b32") == 8
    assert "st.global.b8" not in ptx and "st.shared.b8" not in ptx
    assert ptx.count("bar.sync") == 2  # the tile is written, read, then free for the next chunk


def test_a_compile_failure_falls_back_once_and_says_so(monkeypatch, caplog):
    """An arch the DSL cannot target must not break prepare: compiled() is None, the failure
    is logged and remembered (one compile attempt), and the torch path is used instead."""
    from variants import quantize_kernel

    calls = []

    def failing_compile(*key, **options):
        calls.append((*key, options))
        raise RuntimeError("unsupported arch sm_999")

    monkeypatch.setattr(quantize_kernel, "_COMPILED", {})
    monkeypatch.setattr(quantize_kernel, "_device_arch", lambda device: "sm_999")
    monkeypatch.setattr(quantize_kernel, "compile_kernel", failing_compile)
    device = torch.device("cpu")
    with caplog.at_level("WARNING"):
        assert quantize_kernel.compiled("cast", torch.bfloat16, 128, device) is None
        assert quantize_kernel.compiled("cast", torch.bfloat16, 128, device) is None
    assert calls == [("cast", torch.bfloat16, 128, "sm_999", False, False, True,
                      {"chunks_per_cta": 1})]
    assert "unsupported arch sm_999" in caplog.text and "torch ops" in caplog.text
    assert quantize_kernel.compiled("cast", torch.bfloat16, 128, device,
                                    compile_now=False) is None
    # Not compiled yet and not allowed to compile (a CUDA-graph capture): None, nothing tried.
    assert quantize_kernel.compiled("amax", torch.bfloat16, 128, device,
                                    compile_now=False) is None
    assert len(calls) == 1
