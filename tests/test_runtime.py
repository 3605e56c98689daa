"""load_best_config: lookup order, nearest bucket, once-per-key fallback log, cache invalidation."""

import logging

import pytest

from tuner import runtime
from tuner.gpus import PROFILES
from tuner.problem import Problem
from tuner.store import Store, TrialRecord
from variants import mma_sync

DEVICE = "dev-h200"
SEED_CFG = mma_sync.default("sm_90a")
ALT_CFG = mma_sync.Config(block_m=64, block_n=64, warps=4, rows_per_warp=16, kv_stages=2,
                          p_source="smem", swizzle="bank_period", q_in_registers=False, mma="fp8")


@pytest.fixture
def db(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'tuner.sqlite'}"
    monkeypatch.setattr(runtime, "_local_gpu_and_device", lambda gpu: (PROFILES["h200"], DEVICE))
    monkeypatch.setattr(runtime, "TABLES_DIR", tmp_path / "tables")
    runtime.clear_cache()
    store = Store(url)
    store.record_device(DEVICE, {"name": "NVIDIA H200", "compute_capability": "9.0",
                                 "sm_count": 132})
    yield url, store
    store.close()
    runtime.clear_cache()


def add_winner(store, seq_len, cfg, heads=56, head_dim=128, ms=1.0):
    problem = Problem(1, heads, seq_len, head_dim)
    trial_id = store.record_trial(TrialRecord(
        id=None, device_id=DEVICE, problem_key=problem.key(), family_set="mma_sync",
        family="mma_sync", config=cfg.to_dict(), config_hash="x", outcome="ok", median_ms=ms))
    store.set_best(DEVICE, problem, "mma_sync", trial_id, None, None)


def test_exact_then_nearest_on_a_log_scale(db):
    url, store = db
    add_winner(store, 1024, ALT_CFG)
    add_winner(store, 8192, SEED_CFG)
    exact = runtime.load_best_config(8192, heads=56, db=url, with_source=True)
    assert (exact.source, exact.config, exact.family) == ("db-exact", SEED_CFG, "mma_sync")
    # log(3000/1024) = 1.07 > log(8192/3000) = 1.00: 8192 is nearer, though 1024 is nearer linearly
    near = runtime.load_best_config(3000, heads=56, db=url, with_source=True)
    assert (near.source, near.tuned_seq_len, near.config) == ("db-nearest", 8192, SEED_CFG)
    assert runtime.load_best_config(2000, heads=56, db=url) == ALT_CFG
    # A plain call returns the family's Config itself.
    assert isinstance(runtime.load_best_config(8192, db=url), mma_sync.Config)


def test_head_dim_must_match_and_other_heads_fall_back_by_work(db):
    url, store = db
    add_winner(store, 4096, ALT_CFG, heads=56)
    # No winner with 8 heads: the nearest by work, named as such, not the default.
    other_heads = runtime.load_best_config(4096, heads=8, db=url, with_source=True)
    assert (other_heads.source, other_heads.config) == ("db-nearest-work", ALT_CFG)
    other_dim = runtime.load_best_config(4096, heads=8, head_dim=64, db=url, with_source=True)
    assert other_dim.source == "default"
    other_dim = runtime.load_best_config(4096, head_dim=64, db=url, with_source=True)
    assert other_dim.source == "default"
    # Without heads, any heads count matches.
    assert runtime.load_best_config(4096, db=url, with_source=True).source == "db-exact"


def test_shipped_table_comes_before_the_default(db, tmp_path):
    url, _ = db
    from tests.doubles.tables import write_table

    (tmp_path / "tables").mkdir()
    entries = [{"problem": Problem(1, 56, 16384).to_dict(), "family": "mma_sync",
                "config": ALT_CFG.to_dict(), "median_ms": 5.0}]
    write_table(tmp_path / "tables", entries)
    best = runtime.load_best_config(16384, heads=56, db=url, with_source=True)
    assert (best.source, best.config) == ("table-exact", ALT_CFG)
    assert runtime.load_best_config(30272, db=url, with_source=True).source == "table-nearest"


def test_fallback_is_logged_once_per_key(db, caplog):
    url, _ = db
    with caplog.at_level(logging.WARNING, logger="tuner.runtime"):
        for _ in range(3):
            runtime.load_best_config(4096, heads=56, db=url)
        runtime.load_best_config(8192, heads=56, db=url)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2
    assert "b1-h56-s4096" in messages[0] and "default" in messages[0]


