"""qk_dtype=int8 builds for sm_90a without a GPU: a covering set of configs compiles without
spills, QK^T is an s8 IGMMA (m64 n<block_n> k32, s32 accumulator) while P.V stays the e4m3 QGMMA
or the bf16 HGMMA, S reaches the softmax through the integer add and f32 subtraction of
qk8.scores_to_f32 (no I2F), and the one-launch quantization writes int8 q and k codes rounded to
nearest even (roundeven, then an exact conversion) and e4m3 v codes."""

import collections
import dataclasses
import re
from pathlib import Path

import pytest
import torch

from tests.test_wgmma_compile import (
    H200,
    PROBLEM,
    RECIPE,
    _assert_consumers_issue_no_global_loads,
    case_config,
)
from variants import wgmma
from variants.block_quantize_kernel import ROWS, compile_kernel

pytestmark = [pytest.mark.compile, pytest.mark.usefixtures("compile_in_tmp")]

_DEFAULT = dataclasses.replace(RECIPE, qk_dtype="int8")
# head_dim 128 and 64, e4m3 and bf16 P.V, P from smem, three consumer warpgroups, a causal mask,
# split_tail, no overlap or pingpong on a hardware grid, V transposed in the kernel.
CASES = [
    {},
    {"head_dim": 64},
    {"pv_dtype": "bf16"},
    {"pv_dtype": "bf16", "head_dim": 64},
    {"p_source": "smem"},
    {"consumer_wgs": 3, "block_n": 64, "kv_stages": 4},
    {"causal": True, "head_dim": 64, "consumer_wgs": 3, "block_n": 64, "kv_stages": 3,
     "tile_order": "longest_first"},
    {"split_tail": True, "pv_dtype": "bf16"},
    {"intra_wg_overlap": False, "pingpong": False, "persistent": False},
    {"v_layout": "kernel"},
]
_GMMA = re.compile(r"\b([HIQ]GMMA\.\S+)")
_MAGIC_ADD = re.compile(r"\b(?:IADD3|VIADD) R\d+, R\d+, 0x4b400000\b")


def _build(overrides):
    return case_config(_DEFAULT, PROBLEM, overrides)


@pytest.mark.parametrize("overrides", CASES, ids=lambda o: ",".join(f"{k}={v}" for k, v in
                                                                   o.items()) or "default")
def test_int8_qk_compiles_without_spills_with_an_s8_qk_gemm(overrides):
    from variants.cubin import disassemble, nvdisasm_path

    cfg, problem = _build(overrides)
    assert wgmma.can_implement(cfg, problem, H200) == (True, None)
    kernel = wgmma.compile(cfg, problem, "sm_90a")
    print(f"\n{cfg.short()} d{problem.head_dim}: {kernel.resources}")
    assert kernel.resources.spill_bytes == 0
    assert kernel.resources.smem_bytes <= H200.smem_per_block
    if cfg.split_tail:
        assert kernel._single_launch.resources.spill_bytes == 0
    if nvdisasm_path() is None:
        pytest.skip("nvdisasm not installed")
    _assert_consumers_issue_no_global_loads(kernel)
    sass = disassemble(kernel.cubin_path.read_bytes())
    ops = collections.Counter(_GMMA.findall(sass))
    d, n = problem.head_dim, cfg.block_n
    qk = [op for op in ops if op.startswith("IGMMA")]
    # QK^T: s8 x s8 -> s32, m64 n<block_n> k32, both operands through smem descriptors.
    assert qk and all(op.startswith(f"IGMMA.64x{n}x32.S8.S8") for op in qk), ops
    pv_prefix = f"HGMMA.64x{d}x16.F32.BF16" if cfg.v_unquantized else \
        f"QGMMA.64x{d}x32.F32.E4M3.E4M3"
    assert all(op.startswith(pv_prefix) for op in ops if not op.startswith("IGMMA")), ops
    assert any(op.startswith(pv_prefix) for op in ops), ops
    # Each S value made f32 once per strip step that waits for a QK^T: an integer add of
    # 1.5 * 2^23's bits, then an f32 subtraction of it.
    adds = len(_MAGIC_ADD.findall(sass))
    assert adds and adds % (n // 2) == 0, adds
    assert sass.count("-12582912") == adds
    # I2F.RP is the reciprocal of an integer division (the tile indices), no S conversion.
    converts = re.findall(r"\bI2F(?:\.\S+)? R", sass)
    assert all(c.startswith("I2F.RP ") for c in converts), collections.Counter(converts)


@pytest.mark.parametrize("arch", ["sm_90a"])
def test_the_quantization_writes_int8_q_and_k_codes_rounded_to_nearest_even(arch, tmp_path):
    compile_kernel("quant", torch.bfloat16, 128, arch, True, True, qk_int8=True,
                   keep_ptx_in=str(tmp_path))
    ptx = "".join(p.read_text() for p in Path(tmp_path).glob("*.ptx"))
    per_input = ROWS * 8  # a thread's values of q or of k
    # q and k: round to nearest even in f32, then an exact conversion of an integral value.
    assert ptx.count("cvt.rni.f32.f32") == 2 * per_input
    assert ptx.count("cvt.rzi.s16.f32") == 2 * per_input
    # v: e4m3, two values a conversion.
    assert ptx.count("cvt.rn.satfinite.e4m3x2.f32") == per_input // 2
    assert "cvt.rzi.s8.f32" not in ptx and "cvt.rni.s8.f32" not in ptx
