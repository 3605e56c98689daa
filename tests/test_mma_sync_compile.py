"""mma_sync family, compile only (fake pointers, no GPU): representative configs build for sm_120a
and sm_90a and report resources read from the cubin. One build takes about 1 s on a CI core, so
the 2 x 15 + 4 builds here stay about a minute. Which MMA instruction each build issues is
tests/test_mma_sync_sass.py."""

from __future__ import annotations

import dataclasses
import json

import pytest

from tuner.gpus import PROFILES
from tuner.problem import Problem
from variants.mma_sync import Config, can_implement, compile, default, space
from variants.mma_sync.build import cached_resources, codegen_key
from variants.mma_sync.config import smem_bytes

pytestmark = pytest.mark.compile

PROBLEM = Problem(batch=1, heads=4, seq_len=77, head_dim=128)
GPUS = {"sm_120a": PROFILES["5080"], "sm_90a": PROFILES["h200"]}

# Together these cover every value of every knob of the sm_90a space (and, with MXF8 below, of
# the sm_120a space); each is feasible on both the 5080 and the H200.
REPRESENTATIVE = [
    {},  # the default: the seed's final kernel
    dict(p_source="smem"),
    dict(kv_stages=1),
    dict(kv_stages=3),
    dict(q_in_registers=True, block_m=128, warps=8, rows_per_warp=16, p_source="smem"),
    dict(swizzle="chunk_elems"),
    dict(p_source="smem", block_m=64, rows_per_warp=16, kv_stages=3),
    dict(block_m=64, rows_per_warp=16, block_n=64),
    dict(block_m=256, warps=8),
    dict(block_m=128, warps=8, rows_per_warp=16, block_n=128, p_source="smem"),
    dict(block_m=64, rows_per_warp=16, q_in_registers=True, swizzle="chunk_elems", kv_stages=3),
    dict(block_m=128, warps=8, rows_per_warp=16, block_n=64, kv_stages=1),
    dict(block_m=64, rows_per_warp=16, block_n=128, swizzle="chunk_elems"),
    dict(pv_accum="fp16"),
    dict(pv_accum="fp16", block_m=64, rows_per_warp=16, block_n=64, p_source="smem",
         swizzle="chunk_elems"),
    # prepare's transforms: the default's build (no compile of their own, variants/build.py).
    dict(k_smoothing="off", qk_rotation="hadamard"),
]
MXF8 = [dict(mma="mxf8"), dict(mma="mxf8", block_m=64, rows_per_warp=16, block_n=64,
                              p_source="smem", q_in_registers=True)]


def _cfg(arch: str, overrides: dict) -> Config:
    return dataclasses.replace(default(arch, PROBLEM), **overrides)


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "tuner-cache"))


def test_representative_set_covers_every_knob_value():
    for arch in GPUS:
        seen = {knob: set() for knob in space(arch)}
        for overrides in REPRESENTATIVE + (MXF8 if arch == "sm_120a" else []):
            for knob, value in _cfg(arch, overrides).to_dict().items():
                seen[knob].add(value)
        for knob, values in space(arch).items():
            assert set(values) <= seen[knob], (arch, knob)


@pytest.mark.parametrize("arch", sorted(GPUS))
@pytest.mark.parametrize("overrides", REPRESENTATIVE,
                         ids=lambda o: ",".join(map(str, o.values())) or "default")
def test_compiles_with_resources(arch, overrides):
    cfg = _cfg(arch, overrides)
    assert can_implement(cfg, PROBLEM, GPUS[arch]) == (True, None)
    kernel = compile(cfg, PROBLEM, arch)
    res = kernel.resources
    assert 32 <= res.registers <= 255
    assert res.spill_bytes >= 0
    assert res.smem_bytes >= smem_bytes(cfg, PROBLEM.head_dim)
    assert res.smem_bytes <= GPUS[arch].smem_per_block
    assert kernel.config is cfg or kernel.config == cfg
    # Same inputs -> the same object from the memory cache; the disk entry holds the resources.
    assert compile(cfg, PROBLEM, arch) is kernel
    assert cached_resources(cfg, PROBLEM.head_dim, arch) == res


@pytest.mark.parametrize("overrides", MXF8, ids=["default", "64x64-smemP-qreg"])
def test_mxf8_compiles_for_sm120(overrides):
    cfg = _cfg("sm_120a", overrides)
    assert can_implement(cfg, PROBLEM, GPUS["sm_120a"]) == (True, None)
    kernel = compile(cfg, PROBLEM, "sm_120a")
    assert 32 <= kernel.resources.registers <= 255


@pytest.mark.parametrize("overrides", [{}, dict(p_source="smem", swizzle="chunk_elems",
                                              block_m=64, rows_per_warp=16, block_n=64)],
                         ids=["default", "seed-first-kernel"])
def test_compiles_for_sm89(overrides):
    # Ada (RTX 4090, L40S): the first arch with e4m3 mma.sync; 99 KB smem per block like sm_120.
    cfg = _cfg("sm_89", overrides)
    assert can_implement(cfg, PROBLEM, PROFILES["4090"]) == (True, None)
    kernel = compile(cfg, PROBLEM, "sm_89")
    assert 32 <= kernel.resources.registers <= 255
    assert kernel.resources.smem_bytes <= PROFILES["4090"].smem_per_block


@pytest.mark.parametrize("gpu", ["h200", "4090"])
def test_mxf8_rejected_off_sm120(gpu):
    cfg = _cfg("sm_120a", MXF8[0])
    ok, why = can_implement(cfg, PROBLEM, PROFILES[gpu])
    assert not ok and "mxf8" in why


def test_default_has_no_spill_on_sm120():
    kernel = compile(default("sm_120a", PROBLEM), PROBLEM, "sm_120a")
    assert kernel.resources.spill_bytes == 0


def test_disk_entry_and_key(tmp_path_factory):
    cfg = default("sm_120a", PROBLEM)
    kernel = compile(cfg, PROBLEM, "sm_120a")
    key = codegen_key(cfg, PROBLEM.head_dim, "sm_120a")
    assert key != codegen_key(cfg, PROBLEM.head_dim, "sm_90a")
    assert key != codegen_key(dataclasses.replace(cfg, kv_stages=3), PROBLEM.head_dim, "sm_120a")
    assert key != codegen_key(dataclasses.replace(cfg, pv_accum="fp16"), PROBLEM.head_dim,
                              "sm_120a")
    entry = tmp_path_factory.getbasetemp() / "tuner-cache" / "mma_sync" / key
    meta = json.loads((entry / "meta.json").read_text())
    assert meta["resources"]["registers"] == kernel.resources.registers
    assert (entry / "kernel.cubin").read_bytes()[:4] == b"\x7fELF"
    # Another problem of the same head_dim reuses the compiled function.
    other = compile(cfg, Problem(batch=2, heads=56, seq_len=30272), "sm_120a")
    assert other._fn is kernel._fn and other.problem != kernel.problem
