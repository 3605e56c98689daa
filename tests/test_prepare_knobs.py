"""The prepare-only knobs k_smoothing and qk_rotation in both families (CPU): in the Config, the
spaces and can_implement, off for rows written before them and for FP8 callers, and left out of
the codegen key, so a config differing only in them shares one build (and gets its own prepare);
tuner.attention_fp8 refuses a pinned config that turns one on."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

import tuner
from tuner.errors import TunerError
from tuner.gpus import PROFILES
from tuner.problem import Problem
from variants import build, mma_sync, wgmma

H200, RTX5080 = PROFILES["h200"], PROFILES["5080"]
PROBLEM = Problem(1, 8, 4096, 128)
FAMILIES = {"wgmma": (wgmma, H200, "sm_90a"), "mma_sync": (mma_sync, RTX5080, "sm_120a")}


def _base(name):
    """The default with both transforms off (and Q quantized in prepare, which the rotation
    needs)."""
    family, _, arch = FAMILIES[name]
    return dataclasses.replace(family.default(arch, PROBLEM), k_smoothing="off",
                               qk_rotation="none",
                               **({"q_quant": "prepare"} if name == "wgmma" else {}))


@pytest.mark.parametrize("name", list(FAMILIES))
def test_both_values_are_in_the_space_and_feasible(name):
    family, gpu, arch = FAMILIES[name]
    space = family.space(arch)
    assert space["k_smoothing"] == ["off", "mean"] and space["qk_rotation"] == ["none", "hadamard"]
    default = family.default(arch, PROBLEM)
    # Smoothing everywhere; wgmma rotates too at this length (head_dim 128, full mask).
    rotation = "hadamard" if name == "wgmma" else "none"
    assert (default.k_smoothing, default.qk_rotation) == ("mean", rotation)
    base = _base(name)
    for smoothing in space["k_smoothing"]:
        for rotation in space["qk_rotation"]:
            cfg = dataclasses.replace(base, k_smoothing=smoothing, qk_rotation=rotation)
            assert family.can_implement(cfg, PROBLEM, gpu) == (True, None)


@pytest.mark.parametrize("name", list(FAMILIES))
@pytest.mark.parametrize(("knob", "value"), [("k_smoothing", "median"), ("k_smoothing", False),
                                             ("qk_rotation", "random")])
def test_an_unknown_value_is_refused_naming_the_knob(name, knob, value):
    family, gpu, _ = FAMILIES[name]
    ok, reason = family.can_implement(dataclasses.replace(_base(name), **{knob: value}),
                                      PROBLEM, gpu)
    assert not ok and f"{knob}={value!r} unknown" in reason, reason


def test_the_rotation_with_q_quantized_in_the_kernel_is_refused_saying_why():
    cfg = dataclasses.replace(_base("wgmma"), q_quant="kernel", qk_rotation="hadamard")
    ok, reason = wgmma.can_implement(cfg, PROBLEM, H200)
    assert not ok and "qk_rotation=hadamard needs q_quant=prepare" in reason
    assert "quantizes the caller's raw bf16 Q itself" in reason
    # Smoothing only touches K: Q in the kernel is fine.
    assert wgmma.can_implement(dataclasses.replace(cfg, qk_rotation="none", k_smoothing="mean"),
                               PROBLEM, H200) == (True, None)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_rows_written_before_the_knobs_load_with_them_off(name):
    family, _, _ = FAMILIES[name]
    row = {k: v for k, v in _base(name).to_dict().items()
           if k not in ("k_smoothing", "qk_rotation")}
    cfg = family.Config.from_dict(row)
    assert (cfg.k_smoothing, cfg.qk_rotation) == ("off", "none") and cfg == _base(name)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_fp8_callers_get_the_twin_with_the_transforms_off(name):
    on = dataclasses.replace(_base(name), k_smoothing="mean", qk_rotation="hadamard")
    assert on.transforms_on() == ["k_smoothing='mean'", "qk_rotation='hadamard'"]
    assert on.for_q_dtype("float8_e4m3fn") == _base(name)
    assert on.for_q_dtype("float8_e4m3fn").transforms_on() == []
    assert on.for_q_dtype("float16") == on and on.for_q_dtype("bfloat16") == on
    # wgmma with Q in the kernel: fp8 callers get Q from prepare and the transforms off.
    if name == "wgmma":
        twin = dataclasses.replace(on, q_quant="kernel", qk_rotation="none").for_q_dtype(
            "float8_e4m3fn")
        assert (twin.q_quant, twin.k_smoothing) == ("prepare", "off")


@pytest.mark.parametrize("name", list(FAMILIES))
def test_the_codegen_key_leaves_the_prepare_only_knobs_out(name):
    family, _, arch = FAMILIES[name]
    src = Path(family.__file__).parent
    base = _base(name)
    key = build.codegen_key(name, base, 128, arch, src)
    for knobs in (dict(k_smoothing="mean"), dict(qk_rotation="hadamard"),
                  dict(k_smoothing="mean", qk_rotation="hadamard")):
        assert build.codegen_key(name, dataclasses.replace(base, **knobs), 128, arch, src) == key
    # A knob that reaches code generation still moves it.
    other = dataclasses.replace(base, kv_stages=3)
    assert build.codegen_key(name, other, 128, arch, src) != key


def test_configs_differing_in_the_knobs_share_one_build_and_keep_their_own_prepare(
        monkeypatch, own_build, tmp_path):
    """compile_cached builds once for both (the second finds the build in memory), and each
    kernel object carries its own config, whose prepare applies its transforms."""
    from variants.base import ResourceUsage

    builds = []

    def build_and_save(family, key, src_dir, cfg, head_dim, arch, make_kernel, smem, extra):
        builds.append(key)
        return object(), ResourceUsage(100, 0, 0), 1.0

    monkeypatch.setattr(build, "_build_and_save", build_and_save)
    monkeypatch.setattr(build, "_load_cached", lambda family, key, src_dir: None)
    base = _base("mma_sync")
    smoothed = dataclasses.replace(base, k_smoothing="mean", qk_rotation="hadamard")
    problem = Problem(1, 2, 77, 128)
    src = Path(mma_sync.__file__).parent
    kernels = []
    for cfg in (base, smoothed):
        kernels.append(build.compile_cached("mma_sync", src, cfg, problem, "sm_120a",
                                            make_kernel=lambda: None, smem_bytes=0))
        # The second finds the build where it was written, whatever the cache root is now.
        monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "elsewhere"))
    assert len(builds) == 1 and kernels[0]._fn is kernels[1]._fn
    assert kernels[0].cubin_path == kernels[1].cubin_path
    assert kernels[0].cubin_path.is_relative_to(tmp_path / "mma_sync")
    assert [k.config for k in kernels] == [base, smoothed]
    q, k, v = (torch.randn(1, 77, 2, 128).bfloat16() for _ in range(3))
    plain, transformed = (kernel.prepare(q, k, v) for kernel in kernels)
    assert plain.k_mean is None and not plain.qk_rotated
    assert transformed.k_mean is not None and transformed.qk_rotated


@pytest.mark.parametrize("knobs", [dict(k_smoothing="mean"), dict(qk_rotation="hadamard")])
def test_attention_fp8_refuses_a_pinned_config_with_a_transform(knobs):
    """The codes are quantized already: prepare's transforms cannot apply. Meta tensors pass the
    input checks, so the config's refusal is what is seen (no GPU needed)."""
    cfg = dataclasses.replace(_base("mma_sync"), **knobs)
    q = torch.empty(1, 64, 2, 128, dtype=torch.float8_e4m3fn, device="meta")
    d = torch.empty(1, 2, dtype=torch.float32, device="meta")
    (knob, value), = knobs.items()
    with pytest.raises(TunerError, match=rf"config has {knob}='{value}'.*for_q_dtype"):
        tuner.attention_fp8(q, q, q, d, d, d, config=cfg)


