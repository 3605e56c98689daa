"""benchmarks/host.py's per-launch rows, on the CPU with the device work stood in
(benchmarks/host_stub.py): each launch a repeated tuner.attention call makes, timed in place."""

from __future__ import annotations

import torch

import tuner
from benchmarks.host import ALLOCATIONS, launch_parts, with_launches
from benchmarks.host_stub import stood_in
from tuner import api, plans
from tuner.problem import Problem


def test_the_host_suite_times_each_launch_inside_the_call_and_puts_the_launchers_back():
    """launch_parts: one row per launch the plan makes (the mean, the quantization, the
    kernel), each a positive time, every wrapped launch still made once per call; after it the
    plan holds its own launchers again."""
    with stood_in("h100") as launches:
        # B=9 S=2048 H=1: a tail that split_tail splits (the kernel's row is both programs).
        q, k, v = (torch.randn(9, 2048, 1, 128, dtype=torch.bfloat16) for _ in range(3))
        tuner.attention(q, k, v)
        plan = plans.CALLS[api.signature(q, k, v, False, None, "auto", None, None)].launch
        own = (plan._mean_launch, plan._quant, plan._attend)
        before = sum(launches.values())
        rows = launch_parts(q, k, v, False, 25)
        made = sum(launches.values()) - before
        restored = (plan._mean_launch, plan._quant, plan._attend) == own
    assert list(rows) == ["of which the mean launch", "of which the quantization launch",
                          "of which the kernel launch"]
    assert all(us > 0 for us in rows.values())
    assert made == 3 * 26  # 25 timed calls and the first
    assert restored
    ordered = with_launches({"whole": 1.0, ALLOCATIONS: 2.0, "rest": 3.0}, rows)
    assert list(ordered) == ["whole", ALLOCATIONS, *rows, "rest"]


def test_the_stand_in_reports_the_drop_ins_repeated_call():
    """benchmarks.host_stub's report times the SDPA drop-in (whole, repeated) beside the call,
    and not the custom op, which meta tensors send to its fake implementation."""
    from benchmarks.host_stub import report

    text = report(Problem(2, 2, 128, 128), "h100", calls=20, repeats=2, profile_calls=10, top=3)
    drop_in = [line for line in text.splitlines() if "SDPA drop-in" in line]
    assert len(drop_in) == 1 and float(drop_in[0].split()[-3]) > 0
    assert "custom op" not in text
