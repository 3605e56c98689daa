"""benchmarks/cubin_hashes.py, the before/after check of a refactor that must keep the generated
code: its sample holds every knob value of each family, arch and problem kind, and its check
fails on a changed SASS, passes on a cubin that differs in names only, and names what is gone."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest

from tuner.problem import Problem
from variants import load_family

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "cubin_hashes.py"


@pytest.fixture(scope="module")
def ch():
    spec = importlib.util.spec_from_file_location("cubin_hashes", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("family,arch", [("wgmma", "sm_90a"), ("mma_sync", "sm_90a"),
                                         ("mma_sync", "sm_120a")])
def test_the_sample_holds_every_feasible_knob_value_of_every_problem_kind(ch, family, arch,
                                                                          monkeypatch):
    from tuner.gpus import PROFILES
    from variants import base

    # The sample and this test judge the same spaces (wgmma's: 3.5M configs each): once.
    seen = {}
    real = base.judge_space

    def judge_space(fam, problem, gpu):
        key = (fam.__name__, problem, gpu.name)
        if key not in seen:
            seen[key] = [(c, ok, r) for c, ok, r in real(fam, problem, gpu) if ok]
        return iter(seen[key])

    monkeypatch.setattr(base, "judge_space", judge_space)
    fam = load_family(family)
    pairs = ch.sample(fam, arch)
    gpu = PROFILES[ch.GPU_OF_ARCH[arch]]
    for head_dim, causal in ch.PROBLEM_KINDS:
        problem = Problem(1, 2, ch.SEQ_LEN, head_dim=head_dim, causal=causal)
        feasible = [c for c, ok, _ in judge_space(fam, problem, gpu) if ok]
        wanted = {(f.name, getattr(c, f.name)) for c in feasible
                  for f in dataclasses.fields(c)}
        sampled = [c for p, c in pairs if p == problem]
        assert sampled[0] == fam.default(arch, problem)
        assert set(sampled) <= set(feasible)
        got = {(f.name, getattr(c, f.name)) for c in sampled for f in dataclasses.fields(c)}
        assert got == wanted, wanted - got
    assert len(pairs) == len(set(pairs))


def test_the_cover_adds_configs_until_every_value_is_there(ch):
    @dataclasses.dataclass(frozen=True)
    class C:
        a: int
        b: str

    feasible = [C(1, "x"), C(2, "x"), C(1, "y"), C(3, "y")]
    configs = ch.cover(feasible, C(1, "x"))
    assert configs[0] == C(1, "x")
    assert {c.a for c in configs} == {1, 2, 3} and {c.b for c in configs} == {"x", "y"}
    assert len(configs) == 3  # C(3, "y") brings two new values at once


def test_the_check_fails_on_other_sass_and_passes_on_renamed_symbols(ch, capsys):
    saved = {"k1": {"cubin": "a", "sass": "s1"}, "k2": {"cubin": "b", "sass": "s2"}}
    assert ch.check(saved, dict(saved)) == 0
    assert ch.check(saved, {"k1": {"cubin": "A", "sass": "s1"}, "k2": saved["k2"]}) == 0
    assert "by SASS only" in capsys.readouterr().out
    assert ch.check(saved, {"k1": {"cubin": "a", "sass": "S1"}, "k2": saved["k2"]}) == 1
    assert "SASS DIFFERS k1" in capsys.readouterr().out
    assert ch.check(saved, {"k1": saved["k1"]}) == 1
    assert "MISSING k2" in capsys.readouterr().out


def test_the_sass_digest_ignores_the_kernel_symbols_names(ch, monkeypatch):
    import variants.cubin

    listing = "\t.text.kernel_cutlass_kernel_{0}_x:\n  MOV R1, c[0x0][0x28] ;\n"
    monkeypatch.setattr(variants.cubin, "disassemble", lambda blob: listing.format(blob.decode()))
    assert ch.sass_digest(b"variantswgmmakernelA") == ch.sass_digest(b"variantsotherB")
    monkeypatch.setattr(variants.cubin, "disassemble",
                        lambda blob: listing.format("A").replace("R1", blob.decode()))
    assert ch.sass_digest(b"R1") != ch.sass_digest(b"R2")
