"""Launch a compiled CuTe DSL function with a few microseconds of host work.

The DSL's own call (`JitCompiledFunction.__call__`) marshals its arguments again on every launch:
a Pointer object per address, a Numeric per scalar, an adapter for the stream, the signature
check. On the H200's host that cost ~105 us per launch, more than the attention kernel itself at
B=4 S=1024 H=32.

What the marshalling produces is one C cell per argument and a list of the cells' addresses, which
it hands to `run_compiled_program` (a public method of the compiled function). FastLaunch keeps one
8-byte cell per argument in one buffer, allocated once, writes a launch's values into it with one
struct.pack_into and calls that same method with the same addresses. The first launch goes through
the DSL's own call, which also checks the arguments against the compiled signature.

run_compiled_program itself still rebuilds the packed argument array on every launch, a Python
loop over the addresses (~4 us for 13 arguments) before it calls the compiled host stub. Since the
cells never move, that array is the same every time: after the first launch FastLaunch copies it
once from the function's executor and then calls the stub with it directly, reading the CUDA
result the stub writes as run_compiled_program does. Where the executor lacks the attributes this
relies on (another DSL version), launches stay on run_compiled_program.

tests/test_launch.py checks on the CPU, for the quantize kernels and an attention kernel, that the
cells hold byte for byte what the DSL's marshalling writes for the same values, and that the
packed array is the executor's own; tests/gpu/test_runtime_gpu.py that outputs are bit-identical
to a launch through the DSL's call.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import struct
import threading
from dataclasses import dataclass

__all__ = ["FastLaunch", "LauncherCache", "Slot", "current_stream_handle", "device_arch",
           "pointer", "scalar", "STREAM"]

log = logging.getLogger(__name__)


# A slot's C type, and its struct format in a cell of CELL_BYTES (4-byte values padded).
_CTYPES = {"pointer": ctypes.c_void_p, "stream": ctypes.c_void_p, "Int32": ctypes.c_int32,
           "Float32": ctypes.c_float}
_FORMATS = {"pointer": "Q", "stream": "Q", "Int32": "i4x", "Float32": "f4x"}
CELL_BYTES = 8


@dataclass(frozen=True)
class Slot:
    """One argument of a compiled function: a global-memory pointer (with its element type and
    assumed alignment, which the first, checked launch needs), a 32-bit scalar, or the stream."""

    kind: str  # "pointer", "Int32", "Float32" or "stream"
    dtype: str = ""  # cutlass element type name of a pointer
    align: int = 0  # assumed alignment of a pointer, bytes

    def cell(self) -> ctypes._SimpleCData:
        return _CTYPES[self.kind]()

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
    handle, Python numbers for scalars), in the order of `slots`.

    The cells lie 8 bytes apart in one buffer, each holding its value in the C type of its slot
    (the bytes the DSL's own cell holds), so that one struct.pack_into writes a launch's values
    (~1 us for 17 arguments; a ctypes assignment per cell costs ~0.15 us each)."""

    def __init__(self, fn, slots: tuple[Slot, ...]) -> None:
        self._fn = fn
        self.slots = tuple(slots)
        self._packer = struct.Struct("=" + "".join(_FORMATS[slot.kind] for slot in self.slots))
        self._buffer = (ctypes.c_uint64 * len(self.slots))()
        self._cells = [_CTYPES[slot.kind].from_buffer(self._buffer, CELL_BYTES * i)
                       for i, slot in enumerate(self.slots)]
        self._addresses = [ctypes.addressof(cell) for cell in self._cells]
        self._checked = False
        self._direct = None  # (host stub, packed argument array, CUDA result cell or None)
        # The cells are shared state: two threads launching at once must not interleave writes.
        self._lock = threading.Lock()

    def dsl_args(self, values) -> tuple:
        return tuple(slot.dsl_value(v) for slot, v in zip(self.slots, values, strict=True))

    def fill(self, values) -> list[int]:
        """Write the values into the cells; the addresses run_compiled_program takes."""
        self._packer.pack_into(self._buffer, 0, *values)
        return self._addresses

    def __call__(self, *values) -> None:
        with self._lock:
            direct = self._direct
            if direct is not None:
                self._packer.pack_into(self._buffer, 0, *values)
                direct[0](direct[1])
                result = direct[2]
                if result is not None and result.value:
                    raise RuntimeError(f"kernel launch failed: {_cuda_error_name(result.value)}")
                return
            if not self._checked:
                # Once through the DSL's checked call (it also creates the function's executor).
                self._fn(*self.dsl_args(values))
                self._checked = True
                self._direct = _direct_entry(self._fn, self._addresses)
                return
            self._fn.run_compiled_program(self.fill(values))

    @property
    def direct(self) -> bool:
        """Whether launches call the host stub directly (see the module docstring)."""
        return self._direct is not None


