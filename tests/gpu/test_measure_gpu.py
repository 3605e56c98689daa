"""tuner.measure times the GPU's work, not the host's launch rate: at a shape whose prepare and
kernel take less GPU time than Python takes to launch them, time_kernel's numbers agree with the
same calls timed behind a 100 ms GPU spin (which no host can fall behind)."""

import statistics

import pytest
import torch

from tuner import measure
from tuner.gpus import local_profile
from tuner.problem import Problem
from variants import wgmma

pytestmark = pytest.mark.gpu

# B=1 S=1024 H=56 D=64: prepare is about 0.014 ms of GPU work on the H200 and 0.05 ms of host
# time a call; before the spin's rate was measured warm, time_kernel said 0.05-0.06 ms.
SMALL = Problem(1, 56, 1024, 64)


def _behind_a_long_spin(fn, repeats=20) -> float:
    torch.cuda._sleep(200_000_000)  # about 0.1 s at 2 GHz
    return statistics.median(measure.cuda_event_samples(fn, repeats))


@pytest.mark.parametrize("spin_rate", [None, 0.1], ids=["as-measured", "spin-10x-short"])
def test_small_prepare_and_kernel_times_are_the_gpus_work(spin_rate, monkeypatch):
    device = torch.device("cuda")
    if spin_rate is not None:
        # A spin that ends early (its cycles-per-ms measured at other clocks, say) must be
        # caught and the round run again, not time the host's launch rate.
        measure._queue_ahead(device, 0.0)  # the rate, measured
        key = str(device)
        monkeypatch.setitem(measure._SLEEP_CYCLES_PER_MS, key,
                            spin_rate * measure._SLEEP_CYCLES_PER_MS[key])
    kernel = wgmma.compile(wgmma.default("sm_90a", SMALL), SMALL, "sm_90a")
    timing = measure.time_kernel(kernel, SMALL, device, 7, local_profile().l2_bytes)

    inputs = [measure.random_inputs(SMALL, device, seed) for seed in range(4)]
    prepared = [kernel.prepare(*qkv, validate=False) for qkv in inputs]
    torch.cuda.synchronize()
    prepare_ms = _behind_a_long_spin(
        lambda i: kernel.prepare(*inputs[i % 4], validate=False))
    kernel_ms = _behind_a_long_spin(lambda i: kernel.run(prepared[i % 4]))

    # 25% and 4 us of slack: L2 warmth and clocks differ a little between the two ways.
    assert timing.prepare_ms <= 1.25 * prepare_ms + 0.004, (timing.prepare_ms, prepare_ms)
    assert timing.median_ms <= 1.25 * kernel_ms + 0.004, (timing.median_ms, kernel_ms)
