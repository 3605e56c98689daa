"""Knobs, search space, default and the constraint set of the wgmma family (sm_90a)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from variants import transforms
from variants.base import ConfigMixin, load_space
from variants.block_scales import KV_BLOCK, KV_SCALES
from variants.defaults import apply_rules
from variants.wgmma.defaults import RULES

FAMILY = "wgmma"
# wgmma with e4m3 operands and TMA exist on sm_90a only (the `a` suffix: arch-specific features).
SUPPORTED_ARCHS = ("sm_90a",)
P_SOURCES = ("registers", "smem")
V_LAYOUTS = ("prepared", "kernel")
# The order the (query block, head, batch) tiles are dealt to CTAs (the persistent grid's static
# stride, or the block index): per_head walks one head's query blocks before the next head (the
# CTAs in flight share one or two heads' K/V in L2); longest_first walks every (head, batch) at
# the last query block, then the one before, down to the first (causal: the longest tiles start
# first and each persistent CTA gets tiles of falling length; without a mask every tile is as
# long, and the order only changes which K/V the CTAs in flight share).
TILE_ORDERS = ("per_head", "longest_first")
# Where Q is quantized: prepare (its one launch writes e4m3 codes and per-token scales the kernel
# TMA-loads) or kernel (TMA loads the caller's bf16 Q tile into a staging tile; the consumer
# warpgroups take each row's amax and write its e4m3 codes into the Q tile themselves: prepare
# then reads and writes only K and V, a third less of its traffic).
Q_QUANTS = ("prepare", "kernel")
# head_swizzle: (head, batch) pairs per section of longest_first's order (tiles.py); 0 is one
# section of every pair.
HEAD_SWIZZLE_MAX = 64
# The P.V GEMM's operands: e4m3 (P rounded to e4m3, V quantized by prepare with block scales) or
# bf16 (P rounded to bf16, V the caller's unquantized in its natural layout, an MN-major B
# operand; docs/family-wgmma.md, "P.V in 16 bits").
PV_DTYPES = ("e4m3", "bf16")
# The QK^T GEMM's operands: e4m3 codes (f32 accumulator) or int8 codes (s32 accumulator, exact;
# converted to f32 before the mask), both with the same block scales (amax / 448 or amax / 127;
# docs/family-wgmma.md, "QK^T in int8").
QK_DTYPES = ("e4m3", "int8")
WG_THREADS = 128
ROWS_PER_WG = 64  # wgmma M
HEAD_DIMS = (64, 128)
# setmaxnreg split (consumer, producer) per consumer-warpgroup count, as in FA3/FA4:
# 128 * (producer + wgs * consumer) <= 65536 registers of the SM; multiples of 8.
REGISTER_SPLIT = {1: (256, 56), 2: (240, 24), 3: (160, 32)}
# v_layout=kernel: the transposing producer warps hold ldmatrix/stmatrix fragments, their row
# offsets and two pipelines' state; with 24 registers the producer code spills, so with two
# consumer warpgroups each consumer thread gives up 8.
REGISTER_SPLIT_V_IN_KERNEL = {**REGISTER_SPLIT, 2: (232, 32)}

# fma_exp2 counts exponentials per group of this many of a thread's values of a softmax row (in
# register order: keys 8j + 2t + e of quad lane t, e in {0, 1}, four blocks j a group).
FMA_EXP2_GROUP = 8
# mbarriers (Q, K and V full/empty) and the 1024-byte alignment of each swizzled buffer.
SMEM_ALIGN = 1024
SMEM_BARRIER_BYTES = 1024


def register_split(cfg: Config) -> tuple[int, int]:
    """(consumer, producer) registers per thread after setmaxnreg for this config."""
    table = REGISTER_SPLIT_V_IN_KERNEL if cfg.v_layout == "kernel" else REGISTER_SPLIT
    return table[cfg.consumer_wgs]


@dataclass(frozen=True)
class Config(ConfigMixin):
    consumer_wgs: int
    block_n: int
    kv_stages: int
    p_source: str
    intra_wg_overlap: bool
    pingpong: bool
    persistent: bool
    v_layout: str
    # Of every FMA_EXP2_GROUP exponentials of a softmax row, how many a cubic on the FMA pipe
    # computes instead of MUFU ex2 (0: all on MUFU). Each default below is the build a stored
    # config without that knob names, so such configs load.
    fma_exp2: int = 0
    # TILE_ORDERS; per_head is the default, also the one without a causal mask.
    tile_order: str = "per_head"
    # Q_QUANTS.
    q_quant: str = "prepare"
    # The persistent grid's last partial wave split along the keys over every SM, the pieces
    # merged by the warp that finishes a tile (variants/wgmma/split_tail.py).
    split_tail: bool = False
    # The query heads of a KV group packed into a tile's rows, so K and V are loaded once per
    # group (variants/wgmma/pack_gqa.py).
    pack_gqa: bool = False
    # longest_first: the tiles dealt in sections of this many (head, batch) pairs, longest first
    # inside each, so the CTAs in flight share those heads' K/V in L2 (variants/wgmma/tiles.py);
    # 0 is one section of every pair.
    head_swizzle: int = 0
    # Exact transforms prepare applies before quantizing (variants/transforms.py,
    # docs/accuracy.md): K smoothing ("off" | "mean") and the Q/K rotation ("none" |
    # "hadamard"). Prepare-only: the attention kernel is the same build; off and none apply no
    # transform.
    k_smoothing: str = "off"
    qk_rotation: str = "none"
    # PV_DTYPES.
    pv_dtype: str = "e4m3"
    # QK_DTYPES.
    qk_dtype: str = "e4m3"
    # K's and V's descales (block_scales.KV_SCALES): one per 64 keys, folded per strip and
    # block into the softmax, or one per (batch, KV head) (FA3's convention, the FP8 entry
    # point's per-head descales): the loader folds K's into Q's row scales and stages V's for
    # the epilogue, no strip scales.
    kv_scales: str = "block"

    @property
    def block_m(self) -> int:
        return ROWS_PER_WG * self.consumer_wgs

    @property
    def threads(self) -> int:
        return WG_THREADS * (self.consumer_wgs + 1)

    @property
    def scale_blocks(self) -> int:
        """64-key K/V scale blocks a strip spans (variants/block_scales.py; a 32-key strip lies
        inside one)."""
        return self.block_n // min(self.block_n, KV_BLOCK)

    @property
    def register_p(self) -> bool:
        return self.p_source == "registers"

    @property
    def v_in_kernel(self) -> bool:
        """V read as (B, S, H, D) and transposed in shared memory by the producer warpgroup."""
        return self.v_layout == "kernel"

    @property
    def v_unquantized(self) -> bool:
        """pv_dtype=bf16: V is the caller's, in bf16, natural layout (prepare casts fp16)."""
        return self.pv_dtype == "bf16"

    @property
    def v_feature_major(self) -> bool:
        return not self.v_in_kernel and not self.v_unquantized

    @property
    def v_key_permuted(self) -> bool:
        # With v_layout=kernel the register-P key order is applied by the in-smem transpose; a
        # 16-bit P's A fragment is the accumulator's own order (no permutation).
        return self.register_p and not self.v_in_kernel and not self.v_unquantized

    @property
    def qk_int8(self) -> bool:
        """Q and K arrive as int8 codes with their block scales, QK^T an s8 wgmma."""
        return self.qk_dtype == "int8"

    @property
    def q_in_kernel(self) -> bool:
        """Q arrives as the caller's bf16 (batch, seq_len, heads, head_dim), quantized per row
        by the consumer warpgroups (the block-scale formula of variants/block_scales.py)."""
        return self.q_quant == "kernel"

    def with_transforms(self, **settings) -> Config:
        """ConfigMixin.with_transforms, with Q quantized by prepare where Q is rotated."""
        cfg = super().with_transforms(**settings)
        if cfg.q_in_kernel and cfg.qk_rotation == "hadamard":
            cfg = dataclasses.replace(cfg, q_quant="prepare")
        return cfg

    def for_q_dtype(self, dtype_name: str) -> Config:
        """The config that reads a q of this torch dtype ("bfloat16", "float16",
        "float8_e4m3fn"): an in-kernel quantization reads bf16 only, so fp16 and FP8 callers
        get the same kernel with Q quantized (or laid out) by prepare; FP8 callers get it with
        prepare's transforms off (ConfigMixin.for_q_dtype) and with e4m3 P.V and QK^T (fp16
        callers keep bf16 P.V and int8 QK^T: prepare casts their V and quantizes their Q and K)."""
        cfg = super().for_q_dtype(dtype_name)
        if cfg.q_in_kernel and dtype_name != "bfloat16":
            cfg = dataclasses.replace(cfg, q_quant="prepare")
        if cfg.v_unquantized and dtype_name == "float8_e4m3fn":
            # The caller's V is e4m3 codes already: the e4m3 P.V kernel reads them.
            cfg = dataclasses.replace(cfg, pv_dtype="e4m3")
        if cfg.qk_int8 and dtype_name == "float8_e4m3fn":
            # The caller's Q and K are e4m3 codes: the e4m3 QK^T kernel reads them.
            cfg = dataclasses.replace(cfg, qk_dtype="e4m3")
        return cfg

    def packed_group(self, problem) -> int:
        """Query heads a tile packs into its rows: the problem's group with pack_gqa, else 1."""
        return problem.group if self.pack_gqa else 1

    def pad_to(self) -> int:
        """Sequence padding prepare applies so every Q tile and K/V strip load is in bounds."""
        return math.lcm(self.block_m, self.block_n)


