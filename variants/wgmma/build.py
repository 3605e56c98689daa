"""compile(): one cache (memory + disk) for wgmma kernels, their resource usage, and the Kernel.

The cache key holds every input to code generation: the Config, head_dim, the target arch, a hash
of this family's source files and the CuTe DSL version. Batch, heads, seq_len and the persistent
grid size are runtime arguments, so problems that share a head_dim share one compilation. On
disk each entry keeps the cubin and its resource usage under $TUNER_CACHE_DIR/wgmma/<key>/.
The cubin parsing and cache root are the mma_sync family's (generic, to move to a shared module).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from variants.base import ResourceUsage
from variants.mma_sync.build import cache_root, cubin_resources
from variants.wgmma.config import Config, smem_bytes

FAMILY = "wgmma"
_SRC_DIR = Path(__file__).resolve().parent
_LOCK = threading.RLock()
_MEMORY: dict[str, CompiledKernel] = {}
_FUNCTIONS: dict[str, tuple] = {}  # codegen key -> (compiled fn, resources, compile seconds)


def _source_hash() -> str:
    h = hashlib.sha256()
    for path in sorted(_SRC_DIR.glob("*.py")):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def _dsl_version() -> str:
    from importlib.metadata import version

    return version("nvidia-cutlass-dsl")


def codegen_key(cfg: Config, head_dim: int, arch: str) -> str:
    blob = json.dumps({"family": FAMILY, "config": cfg.to_dict(), "head_dim": head_dim,
                       "arch": arch, "src": _source_hash(), "dsl": _dsl_version()},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def _sm_count(device) -> int:
    import torch

    return torch.cuda.get_device_properties(device).multi_processor_count


@dataclass
class CompiledKernel:
    """A compiled wgmma kernel: the Kernel protocol of variants/base.py."""

    config: Config
    problem: object
    arch: str
    resources: ResourceUsage
    compile_seconds: float
    _fn: object = field(repr=False, default=None)

    def prepare(self, q, k, v, softmax_scale: float | None = None):
        from variants.prepare import quantize_inputs

        return quantize_inputs(q, k, v, pad_to=self.config.pad_to(),
                               permute_keys=self.config.register_p,
                               softmax_scale=softmax_scale)

    def run(self, prepared, out=None, lse=None):
        import cutlass
        import cutlass.cute as cute
        import torch
        from cutlass.cute.runtime import make_ptr

        if self._fn is None:
            raise RuntimeError(
                f"kernel for {self.config.short()} was loaded without its compiled function; "
                "compile() it in this process first")
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
        self._fn(
            make_ptr(f8, prepared.q.data_ptr(), gmem, assumed_align=16),
            make_ptr(f8, prepared.k.data_ptr(), gmem, assumed_align=16),
            make_ptr(f8, prepared.v.data_ptr(), gmem, assumed_align=16),
            make_ptr(cutlass.Float32, prepared.descale.data_ptr(), gmem, assumed_align=4),
            make_ptr(cutlass.BFloat16, out.data_ptr(), gmem, assumed_align=16),
            make_ptr(cutlass.Float32, lse.data_ptr(), gmem, assumed_align=4),
            cutlass.Int32(batch), cutlass.Int32(heads), cutlass.Int32(s),
            cutlass.Int32(prepared.padded_len), cutlass.Float32(prepared.softmax_scale),
            cutlass.Int32(_sm_count(device)),
        )
        return out, lse


def _example_args():
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_ptr

    gmem = cute.AddressSpace.gmem
    f8 = cutlass.Float8E4M3FN
    # Address 0 stands in for the real buffers: only types and alignments reach codegen.
    return (
        make_ptr(f8, 0, gmem, assumed_align=16),
        make_ptr(f8, 0, gmem, assumed_align=16),
        make_ptr(f8, 0, gmem, assumed_align=16),
        make_ptr(cutlass.Float32, 0, gmem, assumed_align=4),
        make_ptr(cutlass.BFloat16, 0, gmem, assumed_align=16),
        make_ptr(cutlass.Float32, 0, gmem, assumed_align=4),
        cutlass.Int32(1), cutlass.Int32(1), cutlass.Int32(1), cutlass.Int32(256),
        cutlass.Float32(1.0), cutlass.Int32(132),
    )


def _compile_function(cfg: Config, head_dim: int, arch: str):
    import cutlass.cute as cute

    from variants.wgmma.kernel import WgmmaAttention

    previous = os.environ.get("CUTE_DSL_ARCH")
    os.environ["CUTE_DSL_ARCH"] = arch
    os.environ.setdefault("CUTE_DSL_CACHE_DIR", str(cache_root() / "cute_dsl"))
    try:
        start = time.perf_counter()
        fn = cute.compile(WgmmaAttention(cfg, head_dim), *_example_args(),
                          options=f"--gpu-arch={arch} --keep-cubin")
        seconds = time.perf_counter() - start
    finally:
        if previous is None:
            os.environ.pop("CUTE_DSL_ARCH", None)
        else:
            os.environ["CUTE_DSL_ARCH"] = previous
    cubin = fn.__cubin__
    if isinstance(cubin, str):
        cubin = Path(cubin).read_bytes() if os.path.exists(cubin) else cubin.encode("latin1")
    return fn, cubin, seconds


def compile(cfg: Config, problem, arch: str) -> CompiledKernel:  # noqa: A001 - contract name
    """Build (or fetch from cache) the kernel for `cfg` on `arch`; works without a GPU."""
    key = codegen_key(cfg, problem.head_dim, arch)
    kernel_key = f"{key}/{problem.key()}"
    with _LOCK:
        hit = _MEMORY.get(kernel_key)
        if hit is not None:
            return hit
        if key not in _FUNCTIONS:
            disk = cache_root() / FAMILY / key
            fn, cubin, seconds = _compile_function(cfg, problem.head_dim, arch)
            resources = cubin_resources(cubin, smem_bytes(cfg, problem.head_dim))
            disk.mkdir(parents=True, exist_ok=True)
            (disk / "kernel.cubin").write_bytes(cubin)
            (disk / "meta.json").write_text(json.dumps(
                {"config": cfg.to_dict(), "head_dim": problem.head_dim, "arch": arch,
                 "resources": asdict(resources), "compile_seconds": seconds,
                 "dsl": _dsl_version(), "src": _source_hash()}, indent=1))
            _FUNCTIONS[key] = (fn, resources, seconds)
        fn, resources, seconds = _FUNCTIONS[key]
        kernel = CompiledKernel(config=cfg, problem=problem, arch=arch, resources=resources,
                                compile_seconds=seconds, _fn=fn)
        _MEMORY[kernel_key] = kernel
        return kernel
