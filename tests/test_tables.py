"""YAML tuning tables: export -> import -> export round trip, and imports that change nothing."""

import re
import time
from pathlib import Path

import pytest

from tuner.cli import main
from tuner.problem import Problem
from tuner.store import Store, TrialRecord
from tuner.tables import TableError, build_table, dump_table, import_table
from variants import mma_sync

FINGERPRINT = {"name": "NVIDIA H200", "compute_capability": "9.0", "sm_count": 132,
               "driver": "580.159.04", "torch": "2.11.0+cu130", "cutlass_dsl": "4.8.1"}
OTHER_GPU = {"name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0", "sm_count": 132}
SEED = mma_sync.default("sm_90a")
SMALL = mma_sync.Config(block_m=64, block_n=64, warps=4, rows_per_warp=16, kv_stages=2,
                        p_source="smem", swizzle="bank_period", q_in_registers=False, mma="fp8")


def populated_store(url) -> tuple[Store, str]:
    from tuner.gpus import fingerprint_id

    device = fingerprint_id(FINGERPRINT)
    store = Store(url)
    store.record_device(device, FINGERPRINT)
    for seq, cfg, ms in ((4096, SMALL, 0.91234567), (30272, SEED, 48.5)):
        problem = Problem(1, 56, seq)
        ids = []
        for role, c, t in (("search", cfg, ms), ("search", SEED, ms * 1.1), ("search", SEED, None)):
            ids.append(store.record_trial(TrialRecord(
                id=None, device_id=device, problem_key=problem.key(), family_set="mma_sync",
                family="mma_sync", config=c.to_dict(), config_hash="h", role=role,
                outcome="ok" if t else "wrong_result", median_ms=t, iqr_ms=t and t * 0.01,
                tflops=t and problem.tflops(t), rel_rms=0.031)))
        store.set_best(device, problem, "mma_sync", ids[0], ids[1], 1.1)
    return store, device


@pytest.fixture
def exported(tmp_path):
    store, device = populated_store(f"sqlite:///{tmp_path / 'a.sqlite'}")
    text = dump_table(build_table(store, device, "h200"))
    store.close()
    path = tmp_path / "h200.yaml"
    path.write_text(text)
    return path, text


def test_export_import_export_is_identical(exported, tmp_path):
    path, text = exported
    assert "family: mma_sync" in text and "trials: 3" in text and "gpu: h200" in text
    fresh = Store(f"sqlite:///{tmp_path / 'b.sqlite'}")
    assert import_table(fresh, path, local_fingerprint=FINGERPRINT) == 2
    again = dump_table(build_table(fresh, next(iter(fresh.devices())), "h200"))
    assert again == text


def _snapshot(store):
    return [(w.problem_key, w.config, w.trial.median_ms) for w in store.winners()], \
        {d: fp for d, fp in store.devices().items()}


def _corrupt(text, old, new):
    assert old in text, old
    return text.replace(old, new, 1)


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda t: _corrupt(t, "schema_version: 5", "schema_version: 7"),
         r"line \d+: schema_version: schema version 7"),
        (lambda t: _corrupt(t, "    warps: 4", "    warps: 4\n    wraps: 4"),
         r"line \d+: entries\.\d+\.config: .*unknown knobs \['wraps'\]"),
        (lambda t: _corrupt(t, "block_m: 64", "block_m: 96"),
         r"line \d+: entries\.0\.config\.block_m: 96 is outside"),
        (lambda t: _corrupt(t, "block_n: 64", "block_n: 32").replace("rows_per_warp: 16",
                                                                     "rows_per_warp: 32", 1),
         r"line \d+: entries\.0\.config: cannot run on h200"),
        (lambda t: t[: len(t) // 2], r"line \d+"),
        (lambda t: _corrupt(t, "median_ms: 0.9123", "median_ms: -1"),
         r"line \d+: entries\.0\.median_ms: must be a positive"),
        (lambda t: "", r"the file is empty"),
    ],
    ids=["schema", "unknown-knob", "out-of-domain", "infeasible", "truncated", "bad-time", "empty"],
)
def test_bad_tables_change_nothing_and_name_line_and_field(exported, tmp_path, mutate, expected):
    path, text = exported
    store, _ = populated_store(f"sqlite:///{tmp_path / 'c.sqlite'}")
    before = _snapshot(store)
    bad = tmp_path / "bad.yaml"
    bad.write_text(mutate(text))
    with pytest.raises(TableError, match=expected):
        import_table(store, bad, local_fingerprint=FINGERPRINT)
    assert _snapshot(store) == before


