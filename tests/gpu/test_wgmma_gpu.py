"""wgmma kernels on the GPU through the correctness gate (tuner.measure.validate_kernel: random
and structured inputs, fresh each run, outputs poisoned with NaN, the fp32 reference on the
gate's own quantization).

Every feasible config of the sm_90a space at S in {1, 77, 4097} (B=1, H=2; the gate adds its
structured inputs at B=2, S odd): ragged tails, a single key, a lone row and key past the last
tile; then the three fastest configs measured on the H200
(benchmarks/wgmma_h200.py) at the video-DiT shape S=30272, H=56. The space has 1572 feasible
configs of one tile order (524 layouts x fma_exp2 0, 1, 2; 288 x 3 with v_layout=prepared,
236 x 3 with kernel); the sweep runs tile_order=per_head only (the other order changes nothing
but the tile -> (query block, head) map, which tests/gpu/test_shapes_gpu.py runs on every shape
with each config it checks) at ~2 s of compile each: compile them in
parallel first (`tuner space --gpu h200 --family wgmma --compile --jobs 16`), then the checks
load them from disk.
"""

import os

import pytest
import torch

from tuner.gate import validate_kernel
from tuner.gpus import PROFILES
from tuner.problem import Problem
from variants import wgmma
from variants.base import enumerate_space

pytestmark = pytest.mark.gpu

H200 = PROFILES["h200"]
_SPACE_PROBLEM = Problem(batch=1, heads=2, seq_len=4096)
# split_tail's configs are left to tests/gpu/test_split_tail_gpu.py: at these small shapes its
# cost rule keeps almost every tail whole, so they would time the same kernels twice.
FEASIBLE = [c for c in enumerate_space(wgmma.Config, wgmma.space("sm_90a"))
            if c.tile_order == "per_head" and not c.split_tail
            and wgmma.can_implement(c, _SPACE_PROBLEM, H200)[0]]

# The fastest three of benchmarks/wgmma_h200.py on the H200 (see the family default's comment).
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


@pytest.mark.parametrize("cfg", FEASIBLE, ids=lambda c: c.short().replace(" ", ","))
def test_feasible_space_small_shapes(cfg):
    for seq_len in (1, 77, 4097):
        _check(cfg, Problem(batch=1, heads=2, seq_len=seq_len))


# v_layout=kernel: V read as (B, S, H, D) and transposed in shared memory by the producer. The
# space test above runs every feasible one at small shapes; these also at the video-DiT shape
# and with batch 2 / 3 heads (the staging ring's TMA coordinates).
V_IN_KERNEL = [
    dict(consumer_wgs=2, block_n=128, kv_stages=2, p_source=p_source, intra_wg_overlap=True,
         pingpong=True, persistent=True, v_layout="kernel")
    for p_source in ("registers", "smem")
] + [dict(consumer_wgs=1, block_n=64, kv_stages=3, p_source="registers", intra_wg_overlap=False,
          pingpong=False, persistent=False, v_layout="kernel")]


@pytest.mark.parametrize("overrides", V_IN_KERNEL, ids=["default-RS", "default-SS", "1wg-64"])
def test_v_layout_kernel_against_reference(overrides):
    cfg = wgmma.Config.from_dict(overrides)
    for problem in (Problem(1, 2, 1), Problem(1, 2, 77), Problem(2, 3, 4096),
                    Problem(1, 56, 30272)):
        _check(cfg, problem)


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


@pytest.mark.parametrize("overrides", HEAD_DIM_64,
                         ids=lambda o: (f"{o['v_layout']}-wg{o['consumer_wgs']}-n{o['block_n']}"
                                        f"-{o['p_source']}-e{o.get('fma_exp2', 0)}"
                                        f"-kv{o['kv_stages']}-q{o.get('q_quant', 'prepare')}"
                                        f"-ov{int(o['intra_wg_overlap'])}"))
def test_head_dim_64(overrides):
    cfg = wgmma.Config.from_dict(overrides)
    for problem in (Problem(1, 2, 77, head_dim=64), Problem(2, 3, 4096, head_dim=64)):
        assert wgmma.can_implement(cfg, problem, H200) == (True, None)
        _check(cfg, problem)


# Exponentials on the FMA pipe (fma_exp2): the space test runs every value at small shapes;
# here at the video-DiT shape and with batch 2 / 3 heads, both P sources.
@pytest.mark.parametrize("overrides", [dict(BEST[0], fma_exp2=2),
                                       dict(BEST[0], fma_exp2=1, p_source="smem")],
                         ids=["RS-e2", "SS-e1"])
def test_fma_exp2_against_reference(overrides):
    cfg = wgmma.Config.from_dict(overrides)
    for problem in (Problem(2, 3, 4096), Problem(1, 56, 30272)):
        _check(cfg, problem)


@pytest.mark.parametrize("overrides", BEST, ids=["best1", "best2", "best3"])
def test_best_configs_at_video_dit_shape(overrides):
    _check(wgmma.Config.from_dict(overrides), Problem(batch=1, heads=56, seq_len=30272))
