"""wgmma family: FP8 flash-attention forward on Hopper warpgroup MMA + TMA (sm_90a)."""

from variants.build import CompiledKernel
from variants.wgmma.build import compile
from variants.wgmma.config import SUPPORTED_ARCHS as ARCHS
from variants.wgmma.config import Config, can_implement, default, seeds, space
from variants.wgmma.kernel import WgmmaAttention

__all__ = ["ARCHS", "CompiledKernel", "Config", "WgmmaAttention", "can_implement", "compile",
           "default", "seeds", "space"]