def space(arch: str) -> dict[str, list]:
    return load_space(FAMILY, arch)


def default(arch: str, problem=None) -> Config:
    """The heuristic default: the rules of variants/wgmma/defaults.py that hold for `problem`
    (docs/family-wgmma.md#defaults has the measurements behind each)."""
    return Config(**apply_rules(RULES, problem))


def seeds(arch: str, problem=None) -> list[Config]:
    """Measured by every search right after the default: the default with Q quantized in the
    other place, since which placement wins moves with the length
    (defaults.Q_IN_KERNEL_UP_TO). The search drops it where it is infeasible: where the default
    rotates Q and K (defaults.ROTATE_FULL_128_FROM, ROTATE_FROM), which Q quantized in the kernel
    cannot."""
    cfg = default(arch, problem)
    other = "prepare" if cfg.q_in_kernel else "kernel"
    return [dataclasses.replace(cfg, q_quant=other)]


def smem_header_bytes(cfg: Config) -> int:
    """The fields below the first 1024-aligned buffer: the mbarriers and the block scales the
    loader stages for the consumers (a strip's K/V scales per stage, a tile's Q row scales),
    rounded up to the alignment: one SMEM_BARRIER_BYTES block, two for three consumer
    warpgroups with V transposed in the kernel and 3-4 stages (432 of the 8424 feasible configs
    at head_dim 128). The kernel checks this estimate against its shared storage at trace time."""
    stages = cfg.kv_stages
    mbarriers = 2 + 2 * stages + 2 * stages + 2 * stages  # q, k, v, the K/V scales
    scale_values = 3 * cfg.scale_blocks * stages
    if cfg.v_in_kernel:
        mbarriers += 2 * stages
    if not cfg.q_in_kernel:
        mbarriers += 2
        scale_values += cfg.block_m + (1 if cfg.kv_head_scales else 0)
    used = 8 * mbarriers + 4 * scale_values
    return max(SMEM_BARRIER_BYTES, -(-used // SMEM_ALIGN) * SMEM_ALIGN)


def pv_bytes(cfg: Config) -> int:
    """Bytes of a P or V element of the P.V GEMM."""
    return 2 if cfg.v_unquantized else 1


def smem_bytes(cfg: Config, head_dim: int) -> int:
    """Shared memory per CTA from the buffers the kernel allocates (fp8: one byte an element;
    P and V two with pv_dtype=bf16)."""
    fields = [cfg.block_m * head_dim,                       # Q tile
              cfg.kv_stages * cfg.block_n * head_dim,       # K ring
              cfg.kv_stages * head_dim * cfg.block_n * pv_bytes(cfg)]  # V ring
    # P tile; with P in registers the kernel still allocates a one-byte field, aligned like
    # every buffer (so one SMEM_ALIGN block).
    fields.append(1 if cfg.register_p else cfg.block_m * cfg.block_n * pv_bytes(cfg))
    if cfg.v_in_kernel:
        fields.append(cfg.kv_stages * cfg.block_n * head_dim)  # V staging ring, as loaded
    if cfg.q_in_kernel:
        fields.append(2 * cfg.block_m * head_dim)  # Q's bf16 staging tile
    return smem_header_bytes(cfg) + sum(-(-f // SMEM_ALIGN) * SMEM_ALIGN for f in fields)


def register_estimate(cfg: Config, head_dim: int) -> int:
    """Live registers per consumer thread at the peak of the K/V loop.

    A warpgroup's 64 x N fp32 accumulator is N/2 registers a thread: S is block_n/2, O is
    head_dim/2. P as fp8 is block_n/8 when it feeds the PV wgmma from registers (block_n/4 as
    bf16, and block_n/8 more beside the next S: _PV16_OVERLAP); with intra-WG overlap it lives
    beside the next strip's S, without it only while S is converted. The rest (row max/sum,
    descriptors, addressing, loop state) is a fixed overhead. The block scales
    (variants/block_scales.py) add Q's scale of each of the thread's two rows and, per 64-key
    block of the strip, K's scale, log2 of V's and 1 / V's (read from shared memory for the
    strip being computed; tests/test_wgmma_compile.py checks for spills).
    """
    live = cfg.block_n // 2 + head_dim // 2
    if cfg.register_p or cfg.intra_wg_overlap:
        live += cfg.block_n * pv_bytes(cfg) // 8
    if cfg.v_unquantized and cfg.register_p and cfg.intra_wg_overlap:
        live += cfg.block_n // _PV16_OVERLAP
    return live + 2 + 3 * cfg.scale_blocks + _REGISTER_OVERHEAD


# Softmax state, wgmma descriptors, pipeline state and addressing (FA3 fits 128 x 224 FP8 tiles
# in 240 registers with overlap and RS: 112 + 28 + 64 + 36).
_REGISTER_OVERHEAD = 32
# bf16 P in registers beside the next strip's S (intra-WG overlap) costs block_n/8 more than
# its block_n/4 (ptxas, sm_90a): without it 2 x 192 keys at head_dim 64 (219 of 240) spill 16 B
# and 1 x 192 at 128 (251 of 256) 512 B; with it 3 x 64 at 128 (157 of 160) and 1 x 192 at 64
# (243 of 256) compile without spills, as do all without overlap or with P from smem
# (tests/test_wgmma_pv16_compile.py).
_PV16_OVERLAP = 8  # block_n / this


# ---- Problem shapes the kernel does not implement yet ------------------------------------------
# One rejection per feature, each lifted on its own (delete its two lines) when the kernel and
# prepare implement it. Problems written before the features existed have none of them set.


def can_implement(cfg: Config, problem, gpu) -> tuple[bool, str | None]:
    """THE statement of the constraints: the search and the runtime both call this."""
    arch = gpu.arch
    d = problem.head_dim
    if arch not in SUPPORTED_ARCHS:
        return False, f"arch {arch} unsupported: FP8 wgmma + TMA need {SUPPORTED_ARCHS}"
    if d not in HEAD_DIMS:
        return False, f"head_dim={d}: one of {HEAD_DIMS}"
    if cfg.consumer_wgs not in REGISTER_SPLIT:
        return False, f"consumer_wgs={cfg.consumer_wgs}: 1, 2 or 3 warpgroups of 64 rows"
    if cfg.p_source not in P_SOURCES:
        return False, f"p_source={cfg.p_source!r} unknown; one of {P_SOURCES}"
    if cfg.v_layout not in V_LAYOUTS:
        return False, f"v_layout={cfg.v_layout!r} unknown; one of {V_LAYOUTS}"
    if cfg.block_n % 32 or not 32 <= cfg.block_n <= 256:
        return False, (f"block_n={cfg.block_n}: a multiple of 32 (the k of the FP8 PV wgmma) "
                       "in 32..256 (the n of the QK wgmma)")
    if cfg.block_n % 64 and cfg.block_n != 32:
        return False, (f"block_n={cfg.block_n}: K's and V's scales cover 64 keys each, so a "
                       "strip holds whole 64-key blocks (a multiple of 64) or lies inside one "
                       "(32)")
    if type(cfg.fma_exp2) is not int or not 0 <= cfg.fma_exp2 <= FMA_EXP2_GROUP:
        return False, (f"fma_exp2={cfg.fma_exp2}: how many of every {FMA_EXP2_GROUP} exponentials "
                       f"run on the FMA pipe, 0..{FMA_EXP2_GROUP}")
    if cfg.tile_order not in TILE_ORDERS:
        return False, f"tile_order={cfg.tile_order!r} unknown; one of {TILE_ORDERS}"
    if cfg.q_quant not in Q_QUANTS:
        return False, f"q_quant={cfg.q_quant!r} unknown; one of {Q_QUANTS}"
    unknown = transforms.check_knobs(cfg.k_smoothing, cfg.qk_rotation)
    if unknown:
        return False, unknown
    if cfg.pv_dtype not in PV_DTYPES:
        return False, f"pv_dtype={cfg.pv_dtype!r} unknown; one of {PV_DTYPES}"
    if cfg.qk_dtype not in QK_DTYPES:
        return False, f"qk_dtype={cfg.qk_dtype!r} unknown; one of {QK_DTYPES}"
    if cfg.kv_scales not in KV_SCALES:
        return False, f"kv_scales={cfg.kv_scales!r} unknown; one of {KV_SCALES}"
    if cfg.kv_head_scales and cfg.q_in_kernel:
        return False, ("kv_scales=head needs q_quant=prepare: the loader folds K's head "
                       "descale into the Q row scales prepare wrote (q_quant=kernel's consumers "
                       "compute those themselves)")
    if cfg.qk_int8 and cfg.q_in_kernel:
        return False, ("qk_dtype=int8 needs q_quant=prepare: q_quant=kernel's in-kernel "
                       "quantization writes e4m3 codes into the Q tile, not int8 ones")
    if cfg.v_unquantized and cfg.v_in_kernel:
        return False, ("pv_dtype=bf16 reads V in its natural layout as the 16-bit wgmma's "
                       "MN-major B operand, so it has nothing to transpose: v_layout=kernel's "
                       "in-smem transpose is for e4m3 V (whose B operand must be K-major); use "
                       "v_layout=prepared")
    if cfg.qk_rotation == "hadamard" and cfg.q_in_kernel:
        return False, ("qk_rotation=hadamard needs q_quant=prepare: with q_quant=kernel the "
                       "attention kernel quantizes the caller's raw bf16 Q itself, so prepare "
                       "cannot rotate Q, and K rotated alone would change QK^T")
    if cfg.kv_stages not in (2, 3, 4):
        return False, f"kv_stages={cfg.kv_stages}: 2, 3 or 4"
    if cfg.pingpong and cfg.consumer_wgs < 2:
        return False, "pingpong alternates two or more consumer warpgroups: consumer_wgs >= 2"
    if type(cfg.split_tail) is not bool:
        return False, f"split_tail={cfg.split_tail!r}: true or false"
    if cfg.split_tail and not cfg.persistent:
        return False, ("split_tail splits the persistent grid's last wave: it needs "
                       "persistent=True (a grid the hardware schedules has no fixed last wave)")
    if cfg.split_tail and problem.causal:
        return False, ("split_tail is for full masks: a causal tail's tiles are of unequal "
                       "length (and with tile_order=longest_first its shortest), so equal "
                       "runs of strips do not apply; use split_tail=False")
    reason = _schedule_reason(cfg, problem)
    if reason:
        return False, reason
    smem = smem_bytes(cfg, d)
    if smem > gpu.smem_per_block:
        v_ring = (f" (V ring in bf16: {cfg.kv_stages * cfg.block_n * d * 2} B, twice e4m3's)"
                  if cfg.v_unquantized else "")
        return False, (f"shared memory {smem} B per CTA > {gpu.smem_per_block} B per block on "
                       f"{gpu.name}{v_ring}")
    regs = register_estimate(cfg, d)
    limit = register_split(cfg)[0]
    if regs > limit:
        p_regs = (f", P in bf16 {cfg.block_n // 4} of them (twice e4m3 P's)"
                  if cfg.v_unquantized else "")
        return False, (f"register estimate {regs} > {limit} per consumer thread (setmaxnreg "
                       f"with {cfg.consumer_wgs} consumer warpgroups{p_regs}): "
                       f"block_n={cfg.block_n} would spill")
    return True, None


def _schedule_reason(cfg: Config, problem) -> str | None:
    """pack_gqa's and head_swizzle's constraints (pack_gqa.py, tiles.py), None when they hold."""
    if type(cfg.pack_gqa) is not bool:
        return f"pack_gqa={cfg.pack_gqa!r}: true or false"
    group = problem.group
    if cfg.pack_gqa and group == 1:
        return (f"pack_gqa packs the query heads that share a KV head; heads={problem.heads} "
                f"on kv_heads={problem.kv_heads} is one a KV head, where pack_gqa=False is the "
                "same kernel")
    if cfg.pack_gqa and (group & (group - 1) or cfg.block_m % group):
        return (f"pack_gqa with {group} query heads per KV head (heads={problem.heads}, "
                f"kv_heads={problem.kv_heads}): a tile packs whole tokens of the group into its "
                f"block_m={cfg.block_m} rows and the accumulator's 8-row steps split evenly over "
                "(group, tokens) only for a power of two dividing block_m; use pack_gqa=False")
    if type(cfg.head_swizzle) is not int or not 0 <= cfg.head_swizzle <= HEAD_SWIZZLE_MAX:
        return (f"head_swizzle={cfg.head_swizzle!r}: (head, batch) pairs per section of the "
                f"tile order, 0..{HEAD_SWIZZLE_MAX} (0: one section)")
    if cfg.head_swizzle and cfg.tile_order != "longest_first":
        return (f"head_swizzle={cfg.head_swizzle} sections longest_first's order; "
                f"tile_order={cfg.tile_order!r} walks one head at a time already: use "
                "head_swizzle=0 or tile_order=longest_first")
    return None
