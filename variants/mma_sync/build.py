"""compile() for the mma_sync family: the shared cache of variants/build.py around
MmaSyncAttention. Batch, heads and seq_len are runtime arguments: one build per head_dim."""

from __future__ import annotations

from pathlib import Path

from variants import build
from variants.base import ResourceUsage
from variants.mma_sync.config import Config, smem_bytes

FAMILY = "mma_sync"
_SRC_DIR = Path(__file__).resolve().parent


def codegen_key(cfg: Config, head_dim: int, arch: str) -> str:
    return build.codegen_key(FAMILY, cfg, head_dim, arch, _SRC_DIR)


def compile(cfg: Config, problem, arch: str) -> build.CompiledKernel:  # noqa: A001 - contract
    """Build (or fetch from cache) the kernel for `cfg` on `arch`; works without a GPU."""
    from variants.mma_sync.kernel import MmaSyncAttention

    return build.compile_cached(
        FAMILY, _SRC_DIR, cfg, problem, arch,
        make_kernel=lambda: MmaSyncAttention(cfg, problem.head_dim, problem.causal),
        smem_bytes=smem_bytes(cfg, problem.head_dim),
    )


def cached_resources(cfg: Config, head_dim: int, arch: str) -> ResourceUsage | None:
    return build.cached_resources(FAMILY, _SRC_DIR, cfg, head_dim, arch)
