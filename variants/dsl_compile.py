"""CuTe DSL compilation for a target arch, on any machine (no GPU needed: CUTE_DSL_ARCH picks
the target), and the cache directory the project's builds live under. The lowest layer of the
build: variants/build.py (the kernel cache) and variants/quantize_kernel.py (the fused cast) both
compile through compile_for_arch, and neither depends on the other.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from pathlib import Path


def cache_root() -> Path:
    root = os.environ.get("TUNER_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "fp8-attn-tuner")
    return Path(root)


@contextlib.contextmanager
def arch_env(arch: str):
    """CuTe DSL reads the target from CUTE_DSL_ARCH (arch checks of MMA ops included); restore
    the caller's value afterwards. Yields a private scratch directory for --dump-dir: without
    it --keep-cubin writes <cwd at import>/<entry name>.<arch>.cubin, one name for every config
    of a family, so parallel compiles in one directory read each other's half-written cubins
    (seen on the H200: "not a 64-bit ELF cubin") and the user's cwd collects files."""
    previous = os.environ.get("CUTE_DSL_ARCH")
    os.environ["CUTE_DSL_ARCH"] = arch
    os.environ.setdefault("CUTE_DSL_CACHE_DIR", str(cache_root() / "cute_dsl"))
    try:
        with tempfile.TemporaryDirectory(prefix="cute-build-") as scratch:
            yield scratch
    finally:
        if previous is None:
            os.environ.pop("CUTE_DSL_ARCH", None)
        else:
            os.environ["CUTE_DSL_ARCH"] = previous


def compile_for_arch(kernel_obj, arch: str, args: tuple, *, keep: str = "",
                     dump_dir: str | None = None):
    """cute.compile any kernel object for `arch` (no GPU needed) with its launch stand-ins
    `args`. keep: extra --keep-* options; their files go to dump_dir, else to a private scratch
    directory (arch_env says why never the working directory). Returns (function, seconds,
    cubin bytes with --keep-cubin, else None: read before the scratch directory goes)."""
    import cutlass.cute as cute

    with arch_env(arch) as scratch:
        start = time.perf_counter()
        fn = cute.compile(kernel_obj, *args,
                          options=f"--gpu-arch={arch} {keep} --dump-dir={dump_dir or scratch}")
        seconds = time.perf_counter() - start
        cubin = None
        if "--keep-cubin" in keep:
            cubin = fn.__cubin__
            if isinstance(cubin, str):
                cubin = (Path(cubin).read_bytes() if os.path.exists(cubin)
                         else cubin.encode("latin1"))
    return fn, seconds, cubin
