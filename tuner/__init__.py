"""FP8 flash-attention autotuner: find, store and serve the fastest correct CuTe-DSL variant."""

from tuner.problem import Problem
from tuner.runtime import attention, load_best_config

__all__ = ["Problem", "attention", "load_best_config"]
__version__ = "0.1.0"
