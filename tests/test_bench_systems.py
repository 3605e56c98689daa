"""Our rows of `tuner bench` (tuner.bench.our_systems), on the CPU: the tuned config first, the
family default, and head-scales, the tuned config with one K and V scale per (batch, KV head)
(FA3 FP8's convention, wgmma's kv_scales), or a note where the family cannot build it."""

from __future__ import annotations

import dataclasses

from tuner.bench import AGAINST, our_systems
from tuner.gpus import PROFILES
from tuner.problem import Problem
from tuner.runtime import BestConfig
from variants import mma_sync, wgmma

H100 = PROFILES["h100"]
PROBLEM = Problem(1, 56, 8192)


def test_head_scales_is_the_tuned_wgmma_config_with_per_head_kv_scales():
    tuned = dataclasses.replace(wgmma.default("sm_90a", PROBLEM), q_quant="kernel", block_n=64)
    best = BestConfig("wgmma", tuned, "table-exact")
    rows = our_systems(best, ["default", "head-scales", "fa3-fp8"], PROBLEM, H100)
    assert [(system, family) for system, family, _, _ in rows] == \
        [("tuned", "wgmma"), ("default", "wgmma"), ("head-scales", "wgmma")]
    assert rows[0][2] is tuned
    head = rows[2][2]
    # Per head needs Q's scales from prepare; everything else is the tuned config's.
    assert head == dataclasses.replace(tuned, kv_scales="head", q_quant="prepare")
    assert wgmma.can_implement(head, PROBLEM, H100) == (True, None)
    assert "head-scales" in AGAINST


def test_a_family_without_the_knob_gets_a_note_not_a_row_to_time():
    best = BestConfig("mma_sync", mma_sync.default("sm_90a"), "default")
    (_, _, tuned, _), (system, _, cfg, note) = our_systems(best, ["head-scales"], PROBLEM, H100)
    assert tuned is best.config
    assert system == "head-scales" and cfg is None
    assert note == "skipped: mma_sync has no kv_scales knob"
