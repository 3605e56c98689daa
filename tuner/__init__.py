"""FP8 flash-attention autotuner: find, store and serve the fastest correct CuTe-DSL variant."""

from tuner.api import attention, attention_fp8
from tuner.capturing import capture
from tuner.errors import TunerError
from tuner.problem import Problem
from tuner.runtime import load_best_config
from tuner.sdpa import scaled_dot_product_attention

__all__ = ["Problem", "TunerError", "attention", "attention_fp8", "capture", "load_best_config",
           "scaled_dot_product_attention"]
__version__ = "0.1.0"
