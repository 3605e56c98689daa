"""Launches recorded inside benchmarks.host_stub's stand-in (CPU tensors pass for CUDA ones): what
the CPU tests of the call plans compare."""

import contextlib
import ctypes

from benchmarks.host_stub import stood_in
from variants.launch import FastLaunch


@contextlib.contextmanager
def recorded_launches(zero_outputs=lambda: False, head_dim: int = 128):
    """Yields (launch Counter, recorded launches [(function, values)]). Where zero_outputs()
    (CPU tensors only: meta ones have no memory), the kernels' outputs that a call reads back
    on the host side are written as zeros: the LSE (K smoothing's shift is added to it) and the
    quantization's q . m."""
    seen = []
    real = FastLaunch.__call__

    def record(self, *values):
        seen.append((self._fn, values))
        name = self._fn.name
        if not zero_outputs():
            pass
        elif name.startswith("attention"):  # lse (batch, heads, seq_len) fp32
            ctypes.memset(values[5], 0, 4 * values[7] * values[8] * values[9])
        elif name == "prepare quant" and values[8]:  # shift (batch, heads, seq_len) fp32
            ctypes.memset(values[8], 0, 4 * values[9] * values[10] * values[12])
        elif name == "prepare mean":  # m (batch * kv_heads, head_dim) fp32
            ctypes.memset(values[1], 0, 4 * values[2] * head_dim)
        return real(self, *values)

    FastLaunch.__call__ = record
    try:
        with stood_in("h100") as launches:
            yield launches, seen
    finally:
        FastLaunch.__call__ = real
