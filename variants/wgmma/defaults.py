"""The wgmma family's default config as data (variants/defaults.py says how a table of rules
applies): each rule's reason in one line, its measured table in docs/family-wgmma.md#defaults.
config.default builds the Config from these rules."""

from __future__ import annotations

from variants.defaults import Rule, When, k_smoothing_rule

DOCS = "docs/family-wgmma.md#defaults"

# Keys up to which head_dim 128 quantizes Q in the kernel (full mask; causal: CAUSAL_...).
Q_IN_KERNEL_UP_TO = 1024
# Keys up to which the causal head_dim-128 default keeps longest_first tiles on the persistent
# grid with Q quantized in the kernel and pingpong off; beyond, per_head on a hardware grid.
CAUSAL_SHORT_KEYS_UP_TO = 8192
# Keys up to which head_dim 64 takes its short-key config (the longest shape measured where it
# won; the crossover between 4608 and 8192 keys was not measured).
HEAD_DIM_64_SHORT_UP_TO = 4608
# Queries and keys from which the head_dim-128 full-mask default rotates Q and K: prepare's share
# of the call, and with it the rotation's cost, falls with the length (both transforms: 1.023x
# end to end at S=4096, 1.014x at 8192 on the H100, docs/accuracy.md).
ROTATE_FULL_128_FROM = 4096
# Queries and keys from which the causal and the head_dim-64 defaults rotate too: a causal call
# pays 1.073x at 4096 and 1.047x at 8192 for both transforms (the short causal default quantizes
# Q in the kernel, which the rotation cannot, so Q moves into prepare), over the 3% allowed.
ROTATE_FROM = 16384

_HEAD_DIM_128 = dict(consumer_wgs=2, block_n=128, kv_stages=2, p_source="registers",
                     intra_wg_overlap=True, pingpong=True, persistent=True, v_layout="prepared",
                     fma_exp2=0, tile_order="per_head", q_quant="prepare", split_tail=False)

RULES = (
    Rule(When(), _HEAD_DIM_128,
         "FA3's FP8 recipe with 128-key strips: the fastest feasible config at S=8192 H=56 "
         "(992 TFLOP/s, H200)", DOCS),
    Rule(When(head_dim=64, max_keys=HEAD_DIM_64_SHORT_UP_TO),
         dict(consumer_wgs=3, kv_stages=2, intra_wg_overlap=False, pingpong=True,
              q_quant="kernel"),
         "three consumer warpgroups, Q quantized in the kernel: 0.460 vs 0.474 ms prepare + "
         "kernel at S=4096 H=56 (H200)", DOCS),
    Rule(When(head_dim=64, min_keys=HEAD_DIM_64_SHORT_UP_TO + 1),
         dict(consumer_wgs=3, kv_stages=3, intra_wg_overlap=True, pingpong=False,
              q_quant="prepare"),
         "three consumer warpgroups, 3 stages: the fastest of five searched configs from 8192 "
         "keys (H200)", DOCS),
    Rule(When(causal=False), dict(split_tail=True),
         "the last wave split along the keys where split_tail's cost rule says so at launch: "
         "1.00-1.02x (H200)", DOCS),
    Rule(When(head_dim=128, causal=True, min_keys=CAUSAL_SHORT_KEYS_UP_TO + 1),
         dict(persistent=False),
         "per_head tiles on a grid the hardware schedules: 1.14-1.15x at 30272 keys (H200)",
         DOCS),
    Rule(When(head_dim=128, causal=True, max_keys=CAUSAL_SHORT_KEYS_UP_TO),
         dict(tile_order="longest_first", pingpong=False, q_quant="kernel"),
         "longest tiles first, Q quantized in the kernel, no pingpong: 1.04-1.15x (H200)", DOCS),
    Rule(When(head_dim=64, causal=True), dict(tile_order="longest_first"),
         "longest tiles first (per_head on a hardware grid: 0.92x at S=30272, H200)", DOCS),
    Rule(When(head_dim=128, max_keys=Q_IN_KERNEL_UP_TO), dict(q_quant="kernel"),
         "Q quantized in the kernel: 0.138 vs 0.142 ms at B=4 S=1024 H=32; from 4096 keys its "
         "kernel's 3.5-6% loss outweighs the saved quantization (H200)", DOCS),
    Rule(When(head_dim=128, causal=False, min_queries=ROTATE_FULL_128_FROM,
              min_keys=ROTATE_FULL_128_FROM), dict(qk_rotation="hadamard"),
         "Q/K rotation on: outlier channels 0.37 -> 0.14 rel RMS; both transforms cost 1.023x "
         "end to end at 4096 tokens and 1.014x at 8192 (H100; docs/accuracy.md)", DOCS),
    Rule(When(causal=True, min_queries=ROTATE_FROM, min_keys=ROTATE_FROM),
         dict(qk_rotation="hadamard"),
         "Q/K rotation on from 16384 tokens: below, both transforms (Q moved into prepare) "
         "cost a causal call 1.073x at 4096 and 1.047x at 8192, over 3%; 16384 itself not "
         "measured without them (H100; docs/accuracy.md)", DOCS),
    Rule(When(head_dim=64, min_queries=ROTATE_FROM, min_keys=ROTATE_FROM),
         dict(qk_rotation="hadamard"),
         "Q/K rotation on from the length where head_dim 128 pays 1.014x or less (head_dim 64 "
         "not measured; docs/accuracy.md)", DOCS),
    k_smoothing_rule(DOCS),
)
