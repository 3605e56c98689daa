"""variants/launch.py's cells hold byte for byte what the DSL's own marshalling writes for the same
values, for every kernel prepare and the runtime launch: the quantize kernels and an attention
kernel of each family (compiled for sm_90a without a GPU). On a GPU, outputs of the fast path
equal those of the DSL's call bit for bit: tests/gpu/test_runtime_gpu.py."""

import ctypes

import pytest
import torch

from tuner.problem import Problem
from variants import block_quantize_kernel, layout_kernel
from variants.common.abi import slots
from variants.launch import FastLaunch

pytestmark = pytest.mark.compile

PROBLEM = Problem(batch=1, heads=2, seq_len=77)


def _marshalled_bytes(fn, launcher: FastLaunch, values) -> tuple[list[bytes], list[bytes]]:
    """(the DSL's bytes per argument, FastLaunch's), each the size of the argument's cell."""
    # The DSL's cells live in its argument objects: keep those alive while reading them.
    dsl_args = launcher.dsl_args(values)
    exe_args, _adapted = fn.generate_execution_args(*dsl_args)
    assert len(exe_args) == len(launcher.slots)  # one C cell per argument, in slot order
    ours = launcher.fill(values)
    sizes = [ctypes.sizeof(slot.cell()) for slot in launcher.slots]
    dsl = [ctypes.string_at(a if isinstance(a, int) else a.value, n)
           for a, n in zip(exe_args, sizes, strict=True)]
    return dsl, [ctypes.string_at(a, n) for a, n in zip(ours, sizes, strict=True)]


def _values(launcher: FastLaunch, seed: int) -> tuple:
    """Distinct, aligned values for every slot (so a swapped pair of slots shows)."""
    values = []
    for i, slot in enumerate(launcher.slots):
        if slot.kind in ("pointer", "stream"):
            values.append(0x7F00_0000_0000 + (seed * 97 + i) * 4096)
        elif slot.kind == "Int32":
            values.append(1000 * seed + 3 * i + 1)
        else:
            values.append(0.125 * (i + seed))
    return tuple(values)


@pytest.mark.parametrize("build", [
    lambda: layout_kernel.compile_kernel(128, "sm_90a"),
    lambda: layout_kernel.compile_kernel(128, "sm_90a", True, True),
    lambda: block_quantize_kernel.compile_kernel("quant", torch.bfloat16, 128, "sm_90a"),
    lambda: block_quantize_kernel.compile_kernel("quant", torch.float16, 64, "sm_90a", False),
    lambda: block_quantize_kernel.compile_kernel("expand", torch.float32, 0, "sm_90a"),
    lambda: block_quantize_kernel.compile_kernel("mean", torch.bfloat16, 128, "sm_90a"),
    # K smoothing's build, launched as the mean launch's programmatic dependent on sm_90a.
    lambda: block_quantize_kernel.compile_kernel("quant", torch.bfloat16, 128, "sm_90a",
                                                 smooth_k=True, rotate_qk=True),
], ids=["layout", "layout-feature-major", "block-quant", "block-quant-natural-v", "expand",
        "mean", "block-quant-pdl"])
def test_prepare_kernel_cells_match_the_dsl(build):
    fn, kernel_slots = build()
    launcher = FastLaunch(fn, kernel_slots)
    for seed in (1, 2):  # the second fill overwrites the first in place
        dsl, ours = _marshalled_bytes(fn, launcher, _values(launcher, seed))
        assert ours == dsl


@pytest.mark.parametrize("family", ["wgmma", "mma_sync"])
def test_attention_cells_match_the_dsl(family, own_build):
    from variants import load_family

    fam = load_family(family)
    kernel = fam.compile(fam.default("sm_90a", PROBLEM), PROBLEM, "sm_90a")
    extra = 1 if family == "wgmma" else 0  # wgmma's persistent grid size
    launcher = FastLaunch(kernel._fn, slots(extra))
    dsl, ours = _marshalled_bytes(kernel._fn, launcher, _values(launcher, 3))
    assert ours == dsl


