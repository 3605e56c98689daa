"""wgmma kernels on the GPU through the correctness gate (tuner.measure.validate_kernel: random
and structured inputs, fresh each run, outputs poisoned with NaN, the fp32 reference on the
gate's own quantization).

Small shapes S in {1, 77, 4097} (B=1, H=2; the gate adds its structured inputs at B=2, S odd):
ragged tails, a single key, a lone row and key past the last tile. `-m gpu` runs them on a
pairwise cover of the sm_90a space (every value of every knob with every value of every other
knob: 17 configs); `-m gpu_full` on every feasible config of one tile order, 20136
(tile_order=per_head: the other order changes nothing but the tile -> (query block, head) map,
which tests/gpu/test_shapes_gpu.py runs on every shape; split_tail is
tests/gpu/test_split_tail_gpu.py's), at ~2 s of compile each: tests/conftest.py compiles the
selected tests' builds in parallel first (gpu_builds below), the checks load them from disk. At
the video-DiT shape S=30272, H=56 `-m gpu` runs the fastest recipe and V transposed
in the kernel, `-m gpu_full` the other configs listed here.
"""

import os

import pytest
import torch

from tests.gpu import pairwise_cover, tiered
from tuner.gate import validate_kernel
from tuner.gpus import PROFILES
from tuner.problem import Problem
from variants import wgmma
from variants.base import enumerate_space

H200 = PROFILES["h200"]
_SPACE_PROBLEM = Problem(batch=1, heads=2, seq_len=4096)
LONG = Problem(batch=1, heads=56, seq_len=30272)
# split_tail's configs are left to tests/gpu/test_split_tail_gpu.py: at these small shapes its
# cost rule keeps almost every tail whole, so they would time the same kernels twice.
FEASIBLE = [c for c in enumerate_space(wgmma.Config, wgmma.space("sm_90a"))
            if c.tile_order == "per_head" and not c.split_tail
            and wgmma.can_implement(c, _SPACE_PROBLEM, H200)[0]]
COVER = pairwise_cover(FEASIBLE)

# The fastest three head_dim-128 configs of a full sweep on the H200 (docs/family-wgmma.md).
BEST = [
    dict(consumer_wgs=2, block_n=128, kv_stages=stages, p_source="registers",
         intra_wg_overlap=True, pingpong=True, persistent=True, v_layout="prepared")
    for stages in (2, 3, 4)  # 986, 985, 985 TFLOP/s at S=8192
]


def _check(cfg, problem):
    kernel = wgmma.compile(cfg, problem, "sm_90a")
    seed = int.from_bytes(os.urandom(4), "little")
    report = validate_kernel(kernel, problem, torch.device("cuda"), seed=seed)
    assert report.passed, f"{cfg.short()} at {problem.key()} seed={seed}: {report.reason}"


@pytest.mark.parametrize("cfg", tiered([(c,) for c in FEASIBLE], lambda _, case: case[0] in COVER,
                                       ids=lambda case: case[0].short().replace(" ", ",")))
def test_feasible_space_small_shapes(cfg):
    for seq_len in (1, 77, 4097):
        _check(cfg, Problem(batch=1, heads=2, seq_len=seq_len))


# v_layout=kernel: V read as (B, S, H, D) and transposed in shared memory by the producer. The
# space test above runs every feasible one at small shapes; these also with batch 2 / 3 heads
# (the staging ring's TMA coordinates) and at the video-DiT shape.
V_IN_KERNEL = [
    dict(consumer_wgs=2, block_n=128, kv_stages=2, p_source=p_source, intra_wg_overlap=True,
         pingpong=True, persistent=True, v_layout="kernel")
    for p_source in ("registers", "smem")
] + [dict(consumer_wgs=1, block_n=64, kv_stages=3, p_source="registers", intra_wg_overlap=False,
          pingpong=False, persistent=False, v_layout="kernel")]
V_IN_KERNEL_IDS = dict(zip(map(str, V_IN_KERNEL), ["default-RS", "default-SS", "1wg-64"],
                           strict=True))


@pytest.mark.gpu
@pytest.mark.parametrize("overrides", V_IN_KERNEL, ids=V_IN_KERNEL_IDS.values())
def test_v_layout_kernel_against_reference(overrides):
    cfg = wgmma.Config.from_dict(overrides)
    for problem in (Problem(1, 2, 1), Problem(1, 2, 77), Problem(2, 3, 4096)):
        _check(cfg, problem)