def _direct_entry(fn, addresses: list[int]):
    """(host stub, packed arguments, result cell) of fn's executor for these cell addresses, as
    its run_compiled_program would pack them, or None where the executor does not expose them."""
    executor = getattr(fn, "_default_executor", None)
    pack = getattr(executor, "_get_invoke_packed_args", None)
    stub = getattr(executor, "capi_func", None)
    extra = getattr(executor, "_num_extra_args", None)
    if pack is None or stub is None or not isinstance(extra, int):
        return None
    try:
        built = pack(addresses)
        packed = (ctypes.c_void_p * (len(addresses) + extra))(
            *built[:len(addresses) + extra])
    except Exception:  # noqa: BLE001 - an executor of another layout: the checked path stays
        return None
    if list(packed[:len(addresses)]) != addresses:
        return None
    result = executor.cuda_result if getattr(executor, "_has_cuda_result", False) else None
    return stub, packed, result


def _cuda_error_name(code: int) -> str:
    try:
        from cuda.bindings import runtime

        err, name = runtime.cudaGetErrorName(runtime.cudaError_t(code))
        return f"{name.decode()} ({code})"
    except Exception:  # noqa: BLE001 - the code alone still says what happened
        return f"CUDA error {code}"


def stream_query():
    """index -> the raw handle of torch's current stream on that CUDA device: torch's raw-stream
    query where this torch build has it, else through the public Stream object."""
    import torch

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw
    return lambda index: torch.cuda.current_stream(index).cuda_stream


def current_stream_handle(device) -> int:
    """torch's current stream on a CUDA device as a raw handle: torch's raw-stream query (~0.3 us,
    what Triton's launcher uses) where this torch build has it, else the public
    torch.cuda.current_stream (~3 us on the H200's host, the Stream object it builds)."""
    import torch

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    index = device.index if device.index is not None else torch.cuda.current_device()
    if raw is not None:
        return raw(index)
    return torch.cuda.current_stream(index).cuda_stream


@functools.cache
def device_arch(device) -> str:
    """sm_XY of a CUDA device, once per device: the capability query costs ~10 us, and prepare
    asks per call."""
    import torch

    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"


class LauncherCache:
    """One FastLaunch per key (a kernel's compile options and the GPU's arch) and process,
    compiled on first use. A compile failure (an arch this DSL build cannot target, say) is
    logged once and remembered as None, so that prepare falls back to torch ops, which give the
    same codes, instead of failing; compile_now=False (inside a CUDA-graph capture, which must
    not see a module load) answers only what is compiled already."""

    def __init__(self, what: str) -> None:
        self._what = what
        self._launchers: dict[tuple, FastLaunch | None] = {}
        self._lock = threading.Lock()

    def get(self, key: tuple, build, *, compile_now: bool = True) -> FastLaunch | None:
        """The launcher for `key`; build() -> (compiled function, slots) makes it."""
        hit = self._launchers.get(key, False)
        if hit is not False or not compile_now:
            return hit or None
        with self._lock:
            if key not in self._launchers:
                try:
                    self._launchers[key] = FastLaunch(*build())
                except Exception as exc:  # noqa: BLE001 - any DSL failure: fall back, loudly
                    text = str(exc).strip()
                    log.warning("%s unavailable for %s (%s); prepare uses torch ops", self._what,
                                key, text.splitlines()[-1][:200] if text else type(exc).__name__)
                    self._launchers[key] = None
            return self._launchers[key]

    def launchers(self) -> list[FastLaunch]:
        """The compiled launchers so far (the GPU tests check their launch path)."""
        return [launcher for launcher in self._launchers.values() if launcher is not None]
