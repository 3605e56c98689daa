"""mma_sync family on a GPU through the correctness gate (tuner/gate.py: random and structured
inputs, the fp32 reference on the gate's own quantization) at S = 1 (one key), 77 (ragged query
tile and key strip) and 4097 (a lone row and key past the last tile): `-m gpu` on a pairwise
cover of the sm_90a space (every value of every knob with every value of every other knob: 13
configs, pv_accum=fp16 against each of the others' values among them), `-m gpu_full` on every
feasible config (288); the default at the target shape S = 30272, H = 56 (and in gpu_full the
seed's first kernel there). Inputs are fresh random draws each run (the seed is in the failure
message). On Hopper mma.sync e4m3 is emulated: these runs check correctness, not speed."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from tests.gpu import pairwise_cover, tiered
from tuner.gate import validate_kernel
from tuner.gpus import PROFILES
from tuner.measure import poisoned_outputs
from tuner.problem import Problem
from variants.base import enumerate_space
from variants.mma_sync import Config, can_implement, compile, default, space
from variants.prepare_check import prepare_mismatch
from variants.reference import quantize_reference, validate

ARCH = "sm_90a"
GPU = PROFILES["h200"]
HEADS = 3
SEQ_LENS = (1, 77, 4097)


def _feasible_configs() -> list[Config]:
    problem = Problem(batch=1, heads=HEADS, seq_len=4096)
    return [cfg for cfg in enumerate_space(Config, space(ARCH))
            if can_implement(cfg, problem, GPU)[0]]


def _check(cfg: Config, problem: Problem, inputs=None) -> None:
    """inputs: (q, k, v) to use instead of a fresh random draw."""
    seed = int.from_bytes(os.urandom(4), "little")
    kernel = compile(cfg, problem, ARCH)
    if inputs is None:
        report = validate_kernel(kernel, problem, torch.device("cuda"), seed)
        assert report.passed, f"{cfg.short()} {problem.key()} seed={seed}: {report.reason}"
        return
    q, k, v = inputs
    prepared = kernel.prepare(q, k, v)
    assert prepare_mismatch(prepared, quantize_reference(q, k, v)) is None
    out, lse = poisoned_outputs(problem.batch, problem.heads, problem.seq_len, problem.head_dim,
                                "cuda")
    kernel.run(prepared, out, lse)
    torch.cuda.synchronize()
    metrics = validate(q, k, v, out, lse)
    assert metrics.passed, f"{cfg.short()} {problem.key()}: {metrics.reason}"


FEASIBLE = _feasible_configs()
COVER = pairwise_cover(FEASIBLE)


def _short(cfg) -> str:
    return cfg.short().replace(" ", ",")


@pytest.mark.gpu
def test_run_writes_into_the_given_outputs():
    problem = Problem(batch=1, heads=HEADS, seq_len=77)
    kernel = compile(default(ARCH), problem, ARCH)
    q, k, v = (torch.randn(1, 77, HEADS, 128, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))
    out = torch.full_like(q, float("nan"))
    lse = torch.full((1, HEADS, 77), float("nan"), device="cuda")
    got_out, got_lse = kernel.run(kernel.prepare(q, k, v), out, lse)
    assert got_out is out and got_lse is lse and bool(torch.isfinite(out).all())


@pytest.mark.parametrize("cfg", tiered([(c,) for c in FEASIBLE], lambda _, case: case[0] in COVER,
                                       ids=lambda case: _short(case[0])))
def test_sm90_space_is_correct(cfg):
    for seq_len in SEQ_LENS:
        _check(cfg, Problem(batch=1, heads=HEADS, seq_len=seq_len))


@pytest.mark.gpu
def test_batch_and_head_dim_64():
    cfg = default(ARCH)
    _check(cfg, Problem(batch=2, heads=2, seq_len=300))
    _check(cfg, Problem(batch=2, heads=2, seq_len=300, head_dim=64))


@pytest.mark.parametrize("cfg", tiered([
    (default(ARCH),),
    (dataclasses.replace(default(ARCH), block_m=64, rows_per_warp=16, block_n=64, kv_stages=1,
                         p_source="smem"),),
], lambda i, _: i == 0, ids=lambda case: "default" if case[0] == default(ARCH) else "seed-first"))
def test_target_shape(cfg):
    _check(cfg, Problem(batch=1, heads=56, seq_len=30272))


# pv_accum=fp16 (two-level P @ V: f16-accumulate MMAs per strip, then fp32 O). On sm_90a ptxas
# emulates mma.sync e4m3 with f16 HMMA, and the f16-accumulate form with HMMA.16816.F16
# (tests/test_mma_sync_sass.py), so the H200 runs a genuine f16 accumulator: the P scale, the
# chunked accumulation and its layouts are checked here; sm_120's own QMMA.F16 rounding is not.
# Every block_n (each has its own P scale), both P paths, 16 and 32 rows a warp, every stage
# count, both swizzles and resident Q (gpu_full: in -m gpu the space test's pairwise cover holds
# fp16 with every value of every other knob); the whole sm_90a space is test_sm90_space_is_correct.
PV_FP16 = [dataclasses.replace(default(ARCH), pv_accum="fp16", **o) for o in (
    {},
    dict(p_source="smem", kv_stages=1),
    dict(kv_stages=3, swizzle="chunk_elems"),
    dict(block_m=64, rows_per_warp=16, block_n=64, p_source="smem"),
    dict(block_m=64, rows_per_warp=16, block_n=64, q_in_registers=True),
    dict(block_m=128, warps=8, rows_per_warp=16, block_n=128),
    dict(block_m=128, warps=8, rows_per_warp=16, block_n=128, p_source="smem",
         swizzle="chunk_elems"),
    dict(block_m=256, warps=8),
)]


@pytest.mark.parametrize("cfg", tiered([(c,) for c in PV_FP16], lambda *_: False,
                                       ids=lambda case: _short(case[0])))
def test_pv_accum_fp16_configs(cfg):
    assert can_implement(cfg, Problem(1, HEADS, 4096), GPU) == (True, None)
    for seq_len in SEQ_LENS:
        _check(cfg, Problem(batch=1, heads=HEADS, seq_len=seq_len))


# Every block_n with both signs (gpu_full); in -m gpu each block_n once, the signs alternating.
WORST_CASE = [(cfg, sign) for cfg in (PV_FP16[0], PV_FP16[3], PV_FP16[5]) for sign in (1.0, -1.0)]


@pytest.mark.parametrize("block_n_cfg, sign", tiered(
    WORST_CASE, lambda i, _: i % 4 in (0, 3),
    ids=lambda case: f"block_n={case[0].block_n}-{'plus' if case[1] > 0 else 'minus'}"))
def test_pv_accum_fp16_worst_case_strip(block_n_cfg, sign):
    # The strip sum's worst case: every score equal (q = k = 1), so every P is the row max's
    # 2^shift, against V codes all +-448 (v constant): block_n * 2^shift * 448 = 57344 per
    # strip, just under fp16's 65504. One bit more of P scale overflows to Inf, which the gate
    # rejects; the right output is v itself. S = 4096 (many strips) and 77 (ragged last strip).
    for seq_len in (77, 4096):
        problem = Problem(batch=1, heads=2, seq_len=seq_len)
        shape = (1, seq_len, 2, problem.head_dim)
        ones = torch.ones(shape, device="cuda", dtype=torch.bfloat16)
        # K as it is: smoothing would quantize k - mean(k) = 0 and leave the scores untested.
        _check(block_n_cfg.without_transforms(), problem, inputs=(ones, ones, ones * sign))


def gpu_builds(name, params):
    """The kernels a test here builds (tests/conftest.py compiles them ahead, in parallel)."""
    cfg = params.get("cfg", params.get("block_n_cfg", default(ARCH)))
    head_dims = (128, 64) if name == "test_batch_and_head_dim_64" else (128,)
    return [("mma_sync", cfg, Problem(1, HEADS, 77, head_dim)) for head_dim in head_dims]
