"""Benchmarks of fp8-attn-tuner on the local GPU: `python -m benchmarks <suite> [options]`.

One module per suite, each small, sharing benchmarks/common.py (shapes, timing, tables) and
benchmarks/results.py (the results pages benchmarks/results/<gpu>.md, one section per suite):

  kernel    our kernel alone on prepared FP8 inputs beside FA3 FP8 and cuDNN FP8
  e2e       tuner.attention from bf16 beside FA3 bf16, SDPA bf16 (cuDNN) and SageAttention;
            our kernel and quantization alone; host and wall time per call
  quant     prepare alone against its memory floor
  accuracy  rel RMS against fp32 attention per activation kind, transforms on and off; their cost
  gate      the gate's cost per candidate; the no-false-reject sweep over the feasible space
  search    the wall time of `tuner search`, cold and with a warm compile cache
  host      where the host time of a repeated tuner.attention call goes

docs/benchmarks.md says how to run them and what each measures.
"""

SUITES = ("kernel", "e2e", "quant", "accuracy", "gate", "search", "host")
