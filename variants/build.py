"""What every family's compile() shares: the cache key, the CuTe-DSL build, the disk and memory
caches, and the compiled-kernel object that implements the Kernel protocol of base.py.

The cache key holds every input to code generation: family, Config, head_dim, target arch, a hash
of the family's source files and the CuTe DSL version. Batch, heads, seq_len (and the persistent
grid size) are runtime arguments of the compiled function, so problems that share a head_dim
share one build. On disk each entry keeps, under $TUNER_CACHE_DIR (default
~/.cache/fp8-attn-tuner)/<family>/<key>/, the cubin, its resource usage and the whole compiled
function as a relocatable object (`kernel.o`: host launch code + cubin, from CuTe DSL's
`dump_to_object`). Another process (a search's GPU sandbox after the compile pool built the
candidate, or the next Python session calling `tuner.attention`) loads that object with
`cutlass.runtime.load_module` in milliseconds instead of compiling again. CuTe DSL's own file cache
(CUTE_DSL_CACHE_DIR) is pointed beside it unless the user set it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import platform
import re
import tempfile
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from variants.base import PREPARE_ONLY_KNOBS, ResourceUsage
from variants.common.abi import fake_args, launch_values, slots
from variants.cubin import cubin_resources
from variants.dsl_compile import cache_root, compile_for_arch

log = logging.getLogger(__name__)

_LOCK = threading.RLock()
_FUNCTIONS: dict[str, tuple] = {}  # codegen key -> (compiled fn, resources, compile seconds)
# codegen key -> the disk entry the build was written to or loaded from: another config or
# problem that shares the build finds its cubin there, whatever the cache root is now.
_ENTRIES: dict[str, Path] = {}
_KERNELS: dict[str, CompiledKernel] = {}  # codegen key / problem key -> kernel


@cache
def source_hash(src_dir: str) -> str:
    """Hash of a family's *.py files: editing the kernel invalidates its cached builds."""
    return files_hash(sorted(Path(src_dir).glob("*.py")))


def files_hash(paths) -> str:
    """sha256 (16 hex digits) of the named files' names and contents, in the given order."""
    h = hashlib.sha256()
    for path in paths:
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


@cache
def dsl_toolkit() -> str:
    """The CUDA toolkit flavor of the DSL's compiler that this process loaded ("cu12", "cu13"):
    with both flavors installed the DSL picks by the driver (the newest flavor without one, as on
    a CPU-only machine), and each flavor's ptxas schedules the same kernel differently (the cu12
    and cu13 builds of the default's strip loop are 483 and 462 instructions, with the PV wait
    in different places). So it is part of the key."""
    from importlib import import_module

    loaded = import_module("cutlass._mlir._mlir_libs._cutlass_ir")
    flavor = re.search(r"\.(cu\d+)\.", Path(getattr(loaded, "__file__", "") or "").name)
    return flavor.group(1) if flavor else "untagged"


# CuTe DSL settings that do not change generated code (the arch is a key field of its own).
_ENV_NOT_CODEGEN = {"CUTE_DSL_ARCH", "CUTE_DSL_CACHE_DIR", "CUTE_DSL_DUMP_DIR", "CUTE_DSL_KEEP",
                    "CUTE_DSL_LOG_LEVEL", "CUTE_DSL_LOG_TO_CONSOLE", "CUTE_DSL_LOG_TO_FILE"}


@cache
def shared_source_hash() -> str:
    """This module, the compile options (dsl_compile), the launch ABI and device code every
    family shares (common/), the block scales' constants the kernels fold (block_scales) and
    the contract they implement: the cache launches what it stores, so an edit there must not
    reuse old objects."""
    here = Path(__file__).resolve().parent
    return files_hash([*(here / name for name in ("build.py", "base.py", "cubin.py",
                                                   "dsl_compile.py", "block_scales.py")),
                        *sorted((here / "common").glob("*.py"))])


