"""wgmma kernels compile for sm_90a without a GPU (fake pointers), every knob value at least once.

One compile takes ~2 s on a CI core, so the set is the default plus one change per knob value
(and the extreme tiles), not the space.
"""

import dataclasses
import re

import pytest

from tuner.gpus import PROFILES
from tuner.problem import Problem
from variants import wgmma

pytestmark = [pytest.mark.compile, pytest.mark.usefixtures("compile_in_tmp")]

H200 = PROFILES["h200"]
PROBLEM = Problem(batch=1, heads=2, seq_len=77)
# The head_dim-128 recipe with Q quantized by prepare (the default quantizes Q in the kernel at
# this short length; CASES turn that on one knob at a time like every other), and without
# split_tail (the full-mask default splits the tail; CASES turn it on).
RECIPE = dataclasses.replace(wgmma.default("sm_90a", PROBLEM), q_quant="prepare",
                             split_tail=False)
CASES = [
    {},
    {"p_source": "smem"},
    {"intra_wg_overlap": False, "pingpong": False, "persistent": False},
    # The widest strip: at head_dim 128 one warpgroup's S, O and block scales outgrow 256
    # registers (can_implement refuses it), so at head_dim 64.
    {"consumer_wgs": 1, "pingpong": False, "block_n": 256, "kv_stages": 3, "head_dim": 64},
    {"consumer_wgs": 3, "block_n": 64, "kv_stages": 4},
    {"block_n": 192, "p_source": "smem", "intra_wg_overlap": False},
    # V transposed in shared memory: the staging ring, TMA of the natural V, ldmatrix/stmatrix.
    {"v_layout": "kernel"},
    {"v_layout": "kernel", "p_source": "smem", "kv_stages": 3},
    {"v_layout": "kernel", "consumer_wgs": 1, "pingpong": False, "block_n": 64,
     "intra_wg_overlap": False, "persistent": False},
    # Exponentials on the FMA pipe (an inline-PTX cubic), with P from registers and from smem.
    {"fma_exp2": 1},
    {"fma_exp2": 2, "p_source": "smem"},
    # Every head's last query block first (the causal default; here without a mask).
    {"tile_order": "longest_first"},
    # Q quantized by the consumers from bf16 (16-byte loads, 16-byte swizzled smem stores),
    # with two and three consumer warpgroups, P from smem, V transposed in the kernel.
    {"q_quant": "kernel"},
    {"q_quant": "kernel", "consumer_wgs": 3, "block_n": 64, "kv_stages": 4},
    {"q_quant": "kernel", "p_source": "smem", "v_layout": "kernel", "head_dim": 64},
    # The last wave split along the keys: the piece loops, the workspace, counter and merge,
    # with and without intra-WG overlap, with V transposed in the kernel, Q from bf16.
    {"split_tail": True},
    {"split_tail": True, "intra_wg_overlap": False, "pingpong": False, "v_layout": "kernel"},
    {"split_tail": True, "q_quant": "kernel", "consumer_wgs": 3, "block_n": 64,
     "head_dim": 64},
    # prepare's transforms: the default's build (no compile of their own, variants/build.py).
    {"k_smoothing": "off", "qk_rotation": "hadamard"},
    # P.V in 16 bits (tests/test_wgmma_pv16_compile.py has its covering set).
    {"pv_dtype": "bf16"},
    # QK^T in int8 (tests/test_wgmma_qk8_compile.py has its covering set).
    {"qk_dtype": "int8"},
    # One K and V scale per head: staged with Q's row scales, no strip scales; with the tail
    # split (the merge, then V's descale), without overlap, with int8 QK^T and bf16 P.V.
    {"kv_scales": "head"},
    {"kv_scales": "head", "split_tail": True},
    {"kv_scales": "head", "intra_wg_overlap": False, "pingpong": False, "p_source": "smem"},
    {"kv_scales": "head", "qk_dtype": "int8", "pv_dtype": "bf16", "head_dim": 64},
]


@pytest.mark.parametrize("overrides", CASES, ids=lambda o: ",".join(f"{k}={v}" for k, v in
                                                                   o.items()) or "default")