def test_cache_sees_a_new_winner_and_skips_the_db_otherwise(db, monkeypatch):
    url, store = db
    add_winner(store, 4096, SEED_CFG)
    assert runtime.load_best_config(4096, db=url) == SEED_CFG
    opened = []
    real_store = runtime._Resolver._candidates

    def counting(self, *args):
        opened.append(1)
        return real_store(self, *args)

    monkeypatch.setattr(runtime._Resolver, "_candidates", counting)
    for _ in range(5):
        assert runtime.load_best_config(4096, db=url) == SEED_CFG
    assert opened == []  # memoized: no database read while nothing changed
    add_winner(store, 4096, ALT_CFG)  # a new search result lands
    assert runtime.load_best_config(4096, db=url) == ALT_CFG
    assert opened == [1]


def test_infeasible_stored_winner_is_skipped_with_the_reason(db, monkeypatch, caplog):
    url, store = db
    add_winner(store, 4096, ALT_CFG)
    # The same database read on a GPU whose limits reject the stored config (as a 5080 would
    # reject an H200-sized tile): the lookup must not hand it out.
    monkeypatch.setattr(runtime, "_local_gpu_and_device",
                        lambda gpu: (PROFILES["4090"], DEVICE))
    monkeypatch.setattr(mma_sync, "can_implement",
                        lambda cfg, p, gpu: (cfg != ALT_CFG, "planted: too much shared memory"))
    with caplog.at_level(logging.WARNING, logger="tuner.runtime"):
        best = runtime.load_best_config(4096, db=url, with_source=True)
    assert best.source == "default" and best.config != ALT_CFG
    assert "planted: too much shared memory" in best.detail
    assert "planted" in caplog.text


def test_family_of():
    assert runtime.family_of(SEED_CFG) == "mma_sync"
    with pytest.raises(Exception, match="not a kernel family"):
        runtime.family_of(Problem(1, 1, 1))


def test_a_q_quant_kernel_config_runs_its_prepare_twin_for_fp16_and_fp8_q(monkeypatch):
    """The plan of a shape gives the pinned config to bf16 q as it is; fp16 and e4m3 q (which
    the in-kernel quantization does not read) get the same kernel with q quantized or laid out
    by prepare, each dtype its own plan."""
    import dataclasses as dc

    import torch

    from tuner.ops import config_key
    from variants import wgmma

    pinned = dc.replace(wgmma.default("sm_90a"), q_quant="kernel")
    built = []
    monkeypatch.setattr(runtime, "_kernel_for",
                        lambda family, config, problem, gpu: built.append(config) or config)
    monkeypatch.setattr(runtime, "_PLANS", {})
    text = config_key(pinned)
    for dtype in (torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.bfloat16):
        q = torch.empty(1, 64, 2, 128, dtype=dtype)
        runtime.attention_plan(q, q, False, text, "h200", None)
    # fp16: Q from prepare; fp8 codes: that and the transforms off; the second bf16: planned.
    assert built == [pinned, dc.replace(pinned, q_quant="prepare"),
                     dc.replace(pinned, q_quant="prepare", k_smoothing="off")]


@pytest.mark.parametrize("gpu", ["h100", "h200"])
def test_each_shipped_table_serves_its_own_gpu(tmp_path, monkeypatch, gpu):
    """On an H100 the lookup reads db/tables/h100.yaml (not the H200's), and each row it
    ships is a config its family can run on that GPU."""
    import yaml

    from variants import load_family

    doc = yaml.safe_load((runtime.TABLES_DIR / f"{gpu}.yaml").read_text())
    assert doc["gpu"] == gpu
    monkeypatch.setattr(runtime, "_local_gpu_and_device", lambda _: (PROFILES[gpu], f"dev-{gpu}"))
    runtime.clear_cache()
    url = f"sqlite:///{tmp_path / 'empty.sqlite'}"
    for problem, family, config, _ in runtime.table_entries(PROFILES[gpu]):
        if problem.seq_len_kv != problem.seq_len or problem.kv_heads != problem.heads \
                or problem.causal:
            continue  # the lookup below names self-attention problems
        best = runtime.load_best_config(problem.seq_len, heads=problem.heads,
                                        batch=problem.batch, head_dim=problem.head_dim, db=url,
                                        with_source=True)
        assert best.source == "table-exact", (gpu, problem)
        module = load_family(family)
        cfg, _ = runtime.config_from_row(module, config, problem, PROFILES[gpu])
        assert best.config.to_dict() == cfg.to_dict()
    runtime.clear_cache()
