"""host_stub: the host path of a repeated tuner.attention call on a CPU, the device work stood in.

`python -m benchmarks.host_stub [--calls 10000] [--gpu h100] [--shapes ...]` runs the real Python
of a repeated call (every check, the plan lookup, prepare's and the kernel's argument packing,
FastLaunch filling its cells and calling the host stub) on tensors of the `meta` device (no data:
an allocation costs the dispatcher's work, no page faults). Stood in, and nothing else:
  - torch.Tensor.is_cuda answers True; torch.cuda's queries answer an initialized device 0 on
    stream 0, not capturing, compute capability and SM count of the --gpu profile;
  - the CuTe DSL builds (variants.build's and the quantize kernels'): a function whose executor
    hands FastLaunch a Python host stub that counts the launch;
  - the local GPU (the --gpu profile) and a temporary results database (an empty Store).
What a GPU host adds: the caching allocator behind each torch.empty (meta allocates nothing)
and the CUDA driver's launch behind each host stub; both are counted per call here.

Reported per shape: microseconds per call of the whole call and of its parts
(benchmarks/host.py's call_parts, the parts the GPU suite times) and of the SDPA drop-in's
repeated call (other_entries; not the custom op's, which meta tensors send to its fake
implementation), the least of --repeats batches of --calls / --repeats calls (a shared CPU's
noise only adds); cProfile's top functions; and per call the launches (FastLaunch calls, and
torch ops that would run a kernel) and allocations (torch's factory ops and out-of-place
results), from a TorchDispatchMode over a few calls.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

DEFAULT_SHAPES = ("4,1024,32,128", "1,4096,56,128", "1,8192,32,128,causal,kvh=8")
# Factory ops: an allocation each, no kernel.
FACTORIES = {"empty", "empty_strided", "new_empty", "new_empty_strided"}


class StubFunction:
    """A compiled function's stand-in: the DSL's checked first call and the executor's host stub
    each count one launch under `name`. `built`: the kernel object it stands in for, where the
    quantization's (its flags tell the builds of one name apart)."""

    def __init__(self, name: str, launches: Counter, built=None) -> None:
        self.name, self.launches, self.built = name, launches, built
        self._default_executor = SimpleNamespace(
            _get_invoke_packed_args=list, capi_func=self._stub, _num_extra_args=0,
            _has_cuda_result=False)

    def __call__(self, *_dsl_args) -> None:
        self.launches[self.name] += 1

    def run_compiled_program(self, _addresses) -> None:
        self.launches[self.name] += 1

    def _stub(self, _packed) -> None:
        self.launches[self.name] += 1


@contextlib.contextmanager
def stood_in(gpu: str = "h100"):
    """Inside: meta (or CPU) tensors run tuner.attention's CUDA path (module docstring).
    Yields the Counter of launches per stand-in function."""
    import torch

    from tuner import gpus, runtime
    from tuner.store import Store
    from variants import block_quantize_kernel, build, launch
    from variants.wgmma import build as wgmma_build

    profile = gpus.PROFILES[gpu]
    major, minor = (int(c) for c in profile.arch.removeprefix("sm_").rstrip("a")[:2])
    launches: Counter = Counter()

    def quant_kernel(name, in_dtype, head_dim, arch, v_feature_major=True, permute_keys=False,
                     *, smooth_k=False, rotate_qk=False, qk_int8=False, write_shift=True, **_):
        kernel = block_quantize_kernel._make(name, in_dtype, head_dim, v_feature_major,
                                             permute_keys, smooth_k, rotate_qk,
                                             qk_int8=qk_int8, write_shift=write_shift)
        return StubFunction(f"prepare {name}", launches, kernel), kernel.slots()


    def loaded(family, key, src_dir):  # one function per build, named by its codegen key
        return (StubFunction(f"attention {family} {key[:8]}", launches),
                build.ResourceUsage(0, 0, 0), 0.0)

    def named(name):  # "auto": the stood-in GPU
        return profile if name == "auto" else gpus.PROFILES[name]

    caches = (launch.device_arch, wgmma_build._sm_count_arg)
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        url = f"sqlite:///{os.path.join(tmp, 'empty.sqlite')}"
        Store(url).close()
        for target, name, value in (
            (torch.Tensor, "is_cuda", property(lambda self: True)),
            (torch.cuda, "is_initialized", lambda: True),
            (torch.cuda, "is_current_stream_capturing", lambda: False),
            (torch.cuda, "current_device", lambda: 0),
            (torch.cuda, "synchronize", lambda device=None: None),
            (torch.cuda, "get_device_capability", lambda device=None: (major, minor)),
            (torch.cuda, "get_device_properties",
             lambda device=None: SimpleNamespace(multi_processor_count=profile.sm_count)),
            (torch._C, "_cuda_getCurrentRawStream", lambda index: 0),
            (block_quantize_kernel, "compile_kernel", quant_kernel),
            (block_quantize_kernel, "LAUNCHERS", launch.LauncherCache("stand-in")),
            (build, "_load_cached", loaded),
            (build, "_FUNCTIONS", {}), (build, "_KERNELS", {}), (build, "_ENTRIES", {}),
            (runtime, "_KERNELS", {}),
            # The stood-in GPU ships no table (the family default runs); other GPUs keep theirs.
            (runtime, "TABLES_DIR", _tables_without(runtime.TABLES_DIR, Path(tmp), profile.name)),
            (runtime, "_local_gpu_and_device", lambda name: (named(name), "host-stub")),
            (gpus, "resolve_gpu", lambda name, **_: named(name)),
        ):
            stack.enter_context(mock.patch.object(target, name, value, create=True))
        stack.enter_context(mock.patch.dict(os.environ, {"TUNER_DB_URL": url}))
        stack.callback(runtime.clear_cache)
        for cached in caches:
            stack.callback(cached.cache_clear)
            cached.cache_clear()
        runtime.clear_cache()
        yield launches


