"""What a search ranks candidates by: what a caller pays per call, the kernel plus the
quantization (`prepare`) its config asks for.

A config changes the quantization where it changes V's layout (wgmma's v_layout: the cast writes V
transposed and key-permuted, or in its natural layout for a kernel that transposes it itself) or
the padding; the kernel alone would rank a config that only moves work into prepare as faster than
it is. Where every candidate shares one quantization the sum ranks exactly as the kernel does, up
to prepare's own noise (CUDA-event medians, microseconds). Both times are stored and reported.
"""

from __future__ import annotations


def caller_ms(median_ms: float | None, prepare_ms: float | None) -> float | None:
    """Kernel plus prepare (None without a kernel time; a missing prepare time counts 0)."""
    if median_ms is None:
        return None
    return median_ms + (prepare_ms or 0.0)


def record_cost(record) -> float | None:
    """caller_ms of a stored trial (tuner.store.TrialRecord)."""
    return caller_ms(record.median_ms, record.prepare_ms)
