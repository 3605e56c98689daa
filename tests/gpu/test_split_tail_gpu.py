"""split_tail on the GPU: the last wave's tiles split along the keys over every SM and merged by
the warp that completes each tile (variants/wgmma/split_tail.py), through the correctness gate
(tuner.gate.validate_kernel: random and structured inputs, NaN-poisoned outputs, the fp32
reference) at shapes whose tile counts put the split in each of its cases on the H200's 132
SMs, and end to end through tuner.attention. `-m gpu` runs each shape with one of the configs
(cycling, so each config meets three shapes); `-m gpu_full` every config on every shape."""

import dataclasses
import os

import pytest
import torch

import tuner
from tests.gpu import tiered
from tuner.gate import validate_kernel
from tuner.gpus import PROFILES
from tuner.problem import Problem
from variants import wgmma
from variants.reference import validate
from variants.wgmma.split_tail import split_tiles

# (batch, heads, seq_len, seq_len_kv, kv_heads, head_dim, whether the tail is split): tiles of
# 128 rows (192 at head_dim 64, three consumer warpgroups) and strips of 128 keys against the
# H200's 132 SMs; the split runs where it saves more than it costs (split_tail.split_tiles).
SHAPES = [
    (1, 2, 77, 3000, 2, 128, True),      # 2 tiles of 24 strips: 24 pieces of one strip each
    (1, 4, 1000, 4000, 2, 128, True),    # 32 tiles, 32 strips: every tile split 4-5 ways
    (1, 4, 1, 2049, 4, 128, True),       # one query row a head; the ragged strip in a piece
    (1, 9, 4097, 4097, 3, 128, True),    # 297 tiles: two whole waves, a tail of 33
    (2, 5, 2000, 3000, 5, 128, True),    # cross-attention, ragged keys: a tail of 28 of 160
    (1, 8, 4097, 4097, 1, 128, False),   # 264 tiles: no tail
    (1, 4, 1000, 1000, 2, 128, False),   # 8 strips a tile: the split would cost more
    (1, 8, 1000, 3000, 2, 64, True),     # grouped heads, head_dim 64: 48 tiles of 192 rows
    (2, 6, 2500, 2500, 3, 64, True),     # 168 tiles: a whole wave and a tail of 36
]

CONFIGS = [
    dict(split_tail=True),
    dict(split_tail=True, intra_wg_overlap=False, pingpong=False, q_quant="kernel"),
    dict(split_tail=True, v_layout="kernel", p_source="smem", kv_stages=3),
]


def _config(problem, overrides):
    cfg = dataclasses.replace(wgmma.default("sm_90a", problem), persistent=True, **overrides)
    ok, reason = wgmma.can_implement(cfg, problem, PROFILES["h200"])
    assert ok, reason
    return cfg


def _problem(shape):
    batch, heads, seq, seq_kv, kv_heads, head_dim, _ = shape
    return Problem(batch, heads, seq, head_dim, seq_len_kv=seq_kv, kv_heads=kv_heads)


def gpu_builds(name, params):
    """The kernels a test here builds (tests/conftest.py compiles them ahead, in parallel; a
    split_tail build brings its split_tail=False twin)."""
    if "shape" not in params:
        return []
    problem = _problem(params["shape"])
    return [("wgmma", _config(problem, params["overrides"]), problem)]


@pytest.mark.parametrize("overrides, shape", tiered(
    [(o, s) for s in SHAPES for o in CONFIGS],
    lambda _, case: CONFIGS.index(case[0]) == SHAPES.index(case[1]) % len(CONFIGS),
    ids=lambda case: ",".join(f"{k}={v}" for k, v in case[0].items())
    + "-b{}-h{}-s{}-kv{}-kvh{}-d{}".format(*case[1])))
