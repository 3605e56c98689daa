"""mma_sync family, compile only: the machine code issues the MMA instruction each knob promises.

Each config is built for the target with fake tensors and its cubin disassembled with nvdisasm
(the dev extra's nvidia-cuda-nvdisasm wheel). What the sm_120a SASS shows, pinned here (ptxas of
nvidia-cutlass-dsl 4.8.1):
  mma=fp8,  pv_accum=fp32   QMMA.16832.F32.E4M3.E4M3        for Q K^T and for P V
  mma=mxf8                  QMMA.SF.16832.F32.E4M3.E4M3.E8  (block-scaled, UE8M0 scales: .SF,
                                                             .E8) for Q K^T, and P V with fp32
  pv_accum=fp16             QMMA.16832.F16.E4M3.E4M3        (f16 accumulate) for P V
Q K^T issues m_tiles * (block_n / 8) * (head_dim / 32) MMAs a strip and P V m_tiles *
(head_dim / 8) * (block_n / 32): both m_tiles * block_n * head_dim / 256, and ptxas emits the
unrolled loop body once, so each opcode's count is that number (or twice it when both GEMMs share
the opcode). A count of 0 for the promised opcode, or any other MMA opcode, fails.

The published rates behind the knobs (variants/mma_sync/config.py): on GeForce Blackwell FP8 with
FP32 accumulate issues at half rate, FP16 accumulate and block-scaled MXF8 at full rate. The test
proves which instruction is issued, not its speed: no sm_120 GPU ran any of this.

Also: no local-memory traffic (no LDL/STL, frame size 0) for the configs the seed found spill-free,
128 x 32 tiles with register P and the bank-period swizzle, at every kv_stages and MMA path.
"""

from __future__ import annotations

import dataclasses
import os
from collections import Counter

import pytest

from tuner.gpus import PROFILES
from tuner.problem import Problem
from variants.cubin import disassemble, local_memory_ops, mma_class, mma_opcodes, nvdisasm_path
from variants.mma_sync import Config, can_implement, compile, default

pytestmark = pytest.mark.compile

PROBLEM = Problem(batch=1, heads=4, seq_len=77, head_dim=128)
FP8_F32 = "QMMA.16832.F32.E4M3.E4M3"
MXF8_F32 = "QMMA.SF.16832.F32.E4M3.E4M3.E8"
FP8_F16 = "QMMA.16832.F16.E4M3.E4M3"

# The seed's spill-free class (seed-kernel.md: 32 rows/warp needs block_n 32; the bank-period
# swizzle removed its last spill, 255 -> 244 registers), every stage count and MMA path.
SPILL_FREE = [dict(kv_stages=s, mma=m, pv_accum=a)
              for s in (1, 2, 3) for m in ("fp8", "mxf8") for a in ("fp32", "fp16")]
# Other tile shapes (other MMA counts) and P through shared memory.
OTHER_SHAPES = [
    dict(block_m=64, rows_per_warp=16, block_n=64, p_source="smem", pv_accum="fp16"),
    dict(block_m=128, warps=8, rows_per_warp=16, block_n=128, p_source="smem", pv_accum="fp16"),
    dict(block_m=128, warps=8, rows_per_warp=16, block_n=128, p_source="smem", mma="mxf8"),
    dict(block_m=64, rows_per_warp=16, block_n=64, q_in_registers=True),
]


@pytest.fixture(scope="module")
def nvdisasm():
    tool = nvdisasm_path()
    if tool is None:
        reason = ("nvdisasm not found: pip install -e '.[dev]' (nvidia-cuda-nvdisasm) or put a "
                  "CUDA toolkit on PATH")
        if os.environ.get("CI"):
            pytest.fail(reason + " (CI installs the dev extra, so this is a broken setup)")
        pytest.skip(reason)
    return tool


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "tuner-cache"))


def _cfg(arch: str, overrides: dict) -> Config:
    return dataclasses.replace(default(arch, PROBLEM), **overrides)


def _sass(cfg: Config, arch: str) -> tuple[str, object]:
    kernel = compile(cfg, PROBLEM, arch)
    return disassemble(kernel.cubin_path.read_bytes()), kernel


def promised_opcodes(cfg: Config, head_dim: int) -> Counter:
    """The sm_120a MMA opcodes a config promises, with their counts (module docstring)."""
    per_gemm = cfg.m_tiles * cfg.block_n * head_dim // 256
    qk = MXF8_F32 if cfg.mma == "mxf8" else FP8_F32
    pv = FP8_F16 if cfg.pv_accum == "fp16" else qk
    return Counter({qk: per_gemm}) + Counter({pv: per_gemm})


def _ids(o: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in o.items())


@pytest.mark.parametrize("overrides", SPILL_FREE + OTHER_SHAPES, ids=_ids)
def test_sm120_sass_issues_the_promised_mma(nvdisasm, overrides):
    cfg = _cfg("sm_120a", overrides)
    assert can_implement(cfg, PROBLEM, PROFILES["5080"]) == (True, None)
    sass, _ = _sass(cfg, "sm_120a")
    assert mma_opcodes(sass) == promised_opcodes(cfg, PROBLEM.head_dim), mma_class(
        mma_opcodes(sass))


@pytest.mark.parametrize("overrides", SPILL_FREE, ids=_ids)
def test_seed_spill_free_class_has_no_local_memory(nvdisasm, overrides):
    cfg = _cfg("sm_120a", overrides)
    sass, kernel = _sass(cfg, "sm_120a")
    assert kernel.resources.spill_bytes == 0
    assert local_memory_ops(sass) == 0
    assert kernel.resources.registers <= 255


@pytest.mark.parametrize("arch, opcode", [
    ("sm_89", FP8_F16),
    # Hopper has no FP8 mma.sync in hardware: ptxas emulates it with f16 HMMA m16n8k16, and the
    # f16-accumulate form becomes HMMA.16816.F16 (what the H200 tests then run).
    ("sm_90a", "HMMA.16816.F16"),
])
def test_pv_accum_fp16_issues_f16_accumulate_off_sm120(nvdisasm, arch, opcode):
    sass, _ = _sass(_cfg(arch, dict(pv_accum="fp16")), arch)
    ops = mma_opcodes(sass)
    assert ops[opcode] > 0, mma_class(ops)
    fp32 = mma_opcodes(_sass(_cfg(arch, {}), arch)[0])
    assert fp32[opcode] == 0, mma_class(fp32)


def test_mma_class_label():
    ops = Counter({FP8_F16: 32, MXF8_F32: 32})
    assert mma_class(ops) == "QMMA.F16 x32 + QMMA.SF.F32.E8 x32"
    sass = f"/*0100*/ {MXF8_F32} R4, R8, R12, R4, R2, R3 ;\n/*0110*/ STL [R1], R2 ;\n"
    assert mma_opcodes(sass) == Counter({MXF8_F32: 1})
    assert local_memory_ops(sass) == 1
