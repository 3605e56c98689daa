"""The mma_sync family's default config as data (variants/defaults.py says how a table of rules
applies): each rule's reason in one line, its measurements in docs/family-mma_sync.md#defaults.
config.default builds the Config from these rules."""

from __future__ import annotations

from variants.defaults import Rule, When, k_smoothing_rule

DOCS = "docs/family-mma_sync.md#defaults"

RULES = (
    Rule(When(),
         dict(block_m=128, block_n=32, warps=4, rows_per_warp=32, kv_stages=2,
              p_source="registers", swizzle="bank_period", q_in_registers=False, mma="fp8",
              pv_accum="fp32"),
         "the seed kernel's final config (RTX 5080); within 2% of the best of 144 feasible "
         "configs on the H200; FP32 accumulate, the numerics validated here", DOCS),
    k_smoothing_rule(DOCS),
)
