"""mma_sync family on a GPU: every feasible config of the sm_90a space is validated against the
fp32 reference on the dequantized FP8 inputs (variants.reference), at S = 1 (one key), 77 (ragged
query tile and key strip) and 4096, plus two configs at the target shape S = 30272, H = 56.
Inputs are fresh random draws each run (the seed is in the failure message); outputs are poisoned
with NaN first so an unwritten element cannot pass. On Hopper mma.sync e4m3 is emulated: these
runs check correctness, not speed."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from tuner.gpus import PROFILES
from tuner.problem import Problem
from variants.base import enumerate_space
from variants.mma_sync import Config, can_implement, compile, default, space
from variants.reference import accuracy, dequantized_v_absmax, reference_attention

pytestmark = pytest.mark.gpu

ARCH = "sm_90a"
GPU = PROFILES["h200"]
HEADS = 3
SEQ_LENS = (1, 77, 4096)


def _feasible_configs() -> list[Config]:
    problem = Problem(batch=1, heads=HEADS, seq_len=4096)
    return [cfg for cfg in enumerate_space(Config, space(ARCH))
            if can_implement(cfg, problem, GPU)[0]]


def _check(cfg: Config, problem: Problem) -> None:
    seed = int.from_bytes(os.urandom(4), "little")
    gen = torch.Generator(device="cuda").manual_seed(seed)
    kernel = compile(cfg, problem, ARCH)
    shape = (problem.batch, problem.seq_len, problem.heads, problem.head_dim)
    q, k, v = (torch.randn(shape, generator=gen, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))
    prepared = kernel.prepare(q, k, v)
    out = torch.full(shape, float("nan"), device="cuda", dtype=torch.bfloat16)
    lse = torch.full((problem.batch, problem.heads, problem.seq_len), float("nan"),
                     device="cuda", dtype=torch.float32)
    got_out, got_lse = kernel.run(prepared, out, lse)
    torch.cuda.synchronize()
    assert got_out is out and got_lse is lse
    ref_out, ref_lse = reference_attention(prepared)
    metrics = accuracy(out, lse, ref_out, ref_lse, dequantized_v_absmax(prepared))
    assert metrics.passed, (f"{cfg.short()} {problem.key()} seed={seed}: {metrics.reason} "
                            f"{metrics.to_dict()}")


@pytest.mark.parametrize("cfg", _feasible_configs(), ids=lambda c: c.short().replace(" ", ","))
def test_sm90_space_is_correct(cfg):
    for seq_len in SEQ_LENS:
        _check(cfg, Problem(batch=1, heads=HEADS, seq_len=seq_len))


def test_batch_and_head_dim_64():
    cfg = default(ARCH)
    _check(cfg, Problem(batch=2, heads=2, seq_len=300))
    _check(cfg, Problem(batch=2, heads=2, seq_len=300, head_dim=64))


@pytest.mark.parametrize("cfg", [
    default(ARCH),
    dataclasses.replace(default(ARCH), block_m=64, rows_per_warp=16, block_n=64, kv_stages=1,
                        p_staging="smem"),
], ids=["default", "seed-first"])
def test_target_shape(cfg):
    _check(cfg, Problem(batch=1, heads=56, seq_len=30272))
