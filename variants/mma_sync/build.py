"""compile(): one cache (memory + disk) for mma_sync kernels, and their resource usage.

The cache key holds every input to code generation: the Config, head_dim, the target arch, a hash
of this family's source files and the CuTe DSL version. The problem key is part of the key of the
returned Kernel, but batch, heads and seq_len are runtime arguments of the compiled function, so
problems that share a head_dim share one compilation. On disk, each entry keeps the cubin and its
resource usage (JSON) under $TUNER_CACHE_DIR (default ~/.cache/fp8-attn-tuner)/mma_sync/, so
reports and can_implement calibration never need to recompile; a process that runs a kernel
compiles it once (about 1 s) into the memory cache. CuTe DSL 4.8's cute.compile result cannot be
reloaded from disk here (export_to_c needs a host linker step), so the function is not persisted.
Registers and spills are read from the cubin's ELF (.nv.info attributes), no cuobjdump needed.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from variants.base import ResourceUsage
from variants.mma_sync.config import Config, smem_bytes

_SRC_DIR = Path(__file__).resolve().parent
_LOCK = threading.RLock()
_MEMORY: dict[str, CompiledKernel] = {}
_FUNCTIONS: dict[str, tuple] = {}  # codegen key -> (compiled fn, resources, compile seconds)


def cache_root() -> Path:
    root = os.environ.get("TUNER_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "fp8-attn-tuner")
    return Path(root)


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
    blob = json.dumps({"family": "mma_sync", "config": cfg.to_dict(), "head_dim": head_dim,
                       "arch": arch, "src": _source_hash(), "dsl": _dsl_version()},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


# ---------------------------------------------------------------------------------------------
# cubin -> ResourceUsage
# ---------------------------------------------------------------------------------------------
_EIATTR_REGCOUNT = 0x2F
_EIATTR_FRAME_SIZE = 0x11
_EIFMT_NVAL, _EIFMT_BVAL, _EIFMT_HVAL, _EIFMT_SVAL = 1, 2, 3, 4


def _elf_sections(blob: bytes) -> list[dict]:
    if blob[:4] != b"\x7fELF" or blob[4] != 2:
        raise ValueError("not a 64-bit ELF cubin")
    shoff = struct.unpack_from("<Q", blob, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", blob, 0x3A)
    sections = []
    for i in range(shnum):
        name, _typ, _flags, _addr, off, size, _link, info, _align, _ent = struct.unpack_from(
            "<IIQQQQIIQQ", blob, shoff + i * shentsize)
        sections.append({"name_off": name, "off": off, "size": size, "info": info})
    strtab = sections[shstrndx]["off"]
    for s in sections:
        start = strtab + s["name_off"]
        s["name"] = blob[start:blob.index(b"\0", start)].decode()
    return sections


def _nv_info_attrs(data: bytes):
    """(attribute, payload bytes) of an .nv.info section."""
    i = 0
    while i + 2 <= len(data):
        fmt, attr = data[i], data[i + 1]
        if fmt == _EIFMT_SVAL:
            size = struct.unpack_from("<H", data, i + 2)[0]
            yield attr, data[i + 4:i + 4 + size]
            i += 4 + size
        elif fmt == _EIFMT_HVAL:
            yield attr, data[i + 2:i + 4]
            i += 4
        elif fmt == _EIFMT_BVAL:
            yield attr, data[i + 2:i + 3]
            i += 3
        else:
            yield attr, b""
            i += 2


def cubin_resources(cubin: bytes, dynamic_smem: int) -> ResourceUsage:
    """Registers, stack frame (spill) bytes and shared memory of the kernel in a cubin.

    Registers: EIATTR_REGCOUNT of the global .nv.info (fallback: bits 24..31 of the kernel's
    .text section sh_info). Spill bytes: the largest EIATTR_FRAME_SIZE, the per-thread local
    memory frame, which is where ptxas puts spilled registers (and, rarely, dynamically indexed
    register arrays). Shared memory: static .nv.shared.<kernel> plus the dynamic bytes the launch
    requests.
    """
    sections = _elf_sections(cubin)
    regs = 0
    frame = 0
    static_smem = 0
    for s in sections:
        data = cubin[s["off"]:s["off"] + s["size"]]
        if s["name"] == ".nv.info":
            for attr, payload in _nv_info_attrs(data):
                if attr == _EIATTR_REGCOUNT and len(payload) >= 8:
                    regs = max(regs, struct.unpack_from("<I", payload, 4)[0])
                elif attr == _EIATTR_FRAME_SIZE and len(payload) >= 8:
                    frame = max(frame, struct.unpack_from("<I", payload, 4)[0])
        elif s["name"].startswith(".text.") and not regs:
            regs = s["info"] >> 24
        elif (s["name"].startswith(".nv.shared.")
              and not s["name"].startswith(".nv.shared.reserved")):
            static_smem += s["size"]
    return ResourceUsage(registers=regs, spill_bytes=frame, smem_bytes=static_smem + dynamic_smem)


# ---------------------------------------------------------------------------------------------
# compile
# ---------------------------------------------------------------------------------------------
@dataclass
class CompiledKernel:
    """A compiled mma_sync kernel: the Kernel protocol of variants/base.py."""

    config: Config
    problem: object
    arch: str
    resources: ResourceUsage
    compile_seconds: float
    _fn: object = field(repr=False, default=None)

    def prepare(self, q, k, v, softmax_scale: float | None = None):
        from variants.prepare import quantize_inputs

        return quantize_inputs(q, k, v, pad_to=self.config.pad_to(),
                               permute_keys=self.config.p_staging == "registers",
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
        if prepared.key_permuted != (self.config.p_staging == "registers"):
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
        if out is None:
            out = torch.empty((batch, s, heads, head_dim), dtype=torch.bfloat16,
                              device=prepared.q.device)
        if lse is None:
            lse = torch.empty((batch, heads, s), dtype=torch.float32, device=prepared.q.device)
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
        cutlass.Int32(1), cutlass.Int32(1), cutlass.Int32(1), cutlass.Int32(128),
        cutlass.Float32(1.0),
    )


def _compile_function(cfg: Config, head_dim: int, arch: str):
    import cutlass.cute as cute

    from variants.mma_sync.kernel import MmaSyncAttention

    # The arch check of the sm_120 block-scaled MMA op reads CUTE_DSL_ARCH.
    previous = os.environ.get("CUTE_DSL_ARCH")
    os.environ["CUTE_DSL_ARCH"] = arch
    try:
        # --keep-cubin writes <function name>.cubin, the same name for every config: a private
        # dump directory keeps parallel builds apart and the working directory clean.
        with tempfile.TemporaryDirectory(prefix="mma_sync_") as dump:
            start = time.perf_counter()
            fn = cute.compile(MmaSyncAttention(cfg, head_dim), *_example_args(),
                              options=f"--gpu-arch={arch} --keep-cubin --dump-dir={dump}")
            seconds = time.perf_counter() - start
            cubin = fn.__cubin__
            if isinstance(cubin, str):
                cubin = Path(cubin).read_bytes()
    finally:
        if previous is None:
            os.environ.pop("CUTE_DSL_ARCH", None)
        else:
            os.environ["CUTE_DSL_ARCH"] = previous
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
            disk = cache_root() / "mma_sync" / key
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


def cached_resources(cfg: Config, head_dim: int, arch: str) -> ResourceUsage | None:
    """Resource usage from the disk cache, without compiling (None when not cached)."""
    meta = cache_root() / "mma_sync" / codegen_key(cfg, head_dim, arch) / "meta.json"
    if not meta.exists():
        return None
    return ResourceUsage(**json.loads(meta.read_text())["resources"])


def compile_report(arch: str, problem=None, gpu=None, workers: int = 1) -> list[dict]:
    """Compile every config of `arch`'s space that can_implement accepts; one row per config.

    Rejected configs are listed with their reason and not compiled. `gpu` defaults to the first
    profile of tuner.gpus with that arch, else to a stand-in with 99 KB of shared memory.
    `workers` > 1 compiles in a process pool (each worker has its own memory cache; the disk
    cache is shared).
    """
    from variants.base import enumerate_space
    from variants.mma_sync.config import can_implement, space

    if problem is None:
        from tuner.problem import Problem

        problem = Problem(batch=1, heads=56, seq_len=30272, head_dim=128)
    gpu = gpu or _gpu_for_arch(arch)
    rows, todo = [], []
    for cfg in enumerate_space(Config, space(arch)):
        ok, reason = can_implement(cfg, problem, gpu)
        row = {"config": cfg, "ok": ok, "reason": reason}
        rows.append(row)
        if ok:
            todo.append(row)
    if workers > 1 and len(todo) > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=workers) as pool:
            results = pool.map(_report_one, [(r["config"], problem, arch) for r in todo])
            for row, result in zip(todo, results, strict=True):
                row.update(result)
    else:
        for row in todo:
            row.update(_report_one((row["config"], problem, arch)))
    return rows


def _report_one(args) -> dict:
    cfg, problem, arch = args
    try:
        kernel = compile(cfg, problem, arch)
    except Exception as exc:  # noqa: BLE001 - a failed build is a row of the report
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}
    return {"resources": kernel.resources, "compile_seconds": kernel.compile_seconds}


def _gpu_for_arch(arch: str):
    try:
        from tuner.gpus import PROFILES

        for profile in PROFILES.values():
            if profile.arch == arch:
                return profile
    except ImportError:
        pass
    from types import SimpleNamespace

    return SimpleNamespace(name=f"generic-{arch}", arch=arch, smem_per_block=101376, sm_count=1)


def format_report(rows: list[dict]) -> str:
    lines = [f"{'config':<120} {'regs':>4} {'spill':>5} {'smem':>6} {'s':>5}  note"]
    blank = f"{'-':>4} {'-':>5} {'-':>6} {'-':>5}"
    for row in rows:
        label = row["config"].short()
        if not row["ok"]:
            lines.append(f"{label:<120} {blank}  rejected: {row['reason']}")
        elif "error" in row:
            lines.append(f"{label:<120} {blank}  FAILED: {row['error']}")
        else:
            r = row["resources"]
            lines.append(f"{label:<120} {r.registers:>4} {r.spill_bytes:>5} {r.smem_bytes:>6} "
                         f"{row['compile_seconds']:>5.1f}")
    return "\n".join(lines)
