"""The FP8 entry point's layout copy (variants/layout_kernel.py) compiles without a GPU for every
target arch, and its PTX copies codes as they are: 8-byte loads and stores of e4m3, the exact
e4m3 -> f32 -> e4m3 round trip with no scale, V's feature-major codes through a shared tile with
no byte stores. Bit-for-bit equality with the caller's codes on a GPU: tests/gpu/test_e2e_gpu.py
and tests/test_prepare.py (cuda parameters)."""

from pathlib import Path

import pytest

from variants.layout_kernel import ROWS_PER_THREAD, compile_kernel

pytestmark = pytest.mark.compile


def _ptx(tmp_path, *args) -> str:
    compile_kernel(*args, keep_ptx_in=str(tmp_path))
    return "".join(p.read_text() for p in Path(tmp_path).glob("*.ptx"))


@pytest.mark.parametrize("arch", ["sm_90a", "sm_120a", "sm_89"])
def test_token_major_copy_moves_8_bytes_a_row_without_arithmetic(arch, tmp_path):
    ptx = _ptx(tmp_path, 128, arch)
    assert ptx.count("ld.global.v2.b32") == ROWS_PER_THREAD  # 8 x e4m3 in
    assert ptx.count("st.global.v2.b32") == ROWS_PER_THREAD  # 8 x e4m3 out
    assert "mul.f32" not in ptx and "rcp" not in ptx and "fma" not in ptx


@pytest.mark.parametrize("permute_keys", [False, True])
def test_feature_major_ptx_transposes_through_shared_memory(permute_keys, tmp_path):
    """V written (batch, heads, head_dim, padded): a thread reads 8 keys' rows, transposes the
    8 x 8 codes in registers into the shared tile (8-byte stores), and after a barrier the CTA
    writes the tile's rows out in 8-byte pieces: no byte stores anywhere."""
    ptx = _ptx(tmp_path, 128, "sm_90a", True, permute_keys)
    assert ptx.count("ld.global.v2.b32") == ROWS_PER_THREAD
    assert ptx.count("st.shared.v2.b32") == 8 and ptx.count("ld.shared.v2.b32") == 8
    assert ptx.count("st.global.v2.b32") == 8
    assert "st.global.b8" not in ptx and "st.shared.b8" not in ptx
    assert ptx.count("bar.sync") == 1  # the tile is written, then read