def test_attention_fp8_takes_no_max_error():
    """A stored error is measured from bf16 inputs through prepare, which codes skip: a budget
    there would promise what the lookup cannot know."""
    q = torch.empty(1, 64, 2, 128, dtype=torch.float8_e4m3fn, device="meta")
    d = torch.empty(1, 2, dtype=torch.float32, device="meta")
    with pytest.raises(TypeError, match="max_error"):
        tuner.attention_fp8(q, q, q, d, d, d, max_error=0.1)


def test_no_kernel_source_reads_a_prepare_only_knob():
    """The codegen key leaves the knobs out, which is right only while no attention kernel's
    code reads them: a kernel that starts to must move them into the key."""
    from variants.base import PREPARE_ONLY_KNOBS

    for family in (wgmma, mma_sync):
        src = Path(family.__file__).parent
        for path in sorted(src.glob("*.py")):
            # config.py declares them and can_implement checks them; defaults.py sets them.
            if path.name in ("config.py", "defaults.py"):
                continue
            text = path.read_text()
            assert not [k for k in PREPARE_ONLY_KNOBS if k in text], path
    common = Path(build.__file__).parent / "common"
    assert not [p for p in common.glob("*.py")
                if any(k in p.read_text() for k in PREPARE_ONLY_KNOBS)]