def test_compiles_without_spills(overrides):
    cfg, problem = case_config(RECIPE, PROBLEM, overrides)
    assert wgmma.can_implement(cfg, problem, H200) == (True, None)
    kernel = wgmma.compile(cfg, problem, "sm_90a")
    assert kernel.config == cfg
    assert 0 < kernel.resources.registers <= 255
    assert kernel.resources.spill_bytes == 0
    assert kernel.resources.smem_bytes <= H200.smem_per_block
    assert wgmma.compile(cfg, problem, "sm_90a") is kernel
    _assert_consumers_issue_no_global_loads(kernel)
    if cfg.split_tail:
        # Where the rule keeps the tail whole, the launch runs the build without the knob.
        twin = kernel._single_launch
        assert twin.config == dataclasses.replace(cfg, split_tail=False)
        assert twin._single_launch is None
        _assert_consumers_issue_no_global_loads(twin)
    else:
        assert kernel._single_launch is None


def case_config(default, problem, overrides):
    """(config, problem) of a compile case: `default` with the case's knob overrides, and
    `problem` with its head_dim and causal, which a case may name beside the knobs."""
    overrides = dict(overrides)
    problem = dataclasses.replace(problem, head_dim=overrides.pop("head_dim", problem.head_dim),
                                  causal=overrides.pop("causal", problem.causal))
    return dataclasses.replace(default, **overrides), problem


def _assert_consumers_issue_no_global_loads(kernel):
    """The consumer warpgroups' program (after their setmaxnreg increase) reads the block scales
    from shared memory: a global load in flight at a named barrier makes the barrier wait for it,
    which cost the pingpong turn an L2 round trip every strip (docs/family-wgmma.md)."""
    from variants.cubin import disassemble, nvdisasm_path

    if nvdisasm_path() is None:
        return
    sass = disassemble(kernel.cubin_path.read_bytes())
    # One program, or with split_tail two: the whole tiles' and the pieces'.
    # (QK^T is an e4m3 QGMMA, or with qk_dtype=int8 an s8 IGMMA.)
    programs = [p for p in re.split(r"\n(?=\s*\.text\.)", sass) if re.search(r"[IQ]GMMA", p)]
    assert len(programs) == (2 if kernel.config.split_tail else 1), len(programs)
    for program in programs:
        _, marker, consumers = program.partition("USETMAXREG.TRY_ALLOC")
        assert marker, "no consumer setmaxnreg increase found in the SASS"
        if "ATOMG" in consumers:
            # A tail piece's merge reads the other pieces' partial O after its counter update
            # (the epilogue, past every named barrier of the main loop).
            consumers = consumers.partition("ATOMG.E.ADD")[0]
        loads = [line.strip() for line in consumers.splitlines()
                 if "LDG" in line and "UTMALDG" not in line]
        assert not loads, loads
    # A store of the zero register: split_tail's counters zeroed by the whole tiles' program
    # (the pieces program reads them; no program stores a zero otherwise).
    zeroes = [bool(re.search(r"STG\.E\S* \S+, RZ", p)) for p in programs]
    if kernel.config.split_tail:
        pieces = ["ATOMG.E.ADD" in p for p in programs]
        assert sum(pieces) == 1, "split_tail: no counter update"
        assert zeroes == [not p for p in pieces], "split_tail: the counters are not zeroed"
    else:
        assert not any(zeroes)


def test_q_quant_kernel_stages_bf16_q_by_tma_and_quantizes_it_in_16_byte_accesses():
    """q_quant=kernel: TMA stages the bf16 Q tile (a 256-byte row is two 128-byte swizzle
    boxes: one TMA load more than the e4m3 tile's); each consumer thread reads its two rows'
    quarter of head_dim in 16-byte shared loads (2 rows x 4 at head_dim 128) and writes the
    codes in 16-byte stores (2 x 2). Narrower accesses would mean a swizzle unit was split."""
    import re
    from collections import Counter

    from variants.cubin import disassemble, nvdisasm_path

    if nvdisasm_path() is None:
        pytest.skip("nvdisasm not installed")

    def opcodes(cfg):
        kernel = wgmma.compile(cfg, PROBLEM, "sm_90a")
        sass = disassemble(kernel.cubin_path.read_bytes())
        return Counter(re.findall(r"\b(LDS(?:\.\w+)*|STS(?:\.\w+)*|UTMALDG(?:\.\w+)*)", sass))

    def narrow(counts):  # the block scales' slots: 4- and 8-byte accesses
        return Counter({op: n for op, n in counts.items()
                        if op.startswith(("LDS", "STS")) and not op.endswith(".128")})

    ours = opcodes(dataclasses.replace(RECIPE, q_quant="kernel"))
    prepared = opcodes(RECIPE)
    assert ours["LDS.128"] == 8 and ours["STS.128"] == 4, ours
    assert not prepared["LDS.128"] and not prepared["STS.128"], prepared
    # Every narrower access is one of the scale slots', which Q from prepare has too (and more:
    # its Q row scales).
    assert narrow(ours) and not narrow(ours) - narrow(prepared), (ours, prepared)
    assert ours["UTMALDG.4D"] == prepared["UTMALDG.4D"] + 1


