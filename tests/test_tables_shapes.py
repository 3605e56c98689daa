"""Tables and the commands that read winners (show, export) with causal, cross-attention and
grouped-KV-head problems: a table written by schema version 2 (before those fields) gives the
same winners, a table of an unknown version changes nothing, and show/export filter by them."""

import json

import pytest
import yaml

from tuner.cli import main
from tuner.gpus import fingerprint_id
from tuner.problem import Problem
from tuner.store import Store, TrialRecord
from tuner.tables import TableError, build_table, dump_table, entries_digest, import_table
from variants import mma_sync

FINGERPRINT = {"name": "NVIDIA H200", "compute_capability": "9.0", "sm_count": 132}
DEVICE = fingerprint_id(FINGERPRINT)
SEED = mma_sync.default("sm_90a")
SMALL = mma_sync.Config(block_m=64, block_n=64, warps=4, rows_per_warp=16, kv_stages=2,
                        p_source="smem", swizzle="bank_period", q_in_registers=False, mma="fp8")
SHAPED = [
    (Problem(1, 56, 4096), SMALL, 0.91),
    (Problem(1, 56, 8192, causal=True), SEED, 1.0),
    (Problem(1, 32, 8192, causal=True, kv_heads=8), SEED, 0.58),
    (Problem(1, 32, 16384, kv_heads=8), SMALL, 4.4),
    (Problem(1, 40, 75600, seq_len_kv=512), SEED, 9.5),
]


def shaped_store(url, entries=SHAPED) -> Store:
    store = Store(url)
    store.record_device(DEVICE, FINGERPRINT)
    for problem, cfg, ms in entries:
        tid = store.record_trial(TrialRecord(
            id=None, device_id=DEVICE, problem_key=problem.key(), family_set="mma_sync",
            family="mma_sync", config=cfg.to_dict(), config_hash="h", outcome="ok",
            median_ms=ms, tflops=problem.tflops(ms)))
        store.set_best(DEVICE, problem, "mma_sync", tid, None, None)
    return store


def _winners(store):
    return sorted(((Problem.from_key(w.problem_key), w.config, w.trial.median_ms)
                   for w in store.winners()), key=lambda r: r[0].key())


def test_shaped_winners_round_trip_through_a_table(tmp_path):
    store = shaped_store(f"sqlite:///{tmp_path / 'a.sqlite'}")
    text = dump_table(build_table(store, DEVICE, "h200"))
    assert "schema_version: 5" in text and "kv_heads: 8" in text and "seq_len_kv: 512" in text
    path = tmp_path / "h200.yaml"
    path.write_text(text)
    fresh = Store(f"sqlite:///{tmp_path / 'b.sqlite'}")
    assert import_table(fresh, path, local_fingerprint=FINGERPRINT) == len(SHAPED)
    assert _winners(fresh) == _winners(store)
    assert dump_table(build_table(fresh, DEVICE, "h200")) == text


def test_a_shaped_entry_its_kernel_cannot_run_is_refused_on_import(tmp_path):
    """Import re-checks every entry with can_implement for its own problem (here a grouped-KV
    causal problem with a config whose rows do not add up): nothing is imported."""
    bad = mma_sync.Config(block_m=128, block_n=64, warps=4, rows_per_warp=16, kv_stages=2,
                          p_source="smem", swizzle="bank_period", q_in_registers=False, mma="fp8")
    store = shaped_store(f"sqlite:///{tmp_path / 'a.sqlite'}",
                         [*SHAPED, (Problem(1, 32, 4096, causal=True, kv_heads=8), bad, 0.3)])
    path = tmp_path / "h200.yaml"
    path.write_text(dump_table(build_table(store, DEVICE, "h200")))
    fresh = Store(f"sqlite:///{tmp_path / 'b.sqlite'}")
    with pytest.raises(TableError, match=r"cannot run on h200: block_m=128 != warps\*rows_per"):
        import_table(fresh, path, local_fingerprint=FINGERPRINT)
    assert fresh.winners() == []


