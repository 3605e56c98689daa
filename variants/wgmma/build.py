"""compile() for the wgmma family: the shared cache of variants/build.py around WgmmaAttention.
Batch, heads, seq_len and the persistent grid size (the SM count) are runtime arguments."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

from variants import build
from variants.wgmma.config import Config, smem_bytes

FAMILY = "wgmma"
_SRC_DIR = Path(__file__).resolve().parent


@functools.cache
def _sm_count_arg(device) -> tuple:
    import torch

    return (torch.cuda.get_device_properties(device).multi_processor_count,)


def _example_sm_count() -> tuple:
    import cutlass

    return (cutlass.Int32(132),)


def _workspace_words(cfg: Config, head_dim: int):
    """The scratch of a launch on prepared inputs: split_tail's slots and counters for a grid of
    the device's SMs (the persistent grid the kernel launches) where it splits that problem's
    tail (split_tail.split_tiles, as the kernel decides), none otherwise."""
    if not cfg.split_tail:
        return lambda device, prepared: 0

    def words(device, prepared) -> tuple:
        from variants.wgmma.split_tail import split_tiles, workspace_words

        (grid,) = _sm_count_arg(device)
        batch, _, heads, _ = prepared.q.shape
        # The kernel's tile count (pack_gqa: KV heads times blocks of packed rows).
        group = heads // prepared.k.shape[2] if cfg.pack_gqa else 1
        tiles = batch * (heads // group) * -(-prepared.seq_len * group // cfg.block_m)
        strips = -(-prepared.seq_len_kv // cfg.block_n)
        if not split_tiles(tiles, grid, strips):
            return 0
        return workspace_words(cfg.block_m, head_dim, 4 * cfg.consumer_wgs, grid)

    return words


def compile(cfg: Config, problem, arch: str) -> build.CompiledKernel:  # noqa: A001 - contract
    """Build (or fetch from cache) the kernel for `cfg` on `arch`; works without a GPU."""
    from variants.wgmma.kernel import WgmmaAttention

    group = cfg.packed_group(problem)
    return build.compile_cached(
        FAMILY, _SRC_DIR, cfg, problem, arch,
        make_kernel=lambda: WgmmaAttention(cfg, problem.head_dim, problem.causal, group),
        smem_bytes=smem_bytes(cfg, problem.head_dim),
        example_extra=_example_sm_count(), extra_args=_sm_count_arg,
        workspace_words=_workspace_words(cfg, problem.head_dim),
        # Where the rule keeps the tail whole, the split_tail=False build runs instead.
        single_launch=(lambda: compile(dataclasses.replace(cfg, split_tail=False), problem, arch))
        if cfg.split_tail else None,
        # pack_gqa compiles the group in (the Q box, the epilogue's row split).
        codegen_extra={"group": group} if cfg.pack_gqa else None,
    )
