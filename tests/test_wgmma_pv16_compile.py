"""pv_dtype=bf16 builds for sm_90a without a GPU: a covering set of configs compiles without
spills, its P.V GEMM is a bf16 HGMMA reading P from registers (or smem) and V through a
transposed (MN-major) descriptor while QK^T stays an e4m3 QGMMA, P's registers are S's
accumulator converted in place of order, and the config can_implement refuses at the register
boundary does spill."""

import collections
import dataclasses
import re

import pytest

from tests.test_wgmma_compile import (
    H200,
    PROBLEM,
    RECIPE,
    _assert_consumers_issue_no_global_loads,
    case_config,
)
from variants import wgmma

pytestmark = [pytest.mark.compile, pytest.mark.usefixtures("compile_in_tmp")]

_DEFAULT = dataclasses.replace(RECIPE, pv_dtype="bf16")
# head_dim 64 and 128, 64- and 128-key strips, causal and not, split_tail, a hardware grid,
# pingpong and intra-WG overlap off, P from smem, Q quantized in the kernel, FMA exp2, three
# consumer warpgroups, and the widest strips the register estimate takes.
CASES = [
    {},
    {"head_dim": 64},
    {"block_n": 64},
    {"causal": True},
    {"causal": True, "head_dim": 64, "consumer_wgs": 3, "block_n": 64, "kv_stages": 3,
     "tile_order": "longest_first"},
    {"split_tail": True},
    {"split_tail": True, "head_dim": 64, "consumer_wgs": 3, "block_n": 64, "kv_stages": 4},
    {"persistent": False, "pingpong": False, "intra_wg_overlap": False},
    {"p_source": "smem"},
    {"p_source": "smem", "intra_wg_overlap": False, "head_dim": 64, "block_n": 64},
    {"q_quant": "kernel", "fma_exp2": 2, "tile_order": "longest_first"},
    # The widest the register estimate takes: 251 of 256 (P in registers without overlap),
    # 243 of 256 and 157 of 160 (with overlap).
    {"consumer_wgs": 1, "pingpong": False, "block_n": 192, "intra_wg_overlap": False},
    {"head_dim": 64, "consumer_wgs": 1, "pingpong": False, "block_n": 192},
    {"consumer_wgs": 3, "block_n": 64},
]


def _build(overrides):
    return case_config(_DEFAULT, PROBLEM, overrides)


def _mma_opcodes(kernel) -> collections.Counter:
    from variants.cubin import disassemble

    sass = disassemble(kernel.cubin_path.read_bytes())
    return collections.Counter(re.findall(r"\b([HQ]GMMA\.\S+ \S+ \S+ \S+)", sass))


@pytest.mark.parametrize("overrides", CASES, ids=lambda o: ",".join(f"{k}={v}" for k, v in
                                                                   o.items()) or "default")
def test_bf16_pv_compiles_without_spills_with_a_16_bit_pv_gemm(overrides):
    from variants.cubin import nvdisasm_path

    cfg, problem = _build(overrides)
    assert wgmma.can_implement(cfg, problem, H200) == (True, None)
    kernel = wgmma.compile(cfg, problem, "sm_90a")
    assert kernel.resources.spill_bytes == 0
    assert kernel.resources.smem_bytes <= H200.smem_per_block
    if nvdisasm_path() is None:
        pytest.skip("nvdisasm not installed")
    _assert_consumers_issue_no_global_loads(kernel)
    d, n = problem.head_dim, cfg.block_n
    ops = _mma_opcodes(kernel)
    pv = [op for op in ops if op.startswith("HGMMA")]
    qk = [op for op in ops if op.startswith("QGMMA")]
    # P.V: m64 n<head_dim> k16 bf16 -> f32, V through the transposed B descriptor, P from
    # registers (or a descriptor with p_source=smem); QK^T: e4m3 m64 n<block_n> k32.
    assert pv and all(op.startswith(f"HGMMA.64x{d}x16.F32.BF16 ") and "tnspB" in op
                      for op in pv), ops
    p_from = "gdesc" if cfg.p_source == "smem" else "R"
    assert all(op.split()[2].startswith(p_from) for op in pv), ops
    assert qk and all(op.startswith(f"QGMMA.64x{n}x32.F32.E4M3.E4M3 ") for op in qk), ops
    if cfg.split_tail:
        assert kernel._single_launch.resources.spill_bytes == 0


