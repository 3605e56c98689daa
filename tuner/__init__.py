"""FP8 flash-attention autotuner: find, store and serve the fastest correct CuTe-DSL variant."""

from tuner.problem import Problem

__all__ = ["Problem"]
__version__ = "0.1.0"