def _tables_without(source, folder, gpu: str):
    """`folder` holding a copy of each table in `source` but `gpu`'s own."""
    import shutil

    for table in source.glob("*.yaml"):
        if table.stem != gpu:
            shutil.copy(table, folder / table.name)
    return folder


def inputs(problem, device: str = "meta"):
    """bf16 q, k, v of the problem on `device` (meta: no data)."""
    import torch

    q_shape = (problem.batch, problem.seq_len, problem.heads, problem.head_dim)
    kv_shape = (problem.batch, problem.seq_len_kv, problem.kv_heads, problem.head_dim)
    return tuple(torch.zeros(shape, dtype=torch.bfloat16, device=device)
                 for shape in (q_shape, kv_shape, kv_shape))


def us_per_call(fn, calls: int, repeats: int) -> float:
    """The least mean microseconds per call over `repeats` batches of calls // repeats calls."""
    n = max(1, calls // repeats)
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n)
    return best * 1e6


def _kind(func) -> str:
    """view, factory, inplace or compute: what an aten op costs on a GPU."""
    name = func.overloadpacket.__name__
    if func.is_view:
        return "view"
    if name in FACTORIES:
        return "factory"
    return "inplace" if func._schema.is_mutable else "compute"


def device_work(fn, launches: Counter, calls: int = 4) -> dict:
    """Per call: FastLaunch launches, torch ops that run a kernel, allocations, by name."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: Counter = Counter()

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen[(_kind(func), func.overloadpacket.__name__)] += 1
            return func(*args, **(kwargs or {}))

    fn()
    before = Counter(launches)
    with Ops():
        for _ in range(calls):
            fn()
    stub = {name: (n - before[name]) / calls for name, n in launches.items() if n > before[name]}
    ops = {f"{kind} {name}": n / calls for (kind, name), n in seen.items() if kind != "view"}
    torch_launches = sum(n for (kind, _), n in seen.items() if kind in ("compute", "inplace"))
    allocations = sum(n for (kind, _), n in seen.items() if kind in ("factory", "compute"))
    return {"launches": sum(stub.values()) + torch_launches / calls,
            "allocations": allocations / calls, "stub": stub, "ops": ops,
            "views": sum(n for (kind, _), n in seen.items() if kind == "view") / calls}


def report(problem, gpu: str, calls: int, repeats: int, profile_calls: int, top: int) -> str:
    from benchmarks.common import shape_text
    from benchmarks.host import (
        DISJOINT,
        call_parts,
        hot_spots,
        launch_parts,
        other_entries,
        with_launches,
    )

    lines = [f"## {shape_text(problem)} ({gpu} profile, meta tensors)"]
    with stood_in(gpu) as launches:
        q, k, v = inputs(problem)
        parts = call_parts(q, k, v, problem.causal)
        us = with_launches({name: us_per_call(fn, calls, repeats) for name, fn in parts.items()},
                           launch_parts(q, k, v, problem.causal, calls // repeats))
        whole_name = next(iter(parts))
        whole = us[whole_name]
        rest = whole - sum(us[name] for name in DISJOINT if name in us)
        for name, t in [*us.items(), ("rest (checks, glue)", rest)]:
            lines.append(f"  {name:<32} {t:8.1f} us  {t / whole:5.0%}")
        # The drop-in, whole (repeated: its plan made by us_per_call's first call); not the
        # custom op, whose dispatch on meta tensors runs its fake implementation.
        for name, fn in other_entries(q, k, v, problem.causal).items():
            if name.startswith("SDPA"):
                t = us_per_call(fn, calls, repeats)
                lines.append(f"  {name:<32} {t:8.1f} us  {t / whole:5.0%}")
        work = device_work(parts[whole_name], launches)
        lines.append(f"  launches per call {work['launches']:g}: {work['stub']} + torch ops; "
                     f"allocations per call {work['allocations']:g}; views {work['views']:g}")
        lines.append(f"  torch ops per call: {work['ops']}")
        lines.append(f"  cProfile, {profile_calls} calls (own us per call):")
        for row in hot_spots(parts[whole_name], profile_calls, top):
            lines.append("    " + "  ".join(str(c) for c in row))
    return "\n".join(lines)


def main(argv=None) -> int:
    from benchmarks.common import shape_arg

    parser = argparse.ArgumentParser(prog="python -m benchmarks.host_stub",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", type=shape_arg, default=None,
                        help=f"B,S,H,D[,causal][,kvh=N][,skv=N] (default {DEFAULT_SHAPES})")
    parser.add_argument("--gpu", default="h100", help="the GPU profile stood in (default h100)")
    parser.add_argument("--calls", type=int, default=10000, help="timed calls per part")
    parser.add_argument("--repeats", type=int, default=5, help="batches the calls form")
    parser.add_argument("--profile-calls", type=int, default=2000)
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args(argv)
    shapes = args.shapes or [shape_arg(s) for s in DEFAULT_SHAPES]
    for problem in (p for group in shapes for p in group):
        print(report(problem, args.gpu, args.calls, args.repeats, args.profile_calls, args.top),
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
