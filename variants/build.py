"""What every family's compile() shares: the cache key, the CuTe-DSL build, the disk and memory
caches, and the compiled-kernel object that implements the Kernel protocol of base.py.

The cache key holds every input to code generation: family, Config, head_dim, target arch, a hash
of the family's source files and the CuTe DSL version. Batch, heads, seq_len (and the persistent
grid size) are runtime arguments of the compiled function, so problems that share a head_dim
share one build. On disk each entry keeps the cubin and its resource usage under
$TUNER_CACHE_DIR (default ~/.cache/fp8-attn-tuner)/<family>/<key>/; CuTe DSL's own file cache
(CUTE_DSL_CACHE_DIR) is pointed beside it unless the user set it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from variants.base import ResourceUsage
from variants.cubin import cubin_resources

_LOCK = threading.RLock()
_FUNCTIONS: dict[str, tuple] = {}  # codegen key -> (compiled fn, resources, compile seconds)
_KERNELS: dict[str, CompiledKernel] = {}  # codegen key / problem key -> kernel


def cache_root() -> Path:
    root = os.environ.get("TUNER_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "fp8-attn-tuner")
    return Path(root)


@cache
def source_hash(src_dir: str) -> str:
    """Hash of a family's *.py files: editing the kernel invalidates its cached builds."""
    h = hashlib.sha256()
    for path in sorted(Path(src_dir).glob("*.py")):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


@cache
def dsl_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("nvidia-cutlass-dsl")
    except PackageNotFoundError:  # unpacked without metadata (the device kit): the module knows
        import cutlass

        return str(getattr(cutlass, "__version__", "unknown"))


def codegen_key(family: str, cfg, head_dim: int, arch: str, src_dir: Path) -> str:
    blob = json.dumps({"family": family, "config": cfg.to_dict(), "head_dim": head_dim,
                       "arch": arch, "src": source_hash(str(src_dir)), "dsl": dsl_version()},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


@contextlib.contextmanager
def _arch_env(arch: str):
    """CuTe DSL reads the target from CUTE_DSL_ARCH (arch checks of MMA ops included); restore
    the caller's value afterwards. --keep-cubin drops files into the working directory: build in
    a scratch directory so neither the repo nor the user's cwd collects them."""
    previous = os.environ.get("CUTE_DSL_ARCH")
    os.environ["CUTE_DSL_ARCH"] = arch
    os.environ.setdefault("CUTE_DSL_CACHE_DIR", str(cache_root() / "cute_dsl"))
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="cute-build-") as scratch:
        os.chdir(scratch)
        try:
            yield
        finally:
            os.chdir(cwd)
            if previous is None:
                os.environ.pop("CUTE_DSL_ARCH", None)
            else:
                os.environ["CUTE_DSL_ARCH"] = previous