def _version_2_table(entries) -> str:
    """A table as tuner schema version 2 wrote it: problems without seq_len_kv and kv_heads."""
    rows = [{"problem": {"batch": p.batch, "heads": p.heads, "seq_len": p.seq_len,
                         "head_dim": p.head_dim, "causal": False},
             "family_set": "mma_sync", "family": "mma_sync", "config": cfg.to_dict(),
             "median_ms": ms, "iqr_ms": None, "tflops": None, "speedup_over_default": None,
             "default_median_ms": None, "rel_rms": 0.03, "trials": 5,
             "decided_at": "2026-11-30T10:00:00"} for p, cfg, ms in entries]
    doc = {"kind": "fp8-attn-tuner/tuning-table", "schema_version": 2, "gpu": "h200",
           "device": FINGERPRINT, "device_id": DEVICE, "tool_version": "0.1.0",
           "dsl_version": None, "date": "2026-11-30T10:00:00", "entry_count": len(rows),
           "entries_sha256": entries_digest(rows), "entries": rows}
    return yaml.safe_dump(doc, sort_keys=False)


OLD = [(Problem(1, 56, 4096), SMALL, 0.91), (Problem(2, 24, 4608, 64), SEED, 0.58)]


def test_a_version_2_table_imports_as_self_attention_with_the_same_winners(tmp_path):
    old = tmp_path / "v2.yaml"
    old.write_text(_version_2_table(OLD))
    store = Store(f"sqlite:///{tmp_path / 'v2.sqlite'}")
    assert import_table(store, old, local_fingerprint=FINGERPRINT) == 2
    assert _winners(store) == sorted(((p, cfg.to_dict(), ms) for p, cfg, ms in OLD),
                                     key=lambda r: r[0].key())
    assert {w.problem_key for w in store.winners()} == {"b1-h56-s4096-d128-full",
                                                         "b2-h24-s4608-d64-full"}
    # Re-exported, it is a table of this version with the same problems, now with every field
    # spelled (and no code version: the old table recorded none).
    again = yaml.safe_load(dump_table(build_table(store, DEVICE, "h200")))
    assert again["schema_version"] == 5
    assert {e["code_version"] for e in again["entries"]} == {None}
    assert [e["problem"] for e in again["entries"]] == [
        dict(batch=2, heads=24, seq_len=4608, head_dim=64, causal=False, seq_len_kv=4608,
             kv_heads=24),
        dict(batch=1, heads=56, seq_len=4096, head_dim=128, causal=False, seq_len_kv=4096,
             kv_heads=56)]


def test_a_version_2_table_with_a_version_3_field_is_refused(tmp_path):
    doc = yaml.safe_load(_version_2_table(OLD))
    doc["entries"][1]["problem"]["kv_heads"] = 8
    doc["entries_sha256"] = entries_digest(doc["entries"])
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc, sort_keys=False))
    with pytest.raises(TableError, match=r"line \d+: entries\.1\.problem\.kv_heads: unknown "
                       r"problem field in a version-2 table; .* needs schema_version >= 3"):
        import_table(Store(f"sqlite:///{tmp_path / 'x.sqlite'}"), bad, force=True)


