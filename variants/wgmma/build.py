"""compile() for the wgmma family: the shared cache of variants/build.py around WgmmaAttention.
Batch, heads, seq_len and the persistent grid size (the SM count) are runtime arguments."""

from __future__ import annotations

from pathlib import Path

from variants import build
from variants.wgmma.config import Config, smem_bytes

FAMILY = "wgmma"
_SRC_DIR = Path(__file__).resolve().parent


def _sm_count_arg(device) -> tuple:
    import torch

    return (torch.cuda.get_device_properties(device).multi_processor_count,)


def _example_sm_count() -> tuple:
    import cutlass

    return (cutlass.Int32(132),)


def _workspace_words(cfg: Config, head_dim: int):
    """The launch's scratch on a device: split_tail's slots and counters for a grid of its SMs
    (the persistent grid the kernel launches), none otherwise."""
    if not cfg.split_tail:
        return lambda device: (0, 0)

    def words(device) -> tuple:
        from variants.wgmma.config import ROWS_PER_WG
        from variants.wgmma.split_tail import workspace_words

        (grid,) = _sm_count_arg(device)
        return workspace_words(cfg.block_m, head_dim, cfg.block_m // ROWS_PER_WG * 4, grid)

    return words


def compile(cfg: Config, problem, arch: str) -> build.CompiledKernel:  # noqa: A001 - contract
    """Build (or fetch from cache) the kernel for `cfg` on `arch`; works without a GPU."""
    from variants.wgmma.kernel import WgmmaAttention

    return build.compile_cached(
        FAMILY, _SRC_DIR, cfg, problem, arch,
        make_kernel=lambda: WgmmaAttention(cfg, problem.head_dim, problem.causal),
        smem_bytes=smem_bytes(cfg, problem.head_dim),
        example_extra=_example_sm_count(), extra_args=_sm_count_arg,
        workspace_words=_workspace_words(cfg, problem.head_dim),
    )