def pointer_args(*, extra: tuple = ()) -> tuple:
    """Stand-ins for the launch arguments: only types and alignments reach code generation."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_stream, make_ptr

    gmem = cute.AddressSpace.gmem
    f8 = cutlass.Float8E4M3FN
    return (
        make_ptr(f8, 0, gmem, assumed_align=16),
        make_ptr(f8, 0, gmem, assumed_align=16),
        make_ptr(f8, 0, gmem, assumed_align=16),
        make_ptr(cutlass.Float32, 0, gmem, assumed_align=4),
        make_ptr(cutlass.BFloat16, 0, gmem, assumed_align=16),
        make_ptr(cutlass.Float32, 0, gmem, assumed_align=4),
        cutlass.Int32(1), cutlass.Int32(1), cutlass.Int32(1), cutlass.Int32(256),
        cutlass.Float32(1.0), *extra, make_fake_stream(),
    )


def build_function(kernel_obj, arch: str, extra_args: tuple = ()):
    """cute.compile the kernel object for `arch`; returns (function, cubin bytes, seconds)."""
    import cutlass.cute as cute

    with _arch_env(arch):
        start = time.perf_counter()
        fn = cute.compile(kernel_obj, *pointer_args(extra=extra_args),
                          options=f"--gpu-arch={arch} --keep-cubin")
        seconds = time.perf_counter() - start
        cubin = fn.__cubin__
        if isinstance(cubin, str):
            cubin = Path(cubin).read_bytes() if os.path.exists(cubin) else cubin.encode("latin1")
    return fn, cubin, seconds


@dataclass
class CompiledKernel:
    """A compiled attention kernel of any family: the Kernel protocol of variants/base.py.

    The config must provide pad_to() (the sequence multiple its tiles load) and register_p
    (V stored in the register-P key order by prepare)."""

    config: Any
    problem: Any
    arch: str
    resources: ResourceUsage
    compile_seconds: float
    _fn: Any = field(repr=False, default=None)
    # Launch arguments after the scalars, computed per device (e.g. the SM count of a grid).
    _extra_args: Callable[[Any], tuple] = field(repr=False, default=lambda device: ())
    # Test hook only (tuner's TUNER_TEST_PLANT_CRASH): store O this many bytes past its buffer,
    # a genuine out-of-bounds write by this very kernel.
    _out_offset_bytes: int = field(repr=False, default=0)

    def prepare(self, q, k, v, softmax_scale: float | None = None, *, validate: bool = True):
        """validate=False skips the input checks for a caller that has made them already."""
        from variants.prepare import quantize_inputs

        return quantize_inputs(q, k, v, pad_to=self.config.pad_to(),
                               permute_keys=self.config.register_p, softmax_scale=softmax_scale,
                               validate=validate)

    def run(self, prepared, out=None, lse=None):
        """Launch on torch's current stream (so it orders with torch work and can be captured
        in a CUDA graph); writes into out/lse when given, without allocating or syncing."""
        import cuda.bindings.driver as cuda
        import cutlass
        import cutlass.cute as cute
        import torch
        from cutlass.cute.runtime import make_ptr

        if self._fn is None:
            raise RuntimeError(f"kernel for {self.config.short()} has no compiled function")
        if prepared.key_permuted != self.config.register_p:
            raise ValueError("prepared inputs have the wrong V key order for this config: "
                             "use this kernel's prepare()")
        if prepared.padded_len % self.config.pad_to():
            raise ValueError(f"padded length {prepared.padded_len} is not a multiple of "
                             f"{self.config.pad_to()}: use this kernel's prepare()")
        if not prepared.softmax_scale > 0:
            raise ValueError("softmax_scale must be > 0")
        batch, _padded, heads, head_dim = prepared.q.shape
        if head_dim != self.problem.head_dim:
            raise ValueError(f"head_dim {head_dim} != compiled head_dim {self.problem.head_dim}")
        s = prepared.seq_len
        device = prepared.q.device
        if out is None:
            out = torch.empty((batch, s, heads, head_dim), dtype=torch.bfloat16, device=device)
        if lse is None:
            lse = torch.empty((batch, heads, s), dtype=torch.float32, device=device)
        gmem = cute.AddressSpace.gmem
        f8 = cutlass.Float8E4M3FN
        stream = cuda.CUstream(torch.cuda.current_stream(device).cuda_stream)
        self._fn(
            make_ptr(f8, prepared.q.data_ptr(), gmem, assumed_align=16),
            make_ptr(f8, prepared.k.data_ptr(), gmem, assumed_align=16),
            make_ptr(f8, prepared.v.data_ptr(), gmem, assumed_align=16),
            make_ptr(cutlass.Float32, prepared.descale.data_ptr(), gmem, assumed_align=4),
            make_ptr(cutlass.BFloat16, out.data_ptr() + self._out_offset_bytes, gmem,
                     assumed_align=16),
            make_ptr(cutlass.Float32, lse.data_ptr(), gmem, assumed_align=4),
            cutlass.Int32(batch), cutlass.Int32(heads), cutlass.Int32(s),
            cutlass.Int32(prepared.padded_len), cutlass.Float32(prepared.softmax_scale),
            *self._extra_args(device), stream,
        )
        return out, lse


def compile_cached(family: str, src_dir: Path, cfg, problem, arch: str, *,
                   make_kernel: Callable[[], Any], smem_bytes: int,
                   example_extra: tuple = (),
                   extra_args: Callable[[Any], tuple] = lambda device: ()) -> CompiledKernel:
    """The one compile cache: memory per (build, problem), a build per codegen key, and the
    cubin + resources on disk for every build."""
    key = codegen_key(family, cfg, problem.head_dim, arch, src_dir)
    kernel_key = f"{key}/{problem.key()}"
    with _LOCK:
        hit = _KERNELS.get(kernel_key)
        if hit is not None:
            return hit
        if key not in _FUNCTIONS:
            fn, cubin, seconds = build_function(make_kernel(), arch, example_extra)
            resources = cubin_resources(cubin, smem_bytes)
            disk = cache_root() / family / key
            disk.mkdir(parents=True, exist_ok=True)
            (disk / "kernel.cubin").write_bytes(cubin)
            (disk / "meta.json").write_text(json.dumps(
                {"config": cfg.to_dict(), "head_dim": problem.head_dim, "arch": arch,
                 "resources": asdict(resources), "compile_seconds": seconds,
                 "dsl": dsl_version(), "src": source_hash(str(src_dir))}, indent=1))
            _FUNCTIONS[key] = (fn, resources, seconds)
        fn, resources, seconds = _FUNCTIONS[key]
        kernel = CompiledKernel(config=cfg, problem=problem, arch=arch, resources=resources,
                                compile_seconds=seconds, _fn=fn, _extra_args=extra_args)
        _KERNELS[kernel_key] = kernel
        return kernel


def cached_resources(family: str, src_dir: Path, cfg, head_dim: int,
                     arch: str) -> ResourceUsage | None:
    """Resource usage from the disk cache, without compiling (None when not cached)."""
    meta = cache_root() / family / codegen_key(family, cfg, head_dim, arch, src_dir) / "meta.json"
    if not meta.exists():
        return None
    return ResourceUsage(**json.loads(meta.read_text())["resources"])


# 1 TiB past the output buffer: no allocation of this process reaches that far, so every store
# of the epilogue faults (illegal address) instead of silently corrupting a neighbour.
_WILD_OFFSET_BYTES = 1 << 40


def plant_crash(kernel: CompiledKernel) -> CompiledKernel:
    """The same compiled kernel, launched with its output pointer out of bounds (the tuner's
    planted-crash test: a candidate that crashes the GPU context must not stop a search)."""
    import dataclasses

    return dataclasses.replace(kernel, _out_offset_bytes=_WILD_OFFSET_BYTES)