@pytest.mark.parametrize("overrides", [
    {"consumer_wgs": 1, "pingpong": False, "block_n": 192},
    {"head_dim": 64, "block_n": 192}], ids=["1x192-d128", "2x192-d64"])
def test_the_register_boundary_can_implement_refuses_spills(overrides):
    """192-key strips with bf16 P beside the next strip's S (intra-WG overlap), one consumer
    warpgroup at head_dim 128 and two at 64: can_implement refuses them (the estimate's
    block_n/8 for the overlap), and their builds do spill."""
    cfg, problem = _build(overrides)
    ok, reason = wgmma.can_implement(cfg, problem, H200)
    assert not ok and "register estimate" in reason and "P in bf16" in reason
    assert wgmma.compile(cfg, problem, "sm_90a").resources.spill_bytes > 0


def test_p_registers_are_the_accumulator_converted_in_order():
    """pv16.store_p16 writes C value r of S through p16_as_acc into P's registers: each must
    land in the A fragment value (of the PV wgmma's k16 block) of the same row and key, for
    every thread, on the layouts the DSL builds (both MMAs' thread-value layouts, both
    fragments)."""
    import cutlass
    import cutlass.cute as cute
    import cutlass.utils.hopper_helpers as sm90_utils
    from cutlass.cute.nvgpu import OperandMajorMode

    from variants.dsl_compile import arch_env
    from variants.wgmma.pv16 import p16_as_acc, pv16_tiled_mma

    found = {}

    @cute.jit
    def trace():
        for block_n in (64, 128, 192):
            qk = sm90_utils.make_trivial_tiled_mma(
                cutlass.Float8E4M3FN, cutlass.Float8E4M3FN, OperandMajorMode.K,
                OperandMajorMode.K, cutlass.Float32, (1, 1, 1), (64, block_n))
            pv = pv16_tiled_mma(1, 128, True)
            acc = cute.make_rmem_tensor(qk.get_slice(0).partition_shape_C((64, block_n)),
                                        cutlass.Float32)
            frag_a = pv.get_slice(0).make_fragment_A(
                pv.get_slice(0).partition_shape_A((64, block_n)))
            tv_c, tv_a = qk.tv_layout_C, pv.tv_layout_A
            values_c, values_a = cute.size(tv_c, mode=[1]), cute.size(tv_a, mode=[1])
            found[block_n] = (
                [[tv_c((t, v)) for v in range(values_c)] for t in range(128)],
                [[tv_a((t, v)) for v in range(values_a)] for t in range(128)],
                [p16_as_acc(frag_a, acc.layout).layout(r) for r in range(cute.size(acc))],
                [frag_a.layout(r) for r in range(cute.size(frag_a))], values_a)

    with arch_env("sm_90a"):
        cute.compile(trace, options="--gpu-arch=sm_90a")
    for block_n, (tv_c, tv_a, acc_regs, a_regs, per_block) in found.items():
        a_slot = {reg: r for r, reg in enumerate(a_regs)}  # register -> A value index
        for t in range(128):
            for r in range(block_n // 2):
                row, key = tv_c[t][r] % 64, tv_c[t][r] // 64  # (m, n) of a 64 x N tile
                a = a_slot[acc_regs[r]]  # the A value store_p16 puts C value r into
                a_row, a_k = tv_a[t][a % per_block] % 64, tv_a[t][a % per_block] // 64
                assert (a_row, 16 * (a // per_block) + a_k) == (row, key), (block_n, t, r)