def test_a_winner_decided_after_an_import_counts_its_own_trials(exported, tmp_path):
    path, text = exported
    store = Store(f"sqlite:///{tmp_path / 'b.sqlite'}")
    import_table(store, path, local_fingerprint=FINGERPRINT)
    device = next(iter(store.devices()))
    problem = Problem(1, 56, 4096)
    ids = [store.record_trial(TrialRecord(
        id=None, device_id=device, problem_key=problem.key(), family_set="mma_sync",
        family="mma_sync", config=SEED.to_dict(), config_hash="s", role="search", outcome="ok",
        median_ms=ms, iqr_ms=0.001, tflops=problem.tflops(ms), rel_rms=0.03))
        for ms in (0.8, 0.9, 1.0, 1.1, 1.2)]
    store.set_best(device, problem, "mma_sync", ids[0], None, None)
    entries = {e["problem"]["seq_len"]: e for e in build_table(store, device, "h200")["entries"]}
    store.close()
    assert "trials: 3" in text and entries[30272]["trials"] == 3  # still the table's own count
    # The search's five and the two the import stored (winner, default), not the table's 3.
    assert entries[4096]["trials"] == 7


def test_wrong_fingerprint_is_refused_unless_forced(exported, tmp_path):
    path, _ = exported
    store = Store(f"sqlite:///{tmp_path / 'd.sqlite'}")
    with pytest.raises(TableError, match=r"line \d+: device: tuned on NVIDIA H200 .* force=True"):
        import_table(store, path, local_fingerprint=OTHER_GPU)
    with pytest.raises(TableError, match="no local GPU. Re-run with force=True"):
        import_table(store, path, local_fingerprint=None)
    assert store.winners() == []
    assert import_table(store, path, force=True, local_fingerprint=None) == 2


