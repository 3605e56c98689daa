"""mma_sync family on a GPU: every feasible config of the sm_90a space passes the correctness gate
(tuner/gate.py: random and structured inputs, the fp32 reference on the gate's own quantization)
at S = 1 (one key), 77 (ragged query tile and key strip) and 4097 (a lone row and key past the
last full tile), plus two configs at the target shape S = 30272, H = 56. Inputs are fresh random
draws each run (the seed is in the failure message). On Hopper mma.sync e4m3 is emulated: these
runs check correctness, not speed."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from tuner.gate import validate_kernel
from tuner.gpus import PROFILES
from tuner.problem import Problem
from variants.base import enumerate_space
from variants.mma_sync import Config, can_implement, compile, default, space

pytestmark = pytest.mark.gpu

ARCH = "sm_90a"
GPU = PROFILES["h200"]
HEADS = 3
SEQ_LENS = (1, 77, 4097)


def _feasible_configs() -> list[Config]:
    problem = Problem(batch=1, heads=HEADS, seq_len=4096)
    return [cfg for cfg in enumerate_space(Config, space(ARCH))
            if can_implement(cfg, problem, GPU)[0]]


def _check(cfg: Config, problem: Problem) -> None:
    seed = int.from_bytes(os.urandom(4), "little")
    kernel = compile(cfg, problem, ARCH)
    report = validate_kernel(kernel, problem, torch.device("cuda"), seed)
    assert report.passed, f"{cfg.short()} {problem.key()} seed={seed}: {report.reason}"


def test_run_writes_into_the_given_outputs():
    problem = Problem(batch=1, heads=HEADS, seq_len=77)
    kernel = compile(default(ARCH), problem, ARCH)
    q, k, v = (torch.randn(1, 77, HEADS, 128, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))
    out = torch.full_like(q, float("nan"))
    lse = torch.full((1, HEADS, 77), float("nan"), device="cuda")
    got_out, got_lse = kernel.run(kernel.prepare(q, k, v), out, lse)
    assert got_out is out and got_lse is lse and bool(torch.isfinite(out).all())


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