@pytest.mark.parametrize("edit, expected", [
    (lambda d: d.update(schema_version=6), r"line \d+: schema_version: schema version 6 is not "
     r"one of \(1, 2, 3, 4, 5\); a newer tuner wrote it: upgrade fp8-attn-tuner"),
    (lambda d: d["entries"][0]["problem"].update(kv_heads=3),
     r"entries\.0\.problem: Problem\.kv_heads=3 does not divide heads=56"),
    (lambda d: d["entries"][0]["problem"].update(seq_len_kv=0),
     r"entries\.0\.problem\.seq_len_kv: Problem\.seq_len_kv must be >= 1"),
    (lambda d: d["entries"][0]["problem"].update(window=128),
     r"entries\.0\.problem\.window: unknown problem field in a version-5 table; known: batch, "
     r"heads, seq_len, head_dim, causal, seq_len_kv, kv_heads"),
], ids=["future-version", "kv-heads-not-a-divisor", "kv-len-0", "unknown-field"])
def test_a_bad_table_of_this_version_changes_nothing(tmp_path, edit, expected):
    store = shaped_store(f"sqlite:///{tmp_path / 'a.sqlite'}", SHAPED[:1])
    doc = yaml.safe_load(dump_table(build_table(store, DEVICE, "h200")))
    edit(doc)
    doc["entries_sha256"] = entries_digest(doc["entries"])
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc, sort_keys=False))
    before = _winners(store)
    with pytest.raises(TableError, match=expected):
        import_table(store, bad, local_fingerprint=FINGERPRINT)
    assert _winners(store) == before


@pytest.mark.parametrize("flags, keys", [
    ([], [p.key() for p, _, _ in SHAPED]),
    (["--causal"], ["b1-h56-s8192-d128-causal", "b1-h32-s8192-d128-causal-kvh8"]),
    (["--kv-heads", "8"], ["b1-h32-s8192-d128-causal-kvh8", "b1-h32-s16384-d128-full-kvh8"]),
    (["--kv-heads", "8", "--causal"], ["b1-h32-s8192-d128-causal-kvh8"]),
    (["--kv-len", "512"], ["b1-h40-s75600-d128-full-kv512"]),
    (["--kv-len", "4096"], ["b1-h56-s4096-d128-full"]),  # self-attention's KV length is its own
], ids=["all", "causal", "kv-heads", "both", "kv-len", "kv-len-self"])
def test_show_and_export_filter_by_mask_and_key_value_shape(tmp_path, capsys, flags, keys):
    url = f"sqlite:///{tmp_path / 'a.sqlite'}"
    shaped_store(url).close()
    assert main(["show", "--db", url, "--json", *flags]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert sorted(r["problem"] for r in rows) == sorted(keys)
    for r in rows:
        p = Problem.from_key(r["problem"])
        assert (r["seq_len_kv"], r["kv_heads"], r["causal"]) == (p.seq_len_kv, p.kv_heads,
                                                                 p.causal)
    out = tmp_path / "t.yaml"
    assert main(["export", "--gpu", "h200", "--db", url, "--out", str(out), *flags]) == 0
    doc = yaml.safe_load(out.read_text())
    assert sorted(Problem(**e["problem"]).key() for e in doc["entries"]) == sorted(keys)
    assert doc["entry_count"] == len(keys)


def test_show_trials_with_a_filter(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'a.sqlite'}"
    shaped_store(url).close()
    assert main(["show", "--db", url, "--trials", "8192", "--causal", "--kv-heads", "8",
                 "--json"]) == 0
    (problem,) = json.loads(capsys.readouterr().out)
    assert problem["problem"] == "b1-h32-s8192-d128-causal-kvh8"
    assert main(["show", "--db", url, "--trials", "4096", "--causal"]) == 2
    assert "no stored winner for seq_len 4096 with the filters given" in capsys.readouterr().err


@pytest.mark.parametrize("flag, value, message", [
    ("--kv-len", "0", "must be >= 1, got 0"),
    ("--kv-heads", "0", "must be >= 1, got 0"),
    ("--kv-heads", "x", "expected an integer, got 'x'"),
])
@pytest.mark.parametrize("command", ["show", "export"])
def test_bad_filter_values_are_named(tmp_path, capsys, command, flag, value, message):
    with pytest.raises(SystemExit) as exit_:
        main([command, "--db", f"sqlite:///{tmp_path / 'none.sqlite'}", flag, value])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and f"argument {flag}" in err and message in err