# The video-DiT shape: the fastest three and V transposed in the kernel; one of each in -m gpu.
@pytest.mark.parametrize("overrides", tiered(
    [(o,) for o in BEST + V_IN_KERNEL], lambda i, _: i in (0, len(BEST)),
    ids=lambda case: V_IN_KERNEL_IDS.get(str(case[0]), f"best-kv{case[0]['kv_stages']}")))
def test_configs_at_video_dit_shape(overrides):
    _check(wgmma.Config.from_dict(overrides), LONG)


# head_dim 64: 64-byte rows, so the 64-byte swizzle in the staging ring and K, two feature blocks
# per V-transpose step; with both V layouts, block_n 128 and 192 (a 64-byte V-ring swizzle).
HEAD_DIM_64 = [dict(BEST[0], v_layout=layout, block_n=block_n)
               for layout in ("prepared", "kernel") for block_n in (128, 192)]


# The head_dim-64 defaults (three consumer warpgroups, P in registers: short keys with Q
# quantized in the kernel, long keys with intra-WG overlap), the earlier default (P through
# smem, 4 stages) and the 2-warpgroup recipe with exponentials on the FMA pipe.
HEAD_DIM_64 += [wgmma.default("sm_90a", Problem(1, 2, 77, head_dim=64)).to_dict(),
                wgmma.default("sm_90a", Problem(1, 2, 8192, head_dim=64)).to_dict(),
                dict(wgmma.default("sm_90a", Problem(1, 2, 8192, head_dim=64)).to_dict(),
                     p_source="smem", kv_stages=4),
                dict(BEST[0], fma_exp2=2)]
HD64_PROBLEMS = (Problem(1, 2, 77, head_dim=64), Problem(2, 3, 4096, head_dim=64))


def _hd64_id(case) -> str:
    o, problem = case
    return (f"{o['v_layout']}-wg{o['consumer_wgs']}-n{o['block_n']}-{o['p_source']}"
            f"-e{o.get('fma_exp2', 0)}-kv{o['kv_stages']}-q{o.get('q_quant', 'prepare')}"
            f"-ov{int(o['intra_wg_overlap'])}-{problem.key()}")


# In -m gpu the four swizzle cases and the FMA-pipe exponentials, each on one of the two problems
# (alternating; the head_dim-64 defaults run in tests/gpu/test_shapes_gpu.py there); gpu_full:
# every config on both.
HD64_IN_GPU = [*HEAD_DIM_64[:4], HEAD_DIM_64[-1]]


@pytest.mark.parametrize("overrides, problem", tiered(
    [(o, p) for o in HEAD_DIM_64 for p in HD64_PROBLEMS],
    lambda i, case: case[0] in HD64_IN_GPU and i % 4 in (0, 3), ids=_hd64_id))
def test_head_dim_64(overrides, problem):
    cfg = wgmma.Config.from_dict(overrides)
    assert wgmma.can_implement(cfg, problem, H200) == (True, None)
    _check(cfg, problem)


# Exponentials on the FMA pipe (fma_exp2): the space test runs every value at small shapes;
# here with batch 2 / 3 heads (-m gpu) and at the video-DiT shape (gpu_full), both P sources.
FMA_EXP2 = [dict(BEST[0], fma_exp2=2), dict(BEST[0], fma_exp2=1, p_source="smem")]


@pytest.mark.parametrize("overrides, problem", tiered(
    [(o, p) for o in FMA_EXP2 for p in (Problem(2, 3, 4096), LONG)],
    lambda _, case: case[1] is not LONG,
    ids=lambda case: f"{'RS-e2' if case[0]['p_source'] == 'registers' else 'SS-e1'}-"
                     f"{case[1].key()}"))
def test_fma_exp2_against_reference(overrides, problem):
    _check(wgmma.Config.from_dict(overrides), problem)


def gpu_builds(name, params):
    """The kernels a test here builds (tests/conftest.py compiles them ahead, in parallel)."""
    cfg = params["cfg"] if "cfg" in params else wgmma.Config.from_dict(params["overrides"])
    return [("wgmma", cfg, params.get("problem", _SPACE_PROBLEM))]