def test_cases_cover_every_knob_value():
    space = wgmma.space("sm_90a")
    seen = {name: set() for name in space}
    for overrides in CASES:
        for name, value in case_config(RECIPE, PROBLEM, overrides)[0].to_dict().items():
            seen[name].add(value)
    # pack_gqa needs grouped KV heads: tests/test_wgmma_pack_gqa_compile.py compiles its values.
    for cfg, _ in _pack_gqa_builds():
        for name, value in cfg.to_dict().items():
            seen[name].add(value)
    for name, values in space.items():
        assert set(values) <= seen[name], name


def _pack_gqa_builds():
    """(config, problem) of each build of tests/test_wgmma_pack_gqa_compile.py."""
    from tests.test_wgmma_pack_gqa_compile import CASES as PACKED

    builds = []
    for heads, kv_heads, head_dim, causal, overrides in PACKED:
        problem = Problem(1, heads, 77, head_dim=head_dim, causal=causal, kv_heads=kv_heads)
        builds.append((dataclasses.replace(wgmma.default("sm_90a", problem),
                                           **{"pack_gqa": True, **overrides}), problem))
    return builds


def test_q_quant_kernel_refuses_fp8_and_mislaid_inputs_by_name():
    """A kernel that quantizes Q reads bf16 q: FP8 callers are sent to the prepare twin, and
    inputs prepared for the other kind of kernel are refused before any launch."""
    import torch


    ours = wgmma.compile(dataclasses.replace(RECIPE, q_quant="kernel"), PROBLEM, "sm_90a")
    twin = wgmma.compile(RECIPE, PROBLEM, "sm_90a")
    q, k, v = (torch.randn(1, 77, 2, 128).bfloat16() for _ in range(3))
    codes = q.to(torch.float8_e4m3fn)
    ones = torch.ones(1, 2)
    with pytest.raises(ValueError, match="for_q_dtype"):
        ours.prepare_fp8(codes, codes, codes, (ones, ones, ones))
    with pytest.raises(ValueError, match="this kernel reads bf16"):
        ours.run(twin.prepare(q, k, v))
    with pytest.raises(ValueError, match="this kernel reads e4m3 codes"):
        twin.run(ours.prepare(q, k, v))


def test_per_head_kv_scales_drop_the_strip_scales_and_refuse_block_inputs_by_name():
    """kv_scales=head: the consumers read no strip scales (fewer shared loads, fewer mbarrier
    operations than the block build's), and inputs with scales per 64 keys are refused before
    any launch, the FP8 entry's and another prepare's alike."""
    import torch

    from variants.cubin import disassemble, nvdisasm_path

    head = wgmma.compile(dataclasses.replace(RECIPE, kv_scales="head"), PROBLEM, "sm_90a")
    block = wgmma.compile(RECIPE, PROBLEM, "sm_90a")
    if nvdisasm_path() is not None:
        def consumer_ops(kernel):
            sass = disassemble(kernel.cubin_path.read_bytes())
            consumers = sass.partition("USETMAXREG.TRY_ALLOC")[2]
            return [len(re.findall(rf"\b{op}\b", consumers)) for op in ("LDS", "SYNCS")]

        (lds_head, syncs_head), (lds_block, syncs_block) = consumer_ops(head), consumer_ops(block)
        assert lds_head < lds_block and syncs_head < syncs_block
    q, k, v = (torch.randn(1, 77, 2, 128).bfloat16() for _ in range(3))
    codes = q.to(torch.float8_e4m3fn)
    per_head, per_block = torch.ones(1, 2), torch.ones(1, 2, 2)
    fp8 = wgmma.compile(head.config.for_q_dtype("float8_e4m3fn"), PROBLEM, "sm_90a")
    with pytest.raises(ValueError, match="per 64 keys: run the config with kv_scales='block'"):
        fp8.prepare_fp8(codes, codes, codes, (per_head, per_block, per_head))
    with pytest.raises(ValueError, match="reads one per \\(batch, KV head\\)"):
        head.run(block.prepare(q, k, v))
    assert fp8.prepare_fp8(codes, codes, codes, (per_head,) * 3).kv_head_scales
    assert head.prepare(q, k, v).kv_head_scales and not block.prepare(q, k, v).kv_head_scales

