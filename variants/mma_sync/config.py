"""Knobs, search space, default and the constraint set of the mma_sync family."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from variants import transforms
from variants.base import ConfigMixin, load_space
from variants.block_scales import KV_BLOCK
from variants.defaults import apply_rules
from variants.mma_sync.defaults import RULES

FAMILY = "mma_sync"
P_SOURCES = ("smem", "registers")
SWIZZLES = ("bank_period", "chunk_elems")
MMAS = ("fp8", "mxf8")
PV_ACCUMS = ("fp32", "fp16")
# The block-scaled kind::mxf8 mma.sync exists on sm_120 only (GeForce / RTX PRO Blackwell).
MXF8_ARCHS = ("sm_120a",)
# mma.sync with .e4m3 operands needs sm_89 or later.
SUPPORTED_ARCHS = ("sm_89", "sm_90a", "sm_120a")
# mma.sync m16n8k32 .f16.e4m3.e4m3.f16 (f16 accumulate) exists wherever the .f32 form does:
# ptxas 13 builds it for sm_89, sm_90a (emulated there, like the f32 form) and sm_120a.
PV_FP16_ARCHS = SUPPORTED_ARCHS
MAX_REGISTERS = 255
# Smem bytes one struct field may lose to its 1024-byte alignment (the swizzle atom's span).
SMEM_ALIGN = 1024


@dataclass(frozen=True)
class Config(ConfigMixin):
    block_m: int
    block_n: int
    warps: int
    rows_per_warp: int
    kv_stages: int
    p_source: str
    swizzle: str
    q_in_registers: bool
    mma: str
    # The default is the build a stored config without this knob names, so such configs load.
    pv_accum: str = "fp32"
    # Exact transforms prepare applies before quantizing (variants/transforms.py,
    # docs/accuracy.md): K smoothing ("off" | "mean") and the Q/K rotation ("none" |
    # "hadamard"). Prepare-only: the attention kernel is the same build; off and none (no
    # transform) are what a stored config without these knobs names.
    k_smoothing: str = "off"
    qk_rotation: str = "none"

    # Where P comes from has one name in both families (wgmma's); rows written before load.
    RENAMED_KNOBS: ClassVar[dict[str, str]] = {"p_staging": "p_source"}

    @property
    def threads(self) -> int:
        return self.warps * 32

    @property
    def m_tiles(self) -> int:
        """m16 MMA tiles per warp."""
        return self.rows_per_warp // 16

    @property
    def register_p(self) -> bool:
        """P stays in registers, so prepare stores V in the register-P key order."""
        return self.p_source == "registers"

    @property
    def p_shift_log2(self) -> int:
        """log2 of the largest P (the row max key's weight): P = 2^(s - m + p_shift_log2)."""
        return p_shift_log2(self.pv_accum, self.block_n)

    def pad_to(self) -> int:
        """Sequence padding prepare must apply so every Q tile and K/V strip load is in bounds."""
        return math.lcm(self.block_m, self.block_n)


# P = exp(s - m) * 2^shift is rounded to e4m3 and multiplied by V's e4m3 codes (|v| <= 448).
# fp32: shift 8 (P in [0, 256], the seed's scale), far from any fp32 limit.
# fp16: each strip's P @ V is summed by f16-accumulate MMAs into a fresh f16 accumulator, so the
# strip sum must stay below fp16's largest finite value 65504. Every P <= 2^shift (the running
# max m is at least the strip's max; e4m3 rounding is monotone and 2^shift is exact), so every
# partial sum of the strip is bounded by block_n * 2^shift * 448 (all keys tied at the max, V
# saturated). Hence shift = floor(log2(65504 / (448 * block_n))): 2, 1, 0 for block_n 32, 64, 128
# (P <= 4, 2, 1), bound 57344 each. The margin 65504 / 57344 covers the fp32 cancellation in the
# exponent (x - (x - shift) may exceed shift by an ulp of x) until |score * log2 e| ~ 1e6: the
# max key's P still rounds to 2^shift in e4m3 below 2^shift * (1 + 2^-4).
FP16_MAX = 65504.0
E4M3_MAX = 448.0
P_SHIFT_LOG2_FP32 = 8


def p_shift_log2(pv_accum: str, block_n: int) -> int:
    if pv_accum == "fp16":
        return math.floor(math.log2(FP16_MAX / (E4M3_MAX * block_n)))
    return P_SHIFT_LOG2_FP32


def space(arch: str) -> dict[str, list]:
    return load_space(FAMILY, arch)


def default(arch: str, problem=None) -> Config:
    """The heuristic default: the rules of variants/mma_sync/defaults.py that hold for
    `problem` (docs/family-mma_sync.md#defaults has the measurements behind each)."""
    return Config(**apply_rules(RULES, problem))


def smem_bytes(cfg: Config, head_dim: int) -> int:
    """Shared memory per CTA from the layouts the kernel allocates (fp8: one byte an element)."""
    fields = [cfg.block_m * head_dim,                       # Q tile
              cfg.kv_stages * cfg.block_n * head_dim,       # K ring
              cfg.kv_stages * head_dim * cfg.block_n]       # V ring (feature-major)
    if cfg.p_source == "smem":
        fields.append(cfg.block_m * cfg.block_n)            # P tile
    return sum(-(-f // SMEM_ALIGN) * SMEM_ALIGN for f in fields)


def register_estimate(cfg: Config, head_dim: int) -> int:
    """Registers per thread: live fragments plus a fixed overhead fitted to ptxas counts.

    Per warp and m16 tile, the O accumulator is head_dim/2 fp32 registers and the S accumulator
    block_n/2; P as fp8 is a quarter of S; a resident Q fragment adds head_dim/8. K and V
    fragments of one k-block (block_n/4 and head_dim/4), softmax state and addressing form the
    overhead term. pv_accum=fp16 adds no term: its f16 accumulator covers 16 head_dim columns at
    a time (4 registers per m16 tile), and over the 272 fp16 configs of the sm_120a space ptxas
    uses -37 to +24 registers against each one's fp32 twin, never keeps local memory where the
    twin has none, and drops it in 21 that have it (the seed default: 246 -> 255 registers, no
    local memory; docs/family-mma_sync.md).
    """
    t = cfg.m_tiles
    live = t * head_dim // 2 + t * cfg.block_n // 2 + t * cfg.block_n // 8
    live += t * head_dim // 8 if cfg.q_in_registers else t * 4
    live += cfg.block_n // 4 + head_dim // 4 + 4 * t
    return live + _REGISTER_OVERHEAD


# Addressing, loop state and scheduling slack, fitted to ptxas 13 counts for sm_120a over the whole
# space (`tuner space --gpu 5080 --compile`). With 28, accepted configs top out at 32 rows/warp with
# 32-key strips (estimate 252, ptxas 246-255 registers; the seed default 246 with no local memory,
# 10 of 48 others 8-48 B of it) and 128-key strips with 16 rows/warp (estimate 244, 230-255
# registers, 20 of 32 with 8-104 B of local memory; docs/family-mma_sync.md). Everything
# rejected (resident Q with 32 rows/warp or
# 128-key strips, 64-key strips with 32 rows/warp) spills 8 to 600 B. The search sees each
# candidate's spill bytes; an sm_120 GPU should decide whether small frames cost anything.
_REGISTER_OVERHEAD = 28


# ---- Problem shapes the kernel does not implement yet ------------------------------------------
# One rejection per feature, each lifted on its own (delete its two lines) when the kernel and
# prepare implement it. Problems written before the features existed have none of them set.


def can_implement(cfg: Config, problem, gpu) -> tuple[bool, str | None]:
    """THE statement of the constraints: the search and the runtime both call this."""
    arch = gpu.arch
    d = problem.head_dim
    if arch not in SUPPORTED_ARCHS:
        return False, f"arch {arch} unsupported: mma.sync e4m3 needs one of {SUPPORTED_ARCHS}"
    if cfg.mma not in MMAS:
        return False, f"mma={cfg.mma!r} unknown; one of {MMAS}"
    if cfg.mma == "mxf8" and arch not in MXF8_ARCHS:
        return False, f"mma=mxf8 (block-scaled kind::mxf8) exists only on {MXF8_ARCHS}, not {arch}"
    if cfg.pv_accum not in PV_ACCUMS:
        return False, f"pv_accum={cfg.pv_accum!r} unknown; one of {PV_ACCUMS}"
    if cfg.pv_accum == "fp16" and arch not in PV_FP16_ARCHS:
        return False, (f"pv_accum=fp16 (mma.sync .f16.e4m3.e4m3.f16) exists only on "
                       f"{PV_FP16_ARCHS}, not {arch}")
    if cfg.p_source not in P_SOURCES:
        return False, f"p_source={cfg.p_source!r} unknown; one of {P_SOURCES}"
    unknown = transforms.check_knobs(cfg.k_smoothing, cfg.qk_rotation)
    if unknown:
        return False, unknown
    if cfg.swizzle not in SWIZZLES:
        return False, f"swizzle={cfg.swizzle!r} unknown; one of {SWIZZLES}"
    if cfg.rows_per_warp not in (16, 32):
        return False, f"rows_per_warp={cfg.rows_per_warp}: one or two m16 tiles, so 16 or 32"
    if cfg.warps not in (2, 4, 8):
        return False, f"warps={cfg.warps}: 2, 4 or 8"
    if cfg.block_m != cfg.warps * cfg.rows_per_warp:
        return False, (f"block_m={cfg.block_m} != warps*rows_per_warp="
                       f"{cfg.warps * cfg.rows_per_warp}")
    if cfg.block_n % 32 or cfg.block_n > 128:
        return False, f"block_n={cfg.block_n}: a multiple of 32 (the P @ V k-step), at most 128"
    if cfg.block_n % KV_BLOCK and KV_BLOCK % cfg.block_n:
        return False, (f"block_n={cfg.block_n}: K's and V's scales cover {KV_BLOCK} keys each, "
                       f"so a strip holds whole {KV_BLOCK}-key blocks or lies inside one")
    if cfg.kv_stages not in (1, 2, 3):
        return False, f"kv_stages={cfg.kv_stages}: 1, 2 or 3"
    if d % 32:
        return False, f"head_dim={d}: a multiple of 32 (the Q @ K^T k-step)"
    # cp.async: 16 bytes a thread, whole rows per pass of the thread block.
    rows_per_pass_qk = cfg.threads // (d // 16)
    if cfg.block_n % rows_per_pass_qk or cfg.block_m % rows_per_pass_qk:
        return False, (f"cp.async tiling: {cfg.threads} threads copy {rows_per_pass_qk} rows of "
                       f"{d} B a pass; block_m={cfg.block_m} and block_n={cfg.block_n} must be "
                       "multiples")
    rows_per_pass_v = cfg.threads // (cfg.block_n // 16)
    if d % rows_per_pass_v:
        return False, (f"cp.async tiling: {cfg.threads} threads copy {rows_per_pass_v} V rows of "
                       f"{cfg.block_n} B a pass; head_dim={d} must be a multiple")
    smem = smem_bytes(cfg, d)
    if smem > gpu.smem_per_block:
        return False, (f"shared memory {smem} B per CTA > {gpu.smem_per_block} B per block on "
                       f"{gpu.name}")
    regs = register_estimate(cfg, d)
    if regs > MAX_REGISTERS:
        return False, (f"register estimate {regs} > {MAX_REGISTERS} per thread (would spill): "
                       f"rows_per_warp={cfg.rows_per_warp} with block_n={cfg.block_n}")
    return True, None
