"""wgmma family: FP8 flash-attention forward on Hopper warpgroup MMA + TMA (sm_90a)."""

from variants.wgmma.build import CompiledKernel, compile
from variants.wgmma.config import Config, can_implement, default, space
from variants.wgmma.kernel import WgmmaAttention

__all__ = ["CompiledKernel", "Config", "WgmmaAttention", "can_implement", "compile", "default",
           "space"]