def _dsl_environment() -> dict[str, str]:
    """CUTE_DSL_* variables that can change the build (debug, line info, assertions, compiler
    options, TVM-FFI...): a debug build must not be timed later as the release one."""
    return {k: v for k, v in os.environ.items()
            if k.startswith("CUTE_DSL_") and k not in _ENV_NOT_CODEGEN}


def codegen_knobs(cfg) -> dict:
    """The config's knobs that reach code generation: all but the prepare-only ones
    (base.PREPARE_ONLY_KNOBS), so configs that differ only in those share one build."""
    return {k: v for k, v in cfg.to_dict().items() if k not in PREPARE_ONLY_KNOBS}


def codegen_key(family: str, cfg, head_dim: int, arch: str, src_dir: Path,
                causal: bool = False, extra: dict | None = None) -> str:
    # host: kernel.o holds host code too, so a cache shared by x86 and Arm hosts keeps both.
    # causal is a compile-time constant of the kernels (lengths and head counts are runtime);
    # extra: a family's other compile-time constants taken from the problem (none: no field).
    fields = {"extra": extra} if extra else {}
    blob = json.dumps({"family": family, "config": codegen_knobs(cfg), "head_dim": head_dim,
                       "causal": causal,
                       "arch": arch, "src": source_hash(str(src_dir)), "dsl": dsl_version(),
                       "toolkit": dsl_toolkit(), "shared": shared_source_hash(),
                       "env": _dsl_environment(), "host": platform.machine(), **fields},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def build_function(kernel_obj, arch: str, extra_args: tuple = (), *, q_in_kernel: bool = False,
                   v_unquantized: bool = False, qk_int8: bool = False):
    """cute.compile the kernel object for `arch`; returns (function, cubin bytes, seconds)."""
    fn, seconds, cubin = compile_for_arch(
        kernel_obj, arch, fake_args(extra=extra_args, q_in_kernel=q_in_kernel,
                                    v_unquantized=v_unquantized, qk_int8=qk_int8),
        keep="--keep-cubin")
    return fn, cubin, seconds


# ---- the compiled function on disk ---------------------------------------------------------------

_OBJECT_FILE = "kernel.o"


def _symbol_prefix(key: str) -> str:
    """The exported entry point's name: unique per build, so many objects load into one process."""
    return f"fa8_{key}"


@cache
def _load_runtime_globally() -> None:
    """dump_to_object links the host launcher against the CuTe DSL runtime (its _cudaLaunchKernelEx
    and friends); the JIT resolves those symbols only from libraries loaded RTLD_GLOBAL, which the
    DSL itself does not do. Needed on GPU-less machines too (the dump works without a GPU)."""
    import ctypes

    from cutlass.runtime import find_runtime_libraries

    for path in find_runtime_libraries(enable_tvm_ffi=False):
        if os.path.exists(path):
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)


