"""tuner/search/feasible_cache.py: the feasible configs a search starts from are can_implement's
verdicts, judged once per family, problem and GPU and read back from disk after that, the same
dicts in the same order; a damaged or foreign file is judged again."""

import logging

import pytest

from tests.doubles import fake_family_large
from tuner import gpus
from tuner.problem import Problem
from tuner.search import feasible_cache
from tuner.search.feasible_cache import feasible_dicts
from tuner.store import config_hash
from variants import base, load_family

H100 = gpus.PROFILES["h100"]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path))
    return tmp_path / "feasible"


def judged(module, problem, gpu) -> list[dict]:
    return [cfg.to_dict() for cfg, ok, _ in base.judge_space(module, problem, gpu) if ok]


def no_judging(monkeypatch):
    def fail(*_args):
        raise AssertionError("judged again")

    monkeypatch.setattr(base, "judge_space", fail)


@pytest.mark.parametrize("family, problem, gpu", [
    ("mma_sync", Problem(1, 56, 4096, 128), "h100"),
    ("mma_sync", Problem(2, 8, 77, 64, causal=True, seq_len_kv=300, kv_heads=2), "5090"),
    ("wgmma", Problem(1, 32, 8192, 128, causal=True, kv_heads=8), "h100"),
    ("tests.doubles.fake_family_large", Problem(1, 2, 64, 64), "h200"),
])
def test_read_back_the_verdicts_are_the_judged_configs_in_order(cache, monkeypatch, family,
                                                                 problem, gpu):
    module, profile = load_family(family), gpus.PROFILES[gpu]
    want = judged(module, problem, profile)
    hashes = [config_hash(family, c) for c in want]
    assert want and feasible_dicts(family, module, problem, profile) == (want, hashes)
    assert len(list(cache.iterdir())) == 1
    no_judging(monkeypatch)
    got, got_hashes = feasible_dicts(family, module, problem, profile)
    assert got == want and [list(c) for c in got] == [list(c) for c in want]  # key order too
    assert got_hashes == hashes


def test_another_problem_or_gpu_is_judged_for_itself(cache, monkeypatch):
    module = load_family("mma_sync")
    problems = [Problem(1, 8, 4096, 128), Problem(1, 8, 4096, 64), Problem(1, 8, 4096, 128,
                                                                           causal=True)]
    for problem in problems:
        feasible_dicts("mma_sync", module, problem, H100)
    feasible_dicts("mma_sync", module, problems[0], gpus.PROFILES["5090"])
    assert len(list(cache.iterdir())) == 4
    want = judged(module, problems[1], H100)
    no_judging(monkeypatch)
    assert feasible_dicts("mma_sync", module, problems[1], H100)[0] == want


@pytest.mark.parametrize("damage", [b"", b"not zlib", b"\x78\x9c\x03\x00", "truncated",
                                    "a row short", "other knobs", "a hash short", "no hashes"])
def test_a_damaged_file_is_judged_again_and_rewritten(cache, damage):
    import json
    import zlib

    module, problem = fake_family_large, Problem(1, 2, 64, 64)
    family = "tests.doubles.fake_family_large"
    want = feasible_dicts(family, module, problem, H100)
    (path,) = cache.iterdir()
    good = path.read_bytes()
    if damage == "truncated":
        damage = good[:len(good) // 2]
    elif damage in ("a row short", "other knobs", "a hash short", "no hashes"):
        doc = json.loads(zlib.decompress(good))
        if damage == "a row short":
            doc["rows"][-1].pop()
        elif damage == "a hash short":
            doc["hashes"].pop()
        elif damage == "no hashes":
            del doc["hashes"]
        else:
            doc["knobs"][0] = "renamed"
        damage = zlib.compress(json.dumps(doc).encode())
    path.write_bytes(damage)
    assert feasible_dicts(family, module, problem, H100) == want
    assert path.read_bytes() == good


def test_an_unwritable_cache_warns_and_the_configs_are_still_judged(tmp_path, monkeypatch,
                                                                   caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("TUNER_CACHE_DIR", str(blocker))  # feasible/ cannot be made under a file
    module, problem = fake_family_large, Problem(1, 2, 64, 64)
    with caplog.at_level(logging.WARNING, logger=feasible_cache.__name__):
        got, _ = feasible_dicts("tests.doubles.fake_family_large", module, problem, H100)
    assert got == judged(module, problem, H100)
    assert "judges them again" in caplog.text


def test_hashes_of_another_hashing_scheme_are_not_read_back(cache, monkeypatch):
    module, problem = fake_family_large, Problem(1, 2, 64, 64)
    family = "tests.doubles.fake_family_large"
    feasible_dicts(family, module, problem, H100)
    monkeypatch.setattr(feasible_cache, "config_hash", lambda f, c: "v2" + config_hash(f, c))
    configs, hashes = feasible_dicts(family, module, problem, H100)
    assert hashes == ["v2" + config_hash(family, c) for c in configs]
    assert len(list(cache.iterdir())) == 2
