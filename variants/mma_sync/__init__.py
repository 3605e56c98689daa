"""mma_sync family: FP8 flash-attention forward on warp-level mma.sync m16n8k32 (sm_89+)."""

from variants.build import CompiledKernel
from variants.mma_sync.build import compile
from variants.mma_sync.config import SUPPORTED_ARCHS as ARCHS
from variants.mma_sync.config import Config, can_implement, default, space
from variants.mma_sync.kernel import MmaSyncAttention

__all__ = ["ARCHS", "CompiledKernel", "Config", "MmaSyncAttention", "can_implement", "compile",
           "default", "space"]
