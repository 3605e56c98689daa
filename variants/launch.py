"""Launch a compiled CuTe DSL function with a few microseconds of host work.

The DSL's own call (`JitCompiledFunction.__call__`) marshals its arguments again on every launch:
a Pointer object per address, a Numeric per scalar, an adapter for the stream, the signature
check. On the H200's host that cost ~105 us per launch (benchmarks/e2e_profile.py), more than the
attention kernel itself at B=4 S=1024 H=32, and prepare launches its kernels three to six times.

What the marshalling produces is one C cell per argument and a list of the cells' addresses, which
it hands to `run_compiled_program` (a public method of the compiled function). FastLaunch keeps one
ctypes cell per argument, allocated once, overwrites their values per launch and calls that same
method with the same addresses. The first launch goes through the DSL's own call, which also checks
the arguments against the compiled signature. tests/test_launch.py checks on the CPU, for the
quantize kernels and an attention kernel, that the cells hold byte for byte what the DSL's
marshalling writes for the same values; tests/gpu/test_runtime_gpu.py that outputs are bit-identical
to a launch through the DSL's call.
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass

__all__ = ["FastLaunch", "Slot", "pointer", "scalar", "STREAM"]


@dataclass(frozen=True)
class Slot:
    """One argument of a compiled function: a global-memory pointer (with its element type and
    assumed alignment, which the first, checked launch needs), a 32-bit scalar, or the stream."""

    kind: str  # "pointer", "Int32", "Float32" or "stream"
    dtype: str = ""  # cutlass element type name of a pointer
    align: int = 0  # assumed alignment of a pointer, bytes

    def cell(self) -> ctypes._SimpleCData:
        return {"pointer": ctypes.c_void_p, "stream": ctypes.c_void_p,
                "Int32": ctypes.c_int32, "Float32": ctypes.c_float}[self.kind]()

    def dsl_value(self, value):
        """The value as the DSL's own call takes it."""
        import cutlass

        if self.kind == "pointer":
            import cutlass.cute as cute
            from cutlass.cute.runtime import make_ptr

            return make_ptr(getattr(cutlass, self.dtype), value, cute.AddressSpace.gmem,
                            assumed_align=self.align)
        if self.kind == "stream":
            import cuda.bindings.driver as cuda

            return cuda.CUstream(value)
        return getattr(cutlass, self.kind)(value)


def pointer(dtype: str, align: int) -> Slot:
    return Slot("pointer", dtype, align)


def scalar(kind: str) -> Slot:
    return Slot(kind)


STREAM = Slot("stream")


class FastLaunch:
    """`launch(*values)`: the compiled function on raw values (ints for pointers and the stream
    handle, Python numbers for scalars), in the order of `slots`."""

    def __init__(self, fn, slots: tuple[Slot, ...]) -> None:
        self._fn = fn
        self.slots = tuple(slots)
        self._cells = [slot.cell() for slot in self.slots]
        self._addresses = [ctypes.addressof(cell) for cell in self._cells]
        self._checked = False
        # The cells are shared state: two threads launching at once must not interleave writes.
        self._lock = threading.Lock()

    def dsl_args(self, values) -> tuple:
        return tuple(slot.dsl_value(v) for slot, v in zip(self.slots, values, strict=True))

    def fill(self, values) -> list[int]:
        """Write the values into the cells; the addresses run_compiled_program takes."""
        for cell, value in zip(self._cells, values, strict=True):
            cell.value = value
        return self._addresses

    def __call__(self, *values) -> None:
        with self._lock:
            if not self._checked:
                # Once through the DSL's checked call (it also creates the function's executor).
                self._fn(*self.dsl_args(values))
                self._checked = True
                return
            self._fn.run_compiled_program(self.fill(values))
