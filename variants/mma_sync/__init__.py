"""mma_sync family: FP8 flash-attention forward on warp-level mma.sync m16n8k32 (sm_89+)."""

from variants.mma_sync.build import CompiledKernel, compile, compile_report
from variants.mma_sync.config import Config, can_implement, default, space
from variants.mma_sync.kernel import MmaSyncAttention

__all__ = ["CompiledKernel", "Config", "MmaSyncAttention", "can_implement", "compile",
           "compile_report", "default", "space"]