def test_the_gate_passes_split_tail(overrides, shape):
    batch, heads, seq, seq_kv, kv_heads, head_dim, splits = shape
    problem = _problem(shape)
    cfg = _config(problem, overrides)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    tiles = batch * heads * -(-seq // cfg.block_m)
    if sms == 132:  # the shapes were picked for the H200's SM count
        assert bool(split_tiles(tiles, sms, -(-seq_kv // cfg.block_n))) == splits
    seed = int.from_bytes(os.urandom(4), "little")
    report = validate_kernel(wgmma.compile(cfg, problem, "sm_90a"), problem,
                             torch.device("cuda"), seed)
    assert report.passed, f"seed={seed} {cfg.short()}: {report.reason}"


@pytest.mark.gpu
def test_split_tail_agrees_with_the_whole_tiles_and_repeats(tmp_path, monkeypatch):
    """The same inputs with and without the split: outputs within the rounding of a different
    summation order (the merge adds the pieces' fp32 partial sums, each P rounded to e4m3 the
    same way), and two split launches give the same bits (the pieces' slots and the merge's
    order are fixed; the whole tiles' program zeroes the counters, so a launch starts clean
    whatever its workspace holds: here every word of it is poisoned with NaN)."""
    monkeypatch.setenv("TUNER_DB_URL", f"sqlite:///{tmp_path / 'empty.sqlite'}")
    from variants.build import CompiledKernel

    def poisoned(words, device):
        return torch.full((words,), float("nan"), device=device) if words else None

    # prepare + run's workspace (the launch plan's is a part of its scratch block, torch.empty)
    monkeypatch.setattr(CompiledKernel, "_workspace", staticmethod(poisoned))
    g = torch.Generator(device="cuda").manual_seed(11)
    q = torch.randn(2, 2000, 6, 128, device="cuda", generator=g, dtype=torch.bfloat16)
    k, v = (torch.randn(2, 4000, 6, 128, device="cuda", generator=g, dtype=torch.bfloat16)
            for _ in range(2))
    problem = Problem(2, 6, 2000, 128, seq_len_kv=4000)  # 192 tiles: a tail of 60 is split
    whole = dataclasses.replace(_config(problem, {}), split_tail=False)
    split = dataclasses.replace(whole, split_tail=True)
    out, lse = tuner.attention(q, k, v, config=whole, return_lse=True)
    kernel = wgmma.compile(split, problem, "sm_90a")
    got, got_lse = kernel.run(kernel.prepare(q, k, v))
    again, again_lse = kernel.run(kernel.prepare(q, k, v))
    # The launch plan's path (a repeated call), its workspace wherever the allocator puts it.
    for _ in range(3):
        planned, planned_lse = tuner.attention(q, k, v, config=split, return_lse=True)
        assert torch.equal(planned, got) and torch.equal(planned_lse, got_lse)
    assert torch.equal(got, again) and torch.equal(got_lse, again_lse)
    assert validate(q, k, v, got, got_lse, k_smoothing=split.k_smoothing,
                    qk_rotation=split.qk_rotation).passed
    assert (got.float() - out.float()).abs().max().item() < 2e-2
    assert (got_lse - lse).abs().max().item() < 1e-3


def _kernels_launched(kernel, prepared) -> list[str]:
    """Names of the GPU kernels one run() queues (CUPTI through torch.profiler), after a warm-up
    run so that nothing but the launch itself is in the trace."""
    from torch.profiler import ProfilerActivity, profile

    kernel.run(prepared)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        kernel.run(prepared)
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


@pytest.mark.gpu
def test_a_tail_the_rule_keeps_whole_runs_in_one_launch():
    """Where the cost rule keeps the tail whole, a split_tail kernel runs its split_tail=False
    twin: one kernel, no empty pieces launch; where it splits, the whole tiles (which zero the
    counters) and the pieces, and nothing else."""
    g = torch.Generator(device="cuda").manual_seed(5)

    def launched(batch, heads, seq, seq_kv):
        problem = Problem(batch, heads, seq, 128, seq_len_kv=seq_kv)
        # K smoothing off: its LSE shift would add kernels of its own to the count.
        kernel = wgmma.compile(_config(problem, dict(split_tail=True, k_smoothing="off")),
                               problem, "sm_90a")
        q = torch.randn(batch, seq, heads, 128, device="cuda", generator=g, dtype=torch.bfloat16)
        k, v = (torch.randn(batch, seq_kv, heads, 128, device="cuda", generator=g,
                            dtype=torch.bfloat16) for _ in range(2))
        return _kernels_launched(kernel, kernel.prepare(q, k, v))

    if torch.cuda.get_device_properties(0).multi_processor_count != 132:
        pytest.skip("the shapes were picked for the H200's 132 SMs")
    kept = launched(1, 4, 1000, 1000)  # 32 tiles of 8 strips: kept whole
    split = launched(1, 4, 1000, 4000)  # 32 tiles of 32 strips: split
    assert len(kept) == 1, kept
    assert len(split) == 2, split