def test_cli_export_and_import(exported, tmp_path, capsys):
    path, text = exported
    url = f"sqlite:///{tmp_path / 'e.sqlite'}"
    assert main(["import", str(path), "--db", url, "--force"]) == 0
    assert "imported 2 tuned problems" in capsys.readouterr().out
    out = tmp_path / "out.yaml"
    assert main(["export", "--gpu", "h200", "--db", url, "--out", str(out)]) == 0
    assert out.read_text() == text
    capsys.readouterr()
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("kind: fp8-attn-tuner/tuning-table", "kind: other"))
    assert main(["import", str(bad), "--db", url, "--force"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and re.search(r"line \d+: kind", err)


def test_show_lists_winners_with_the_default_beside(exported, tmp_path, capsys):
    path, _ = exported
    url = f"sqlite:///{tmp_path / 'f.sqlite'}"
    assert main(["import", str(path), "--db", url, "--force"]) == 0
    capsys.readouterr()
    assert main(["show", "--db", url, "--json"]) == 0
    import json

    rows = json.loads(capsys.readouterr().out)
    assert [r["seq_len"] for r in rows] == [4096, 30272]
    assert rows[0]["default_ms"] == pytest.approx(0.91234567 * 1.1, rel=1e-3)
    assert main(["show", "--db", url]) == 0
    table = capsys.readouterr().out
    assert "b1-h56-s30272-d128-full" in table and "mma_sync" in table
    assert main(["show", "--db", url, "--trials", "4096"]) == 0
    assert "imported" in capsys.readouterr().out


def test_show_plot_writes_an_image(exported, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    path, _ = exported
    url = f"sqlite:///{tmp_path / 'g.sqlite'}"
    assert main(["import", str(path), "--db", url, "--force"]) == 0
    png = tmp_path / "winners.png"
    assert main(["show", "--db", url, "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_bench_peers_join_the_plot_data(tmp_path):
    from tuner.bench import BenchRow, store_peer_rows
    from tuner.commands.show import peer_rows, winner_rows

    store, device = populated_store(f"sqlite:///{tmp_path / 'h.sqlite'}")
    problem = Problem(1, 56, 30272)
    store_peer_rows(store, device, problem, [
        BenchRow(30272, "tuned", "x", median_ms=27.5, tflops=954.0),
        BenchRow(30272, "cudnn-fp8", "fp8 in/out", median_ms=31.3, tflops=838.0),
        BenchRow(30272, "sdpa-flash", "bf16", note="skipped: not here"),
    ])
    rows = winner_rows(store, store.devices())
    peers = peer_rows(store, store.devices(), rows)
    found = [(p["system"], p["seq_len"], p["tflops"]) for p in peers]
    assert found == [("cudnn-fp8", 30272, 838.0)]


# ---- a table proves it is whole -----------------------------------------------------------------

SHIPPED = Path(__file__).resolve().parents[1] / "db" / "tables" / "h200.yaml"
# The shipped table in table schema 2 (self-attention rows only), kept as it was
# exported: the older schema versions are made from it.
SHIPPED_SCHEMA_2 = Path(__file__).resolve().parent / "data" / "h200_schema2.yaml"


def shipped_header(field: str):
    """A top-level field of the shipped table (entry_count, schema_version, ...)."""
    import yaml

    return yaml.safe_load(SHIPPED.read_text())[field]


def shipped_entry_count() -> int:
    return shipped_header("entry_count")


def _cut_inside_a_value(text):
    # Mid-number: `rel_rms: 0.02368` becomes `rel_rms: 0.02`, still a valid table entry by entry.
    at = text.rindex("rel_rms: 0.0") + len("rel_rms: 0.0")
    return text[: at + 2]


def _cut_at_an_entry_boundary(text):
    return text[: text.rindex("- problem:")]


@pytest.mark.parametrize("mutate, expected", [
    (_cut_inside_a_value, r"line \d+: entries_sha256: does not match the entries.*re-export"),
    (_cut_at_an_entry_boundary,
     rf"line \d+: entry_count: the table says {shipped_entry_count()} entries, the file holds "
     rf"{shipped_entry_count() - 1}: .*re-export"),
    (lambda t: _corrupt(t, "rel_rms: 0.02368", "rel_rms: 0.02"),
     r"entries_sha256: does not match .*edited after export"),
    (lambda t: re.sub(r"entries_sha256: .*\n", "", t),
     rf"line \d+: \(top\): entries_sha256 is missing; a version-{shipped_header('schema_version')} "
     r"table .* re-export"),
], ids=["cut-in-a-value", "cut-at-an-entry", "edited", "no-checksum"])
def test_a_table_that_is_not_whole_is_refused(tmp_path, mutate, expected):
    store = Store(f"sqlite:///{tmp_path / 'w.sqlite'}")
    bad = tmp_path / "cut.yaml"
    bad.write_text(mutate(SHIPPED.read_text()))
    with pytest.raises(TableError, match=expected):
        import_table(store, bad, force=True)
    assert store.winners() == []


def test_a_version_1_table_imports_with_a_warning(tmp_path, caplog):
    import yaml

    doc = yaml.safe_load(SHIPPED_SCHEMA_2.read_text())
    doc["schema_version"] = 1
    del doc["entry_count"], doc["entries_sha256"]
    old = tmp_path / "v1.yaml"
    old.write_text(yaml.safe_dump(doc, sort_keys=False))
    store = Store(f"sqlite:///{tmp_path / 'v1.sqlite'}")
    assert import_table(store, old, force=True) == 10
    assert "version-1 table without entry_count and entries_sha256" in caplog.text


def test_a_huge_file_is_refused_before_it_is_parsed(tmp_path):
    junk = tmp_path / "junk.yaml"
    with open(junk, "w") as fh:
        fh.write("entries:\n" + "- [1, 2, 3]\n" * (5 * 2**20))  # 60 MB of valid YAML
    start = time.perf_counter()
    with pytest.raises(TableError, match=r"junk\.yaml is larger than 16 MiB, the limit"):
        import_table(Store(f"sqlite:///{tmp_path / 'j.sqlite'}"), junk, force=True)
    assert time.perf_counter() - start < 2.0


@pytest.mark.parametrize("old, new, field", [
    ("seq_len: 4096", "seq_len: 99999999999999999999999",
     r"entries\.0\.problem\.seq_len: Problem\.seq_len must be <= 1073741824"),
    ("seq_len: 4096", f"seq_len: {2**40}", r"entries\.0\.problem\.seq_len: .* must be <= "),
    ("heads: 56", "heads: 100000000",
     r"entries\.0\.problem\.heads: Problem\.heads must be <= 65535"),
    ("heads: 56", "heads: 1.0e+8", r"entries\.0\.problem\.heads: Problem\.heads must be an int"),
    ("trials: 3", "trials: 99999999999999999999999", r"entries\.0\.trials: must be a count \(0 "),
], ids=["seq_len-beyond-int64", "seq_len-2**40", "heads-1e8", "heads-float", "trials-huge"])
def test_numbers_out_of_range_are_refused_naming_line_and_field(exported, tmp_path, old, new,
                                                                field):
    _, text = exported
    bad = tmp_path / "big.yaml"
    bad.write_text(_corrupt(text, old, new))
    store = Store(f"sqlite:///{tmp_path / 'n.sqlite'}")
    with pytest.raises(TableError, match=r"big\.yaml: line \d+: " + field):
        import_table(store, bad, local_fingerprint=FINGERPRINT)
    assert store.winners() == []


def _row_counts(url):
    import sqlite3

    con = sqlite3.connect(url.removeprefix("sqlite:///"))
    try:
        return {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                for t in ("tuner_devices", "tuner_problems", "tuner_trials", "tuner_best")}
    finally:
        con.close()


def test_importing_the_same_table_twice_changes_nothing(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'twice.sqlite'}"
    assert main(["import", str(SHIPPED), "--db", url, "--force"]) == 0
    once = _row_counts(url)
    assert once["tuner_best"] == shipped_entry_count()
    assert main(["import", str(SHIPPED), "--db", url, "--force"]) == 0
    assert _row_counts(url) == once


def test_the_lookup_takes_the_newest_decision_of_a_problems_family_sets():
    """A problem searched over wgmma alone and over both families has two winners in the table.
    Its entries record no code version (exported before the field), so their times, measured by
    the kernel of their day, are not compared: the newest decision runs, as store.best_for picks
    in a database (problem.preferred_per_problem)."""
    from collections import defaultdict

    import yaml

    from tuner.problem import Problem
    from tuner.tables import load_table_entries
    from variants import load_family

    by_key = defaultdict(list)
    for e in yaml.safe_load(SHIPPED.read_text())["entries"]:
        by_key[Problem(**e["problem"]).key()].append(e)
    several = {key: entries for key, entries in by_key.items() if len(entries) > 1}
    # One where the older entry's time is the faster: the case the rule exists for.
    assert any(max(entries, key=lambda e: e["decided_at"])["median_ms"]
               > min(e["median_ms"] for e in entries) for entries in several.values())
    loaded = {problem.key(): config for problem, _, config, _ in load_table_entries(SHIPPED)}
    assert len(loaded) == len(by_key)
    for key, entries in by_key.items():
        newest = max(entries, key=lambda e: e["decided_at"])
        # with the knobs added after the entry was written at their defaults (the prepare-only
        # ones left out: the runtime fills those from the family default, test_old_rows.py)
        config = load_family(newest["family"]).Config.from_dict
        assert config(loaded[key]).to_dict() == config(newest["config"]).to_dict()