def _executor_of():
    """The DSL's own executor class, as a first launch builds it, over a stand-in module: a
    compile without a GPU has no host stub to call, and the packing and the result cell under
    test are the executor's code, not the stub's."""
    from types import SimpleNamespace

    from cutlass.base_dsl.jit_executor import JitExecutor

    stub = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p)(lambda packed: 0)
    return JitExecutor(SimpleNamespace(capi_func=stub), None, False)


def test_direct_path_packs_what_the_executor_packs(monkeypatch):
    from variants import launch

    fn, kernel_slots = layout_kernel.compile_kernel(128, "sm_90a")
    launcher = FastLaunch(fn, kernel_slots)
    executor = _executor_of()
    monkeypatch.setattr(fn, "_default_executor", executor, raising=False)
    stub, packed, result = launch._direct_entry(fn, launcher._addresses)
    expected = executor._get_invoke_packed_args(launcher._addresses)
    total = len(launcher._addresses) + executor._num_extra_args
    assert list(packed) == list(expected[:total])
    assert list(packed[:len(launcher._addresses)]) == launcher._addresses
    assert stub is executor.capi_func and result is executor.cuda_result


def test_direct_path_fills_the_cells_and_reports_a_failed_launch(monkeypatch):
    """The stub called with the packed array after the cells hold this launch's values; a CUDA
    error the stub writes into the result cell raises instead of passing silently."""

    fn, kernel_slots = layout_kernel.compile_kernel(128, "sm_90a")
    launcher = FastLaunch(fn, kernel_slots)
    result = ctypes.c_int32(0)
    seen = []

    def stub(packed):
        seen.append([ctypes.string_at(packed[i], ctypes.sizeof(cell))
                     for i, cell in enumerate(launcher._cells)])
        result.value = code

    launcher._direct = (stub, (ctypes.c_void_p * len(launcher._addresses))(
        *launcher._addresses), result)
    values = _values(launcher, 5)
    code = 0
    launcher(*values)
    assert seen[0] == [bytes(cell) for cell in launcher._cells]
    assert launcher._cells[-1].value == values[-1]  # the stream cell holds this launch's stream
    code = 700  # cudaErrorIllegalAddress
    with pytest.raises(RuntimeError, match="kernel launch failed"):
        launcher(*values)


def test_no_direct_path_without_the_executor_attributes():
    """Another DSL layout (no executor, or one without the packing method): launches stay on
    run_compiled_program."""
    from variants import launch

    class Bare:
        _default_executor = object()

    assert launch._direct_entry(Bare(), [1, 2]) is None
    assert launch._direct_entry(object(), [1, 2]) is None


def test_a_compile_failure_falls_back_once_and_says_so(caplog):
    """A kernel the DSL cannot build (an arch it cannot target) must not break prepare: the
    cache answers None, logs the failure once and remembers it (one compile attempt); before
    anything is compiled, compile_now=False (a CUDA-graph capture) tries nothing."""
    from variants.launch import LauncherCache

    cache = LauncherCache("test kernel")
    calls = []

    def failing():
        calls.append(1)
        raise RuntimeError("unsupported arch sm_999")

    with caplog.at_level("WARNING"):
        assert cache.get(("k", "sm_999"), failing) is None
        assert cache.get(("k", "sm_999"), failing) is None
    assert len(calls) == 1
    assert "unsupported arch sm_999" in caplog.text and "torch ops" in caplog.text
    assert cache.get(("other",), failing, compile_now=False) is None and len(calls) == 1
    assert cache.launchers() == []


def test_the_cache_compiles_each_key_once():
    from variants.launch import LauncherCache

    cache = LauncherCache("layout copy")
    builds = []

    def build():
        builds.append(1)
        return layout_kernel.compile_kernel(128, "sm_90a")

    first = cache.get((128, "sm_90a"), build)
    assert first is not None and cache.get((128, "sm_90a"), build) is first
    assert cache.get((128, "sm_90a"), build, compile_now=False) is first
    assert len(builds) == 1 and cache.launchers() == [first]