def _write_atomic(path: Path, data: bytes) -> None:
    """Write beside, then rename: a process loading the entry never sees half a file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".")
    try:
        # mkstemp makes 0600 files: a cache shared by a team (or a CI image) must stay readable.
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def dump_function(fn, key: str, disk: Path) -> bool:
    """Save the compiled function as kernel.o; False (logged) when this DSL build cannot, in which
    case other processes compile the config again: slower, never wrong."""
    try:
        _load_runtime_globally()
        _write_atomic(disk / _OBJECT_FILE, fn.dump_to_object(_symbol_prefix(key)))
        return True
    except Exception as exc:  # noqa: BLE001 - a DSL without the export path only costs speed
        log.warning("could not save compiled function %s to disk (%s); other processes will "
                    "compile it again", key, str(exc).strip().splitlines()[-1][:200])
        with contextlib.suppress(OSError):
            (disk / _OBJECT_FILE).unlink()  # an older, unloadable object must not linger
        return False


def load_function(key: str, disk: Path):
    """The compiled function from kernel.o, or None when there is none or it does not load."""
    path = disk / _OBJECT_FILE
    if not path.exists():
        return None
    try:
        from cutlass.runtime import load_module

        _load_runtime_globally()
        return getattr(load_module(str(path)), _symbol_prefix(key))
    except Exception as exc:  # noqa: BLE001 - a stale or foreign object: compile instead
        log.warning("could not load %s (%s); compiling again", path,
                    str(exc).strip().splitlines()[-1][:200])
        return None


def _load_cached(family: str, key: str, src_dir: Path):
    """(function, resources, compile seconds) of a build another process left on disk, or None.
    meta.json is written last, so its presence means the entry is complete; its source hash and
    DSL version are in the key already and are re-checked as a guard against a hand-copied entry."""
    disk = cache_root() / family / key
    meta = _read_meta(disk / "meta.json")
    if meta is None or meta.get("src") != source_hash(str(src_dir)) \
            or meta.get("dsl") != dsl_version():
        return None
    resources = _meta_resources(meta)
    try:
        seconds = float(meta["compile_seconds"])
    except (KeyError, TypeError, ValueError):  # an entry from an older layout: rebuild it
        return None
    if resources is None:
        return None
    fn = load_function(key, disk)
    if fn is None:
        return None
    return fn, resources, seconds


def _meta_resources(meta: dict | None) -> ResourceUsage | None:
    """The resource usage an entry's meta.json records, None when absent or malformed (an
    entry from an older layout)."""
    try:
        return ResourceUsage(**meta["resources"]) if meta is not None else None
    except (KeyError, TypeError, ValueError):
        return None


def _read_meta(path: Path) -> dict | None:
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


@dataclass
class CompiledKernel:
    """A compiled attention kernel of any family: the Kernel protocol of variants/base.py.

    The config must provide pad_to() (the sequence multiple its tiles load) and the V layout
    prepare must produce (v_feature_major, v_key_permuted: base.ConfigMixin)."""

    config: Any
    problem: Any
    arch: str
    resources: ResourceUsage
    compile_seconds: float  # of the original build, also when this process loaded it from disk
    _fn: Any = field(repr=False, default=None)
    loaded_from_disk: bool = False
    # The cubin in the disk cache (its SASS says which MMA instruction the build issues).
    cubin_path: Path | None = None
    # Launch arguments after the scalars, as ints, computed per device (e.g. the SM count of a
    # persistent grid): cached per device index, since a device query costs microseconds.
    _extra_args: Callable[[Any], tuple] = field(repr=False, default=lambda device: ())
    # fp32 words of scratch a launch on these prepared inputs on the device needs (the ABI's
    # workspace pointer; 0: none, the pointer is 0). The kernel initialises what it reads.
    _workspace_words: Callable[[Any, Any], int] = field(
        repr=False, default=lambda device, prepared: 0)
    # The build to launch instead where a launch of this one would need no workspace: the same
    # config in one launch (split_tail where its rule keeps the tail whole runs the
    # split_tail=False build, whose program its first launch is, without the empty second
    # launch: about 1% at small shapes on the H200). Same layouts, same output bits.
    _single_launch: CompiledKernel | None = field(repr=False, default=None)
    _launchers: dict = field(repr=False, default_factory=dict)

    def prepare(self, q, k, v, softmax_scale: float | None = None, *, validate: bool = True,
                want_lse: bool = True):
        """validate=False skips the input checks for a caller that has made them already;
        want_lse=False prepares for runs that drop the LSE (prepare.quantize_inputs)."""
        from variants.prepare import quantize_inputs

        feature_major, permuted = self._v_layout()
        return quantize_inputs(q, k, v, pad_to=self.config.pad_to(), permute_keys=permuted,
                               softmax_scale=softmax_scale, validate=validate,
                               v_feature_major=feature_major,
                               q_in_kernel=self.config.q_in_kernel,
                               k_smoothing=self.config.k_smoothing,
                               qk_rotation=self.config.qk_rotation,
                               v_unquantized=self.config.v_unquantized,
                               qk_dtype="int8" if self.config.qk_int8 else "e4m3",
                               want_lse=want_lse,
                               kv_scales="head" if self.config.kv_head_scales else "block")

    def prepare_fp8(self, q, k, v, descales, softmax_scale: float | None = None):
        """Inputs the caller quantized (e4m3 codes and their descales, per head or per token /
        64 keys: variants.input_checks.check_fp8_qkv) in this kernel's layout, without
        quantizing: variants.prepare_fp8.fp8_inputs. prepare's transforms do not apply to
        codes."""
        from variants.prepare_fp8 import fp8_inputs

        if self.config.transforms_on():
            raise ValueError(f"{self.config.short()} transforms q and k before quantizing them "
                             f"({', '.join(self.config.transforms_on())}); FP8 inputs run on "
                             "config.for_q_dtype('float8_e4m3fn'), which turns them off")
        if self.config.q_in_kernel or self.config.v_unquantized or self.config.qk_int8:
            what = ("quantizes a bf16 q itself" if self.config.q_in_kernel else
                    "reads a bf16 v" if self.config.v_unquantized else "reads int8 q and k")
            raise ValueError(f"{self.config.short()} {what}; FP8 inputs run on "
                             "config.for_q_dtype('float8_e4m3fn') (tuner.attention_fp8 does so)")
        feature_major, permuted = self._v_layout()
        prepared = fp8_inputs(q, k, v, descales, pad_to=self.config.pad_to(),
                              permute_keys=permuted, softmax_scale=softmax_scale,
                              v_feature_major=feature_major)
        if self.config.kv_head_scales and not prepared.kv_head_scales:
            raise ValueError(f"{self.config.short()} reads one K and one V descale per (batch, "
                             "KV head), and these k/v descales are per 64 keys: run the "
                             "config with kv_scales='block'")
        return prepared

    def _v_layout(self) -> tuple[bool, bool]:
        return self.config.v_feature_major, self.config.v_key_permuted

    def _launcher(self, device):
        """(FastLaunch of the compiled function, its extra ints) for this device, made once."""
        hit = self._launchers.get(device)
        if hit is None:
            from variants.launch import FastLaunch

            extra = self._extra_args(device)
            hit = self._launchers[device] = (
                FastLaunch(self._fn, slots(len(extra), q_in_kernel=self.config.q_in_kernel,
                                           v_unquantized=self.config.v_unquantized,
                                           qk_int8=self.config.qk_int8)),
                extra)
        return hit

    @staticmethod
    def _workspace(words: int, device):
        """A fresh scratch buffer for one launch (None for none). Per launch, from torch's
        caching allocator on the current stream, so concurrent launches never share counters;
        freed after the launch is queued, which the allocator orders behind it on that
        stream."""
        if not words:
            return None
        import torch

        return torch.empty(words, dtype=torch.float32, device=device)

    def kernel_for(self, prepared) -> CompiledKernel:
        """The build that launches these prepared inputs: this one, or _single_launch where a
        launch of this one would need no workspace."""
        if self._single_launch is not None \
                and not self._workspace_words(prepared.q.device, prepared):
            return self._single_launch
        return self

    def run(self, prepared, out=None, lse=None, *, want_lse: bool = True):
        """Launch on torch's current stream (so it orders with torch work and can be captured
        in a CUDA graph); writes into out/lse when given, without allocating or syncing.
        With K smoothing the kernel's LSE is that of the smoothed scores: want_lse adds
        softmax_scale * q . m back to every row (prepared.restore_lse; one elementwise add),
        want_lse=False leaves it (for a caller that does not read the LSE)."""
        import torch

        target = self.kernel_for(prepared)
        if target is not self:  # it checks the inputs (the same layouts as this build's)
            return target.run(prepared, out, lse, want_lse=want_lse)
        if self._fn is None:
            raise RuntimeError(f"kernel for {self.config.short()} has no compiled function")
        if (prepared.v_feature_major, prepared.key_permuted) != self._v_layout():
            raise ValueError("prepared inputs have the wrong V layout or key order for this "
                             "config: use this kernel's prepare()")
        for name, got_16, want_16 in (("q", prepared.q_in_kernel, self.config.q_in_kernel),
                                      ("v", prepared.v_unquantized, self.config.v_unquantized)):
            if got_16 != want_16:
                got, want = ("bf16", "e4m3 codes") if got_16 else ("e4m3 codes", "bf16")
                raise ValueError(f"prepared {name} is {got}, this kernel reads {want}: use "
                                 "this kernel's prepare()")
        if self.config.kv_head_scales and not prepared.kv_head_scales:
            raise ValueError("prepared K and V scales are per 64 keys, this kernel reads one per "
                             "(batch, KV head): use this kernel's prepare()")
        got_int8 = prepared.k.dtype == torch.int8  # Fp8Inputs.qk_int8
        if got_int8 != self.config.qk_int8:
            got, want = ("int8", "e4m3") if got_int8 else ("e4m3", "int8")
            raise ValueError(f"prepared k is {got} codes, this kernel reads {want} codes: use "
                             "this kernel's prepare()")
        if prepared.v_unquantized and prepared.v.shape[1] != prepared.seq_len_kv:
            raise ValueError(f"a bf16 v must hold exactly seq_len_kv = {prepared.seq_len_kv} "
                             f"keys (the kernel's view of it has that length), not "
                             f"{prepared.v.shape[1]}: use this kernel's prepare()")
        if ((prepared.k_mean is not None, prepared.qk_rotated)
                != (self.config.k_smoothing == "mean", self.config.qk_rotation == "hadamard")):
            raise ValueError(f"prepared inputs are smoothed={prepared.k_mean is not None} "
                             f"rotated={prepared.qk_rotated}, this config has k_smoothing="
                             f"{self.config.k_smoothing!r} qk_rotation="
                             f"{self.config.qk_rotation!r}: use this kernel's prepare()")
        for padded in (prepared.padded_len, prepared.padded_len_kv):
            if padded % self.config.pad_to():
                raise ValueError(f"padded length {padded} is not a multiple of "
                                 f"{self.config.pad_to()}: use this kernel's prepare()")
        if not prepared.softmax_scale > 0:
            raise ValueError("softmax_scale must be > 0")
        batch, _padded, heads, head_dim = prepared.q.shape
        if head_dim != self.problem.head_dim:
            raise ValueError(f"head_dim {head_dim} != compiled head_dim {self.problem.head_dim}")
        kv_heads = prepared.k.shape[2]
        if getattr(self.config, "pack_gqa", False) and heads // kv_heads != self.problem.group:
            raise ValueError(f"this build packs {self.problem.group} query heads per KV head "
                             f"(pack_gqa, compiled in); the inputs have {heads} on {kv_heads}: "
                             "compile the config for this problem")
        s = prepared.seq_len
        device = prepared.q.device
        words = self._workspace_words(device, prepared)
        if out is None:
            out = torch.empty((batch, s, heads, head_dim), dtype=torch.bfloat16, device=device)
        if lse is None:
            lse = torch.empty((batch, heads, s), dtype=torch.float32, device=device)
        from variants.launch import current_stream_handle

        launcher, extra = self._launcher(device)
        workspace = self._workspace(words, device)
        launcher(*launch_values(prepared, out, lse, current_stream_handle(device), extra=extra,
                                workspace=0 if workspace is None else workspace.data_ptr()))
        if want_lse and prepared.k_mean is not None:
            prepared.restore_lse(lse)
        return out, lse


def compile_cached(family: str, src_dir: Path, cfg, problem, arch: str, *,
                   make_kernel: Callable[[], Any], smem_bytes: int,
                   example_extra: tuple = (),
                   extra_args: Callable[[Any], tuple] = lambda device: (),
                   workspace_words: Callable[[Any, Any], int] = lambda device, prepared: 0,
                   single_launch: Callable[[], CompiledKernel] | None = None,
                   codegen_extra: dict | None = None,
                   ) -> CompiledKernel:
    """The one compile cache: memory per (build, problem), a build per codegen key, and on disk
    the cubin, resources and loadable function of every build (read back by other processes).
    single_launch builds the kernel run where a launch needs no workspace
    (CompiledKernel._single_launch), with this one, so that a search's compile pool leaves both
    on disk. codegen_extra: the problem's values the build compiles in beyond head_dim and
    causal (wgmma's pack_gqa: the group), part of the key."""
    key = codegen_key(family, cfg, problem.head_dim, arch, src_dir, problem.causal,
                      codegen_extra)
    # The build is shared by configs that differ in prepare-only knobs; the kernel object (whose
    # prepare applies them) is not.
    prepare_knobs = ",".join(f"{k}={getattr(cfg, k, v)}" for k, v in PREPARE_ONLY_KNOBS.items())
    kernel_key = f"{key}/{problem.key()}/{prepare_knobs}"
    with _LOCK:
        hit = _KERNELS.get(kernel_key)
        if hit is not None:
            return hit
        from_disk = False
        if key not in _FUNCTIONS:
            _ENTRIES[key] = cache_root() / family / key
            loaded = _load_cached(family, key, src_dir)
            if loaded is not None:
                _FUNCTIONS[key] = loaded
                from_disk = True
            else:
                _FUNCTIONS[key] = _build_and_save(family, key, src_dir, cfg, problem.head_dim,
                                                  arch, make_kernel, smem_bytes, example_extra)
        fn, resources, seconds = _FUNCTIONS[key]
        kernel = CompiledKernel(config=cfg, problem=problem, arch=arch, resources=resources,
                                compile_seconds=seconds, _fn=fn, _extra_args=extra_args,
                                _workspace_words=workspace_words,
                                _single_launch=None if single_launch is None else single_launch(),
                                loaded_from_disk=from_disk,
                                cubin_path=_ENTRIES[key] / "kernel.cubin")
        _KERNELS[kernel_key] = kernel
        return kernel


def _build_and_save(family: str, key: str, src_dir: Path, cfg, head_dim: int, arch: str,
                    make_kernel: Callable[[], Any], smem_bytes: int, example_extra: tuple):
    fn, cubin, seconds = build_function(make_kernel(), arch, example_extra,
                                        q_in_kernel=cfg.q_in_kernel,
                                        v_unquantized=cfg.v_unquantized, qk_int8=cfg.qk_int8)
    resources = cubin_resources(cubin, smem_bytes)
    disk = cache_root() / family / key
    disk.mkdir(parents=True, exist_ok=True)
    _write_atomic(disk / "kernel.cubin", cubin)
    dump_function(fn, key, disk)
    # Last: its presence tells other processes the entry is complete.
    _write_atomic(disk / "meta.json", json.dumps(
        {"config": codegen_knobs(cfg), "head_dim": head_dim, "arch": arch,
         "resources": asdict(resources), "compile_seconds": seconds,
         "dsl": dsl_version(), "src": source_hash(str(src_dir))}, indent=1).encode())
    return fn, resources, seconds


def cached_resources(family: str, src_dir: Path, cfg, head_dim: int,
                     arch: str) -> ResourceUsage | None:
    """Resource usage from the disk cache, without compiling (None when not cached)."""
    return _meta_resources(_read_meta(
        cache_root() / family / codegen_key(family, cfg, head_dim, arch, src_dir) / "meta.json"))
