"""The safety net: each test here fails under one mutation of the production code that the rest
of the suite lets through (each test's docstring names its mutation)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.doubles import ANY_ACCURACY
from tests.doubles import fake_family_noisy as noisy
from tests.test_runtime import ALT_CFG, SEED_CFG
from tuner import runtime
from tuner.cli import main
from tuner.gpus import PROFILES
from tuner.problem import Problem
from tuner.store import Store

NOISY = "tests.doubles.fake_family_noisy"
PROBLEM = Problem(1, 2, 64, 64)
REPO = Path(__file__).resolve().parents[1]
SEARCH = ["search", "--gpu", "h200", "--seq-lens", "64", "--heads", "2", "--head-dim", "64",
          "--repeats", "10", "--timeout", "5", "--compile-jobs", "1", "--json", *ANY_ACCURACY]


# ---- 1. the spread rule, end to end ------------------------------------------------------------

def test_a_search_keeps_the_default_when_the_lead_is_within_the_spread(tmp_path, capsys):
    """Both candidates measure faster than the default, by 0.5 and 1 ms, with an IQR of about
    4 ms each (tests/doubles/fake_family_noisy.py): the stored winner is the default, kept."""
    db = f"sqlite:///{tmp_path / 'db.sqlite'}"
    assert main([*SEARCH, "--families", NOISY, "--trials", "3", "--seed", "1", "--db", db]) == 0
    doc = json.loads(capsys.readouterr().out)
    (result,) = doc["results"]
    assert result["mode"] == "exhaustive" and result["outcomes"] == {"ok": 3}
    default = noisy.default("sm_90a", None).to_dict()
    winner, kept = result["winner"], result["default"]
    assert kept["config"] == default
    assert kept["iqr_ms"] > 2 * noisy.LEAD_MS  # the double does make the spread it promises
    # ... exactly, through its own clock (fake_family.time_launch), however busy the machine.
    assert (kept["median_ms"], kept["iqr_ms"]) == (noisy.DEFAULT_MS + noisy.JITTER_MS / 2,
                                                   noisy.JITTER_MS)
    assert result["default_kept"] is True, result
    assert winner["config"] == default and winner["trial_id"] == kept["trial_id"]
    assert result["speedup_over_default"] == 1.0
    store = Store(db, readonly=True)
    try:
        best = store.best_for(doc["device"], PROBLEM)
        assert best.config == default and best.default_trial.id == best.trial.id
        # The candidates were re-timed beside it, and did measure faster than the default.
        retimed = [t for t in store.trials(PROBLEM, outcome="ok") if t.role == "retime"]
        assert min(retimed, key=lambda t: t.median_ms).config != default
    finally:
        store.close()


# ---- 2, 3. runtime lookup: the database before the table; nearest seq_len ties ---------------

# The two configs and the pretend device are the runtime tests' (tests/test_runtime.py).


@pytest.fixture
def lookup(lookup):
    """(database URL, add(seq_len, cfg), table((seq_len, cfg), ...)): tests/conftest.py's lookup
    at B=1 H=56, by seq_len."""
    add, table, _, url = lookup
    yield (url, lambda seq_len, cfg: add(Problem(1, 56, seq_len), cfg),
           lambda *entries: table(*((Problem(1, 56, s), cfg) for s, cfg in entries)))


def _best(url, seq_len):
    best = runtime.load_best_config(seq_len, heads=56, db=url, with_source=True)
    return best.source, best.tuned_seq_len, best.config


def test_the_database_is_consulted_before_the_shipped_table(lookup):
    url, add, table = lookup
    table((4096, SEED_CFG), (16384, SEED_CFG))
    add(4096, ALT_CFG)
    assert _best(url, 4096) == ("db-exact", 4096, ALT_CFG)
    # Nearest in the database still comes before exact in the table (README, lookup order).
    assert _best(url, 16384) == ("db-nearest", 4096, ALT_CFG)
    # A problem the database has nothing for (other head_dim) goes on to the table, whose
    # head_dim-128 entries do not match either: the default.
    other = runtime.load_best_config(4096, heads=56, head_dim=64, db=url, with_source=True)
    assert other.source == "default"


@pytest.mark.parametrize("tuned, want, chosen", [
    ((2048, 8192), 4096, 8192),  # in floats, 4096/2048 came out an ulp nearer than 8192/4096
    ((1000, 4000), 2000, 4000),  # a tie in floats too
    ((100, 900), 300, 900),
    ((8192, 2048), 4096, 8192),  # the order they are stored in does not matter
], ids=["2048|8192->4096", "1000|4000->2000", "100|900->300", "reversed"])
@pytest.mark.parametrize("source", ["db", "table"])
def test_a_nearest_seq_len_tie_goes_to_the_larger(lookup, tuned, want, chosen, source):
    url, add, table = lookup
    cfgs = {chosen: SEED_CFG}
    cfgs.update({s: ALT_CFG for s in tuned if s != chosen})
    if source == "db":
        for s in tuned:
            add(s, cfgs[s])
    else:
        table(*[(s, cfgs[s]) for s in tuned])
    assert _best(url, want) == (f"{source}-nearest", chosen, SEED_CFG)
    # One step off the tie, the nearer one wins either way.
    lower = min(tuned)
    assert _best(url, want - 1)[1] == lower


# ---- 4. a resumed TPE study never measures a stored config again ------------------------------

def test_a_resumed_tpe_study_tells_stored_configs_instead_of_measuring_them(tmp_path,
                                                                           monkeypatch):
    """The Store holds results the study does not (a kill between the Store write and the tell,
    or a lost --storage): when the sampler proposes those configs again, their stored values are
    told and nothing is compiled or measured twice."""
    import optuna

    from tests.doubles import fake_family_large as large
    from tuner.search import ProblemSearch, SearchSettings, make_target, params_of

    family = "tests.doubles.fake_family_large"
    log = tmp_path / "compiles.jsonl"
    monkeypatch.setenv("FAKE_FAMILY_COMPILE_LOG", str(log))
    target = make_target("h200", {family: large})
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    store.record_device(target.device_id, target.fingerprint)

    def search(storage, trials):
        settings = SearchSettings(trials=trials, seed=3, compile_jobs=1, timeout_s=1, repeats=5,
                                  warmup=1, patience=None)
        return ProblemSearch(PROBLEM, [family], target, store, storage, settings)

    try:
        first = search(optuna.storages.InMemoryStorage(), 5)
        assert first.progress().mode == "tpe"
        first.run(decide=False)
        def measured():  # what reached a compiler (TPE proposes infeasible configs too)
            return [r for r in store.trials(PROBLEM, study_name=first.name)
                    if r.outcome != "infeasible"]

        stored = {r.config_hash: r for r in measured()}
        assert len(stored) == 5
        first_log = len(log.read_text().splitlines())
        # The study forgot them; the sampler proposes every one of them first.
        again = search(optuna.storages.InMemoryStorage(), 8)
        for rec in stored.values():
            again.study.enqueue_trial(params_of(rec.family, rec.config))
        result = again.run(decide=False)
        assert result.mode == "tpe" and result.measured_here == 3
        hashes = [r.config_hash for r in measured()]
        assert len(hashes) == len(set(hashes)) == 8, "a stored config was measured again"
        compiled_again = [json.loads(line) for line in log.read_text().splitlines()[first_log:]]
        assert compiled_again, "the compile log is empty: did the workers see the environment?"
        stored_configs = [r.config for r in stored.values()]
        assert not [c for c in compiled_again
                    if {k: c[k] for k in stored_configs[0]} in stored_configs]
        # What was told for each: the stored cost (kernel + prepare, what the search ranks by)
        # or the failure, not a new measurement.
        from tuner.search.cost import record_cost

        told = {t.number: t for t in again.study.get_trials(deepcopy=False)}
        for number, rec in enumerate(stored.values()):
            trial = told[number]
            assert trial.state == optuna.trial.TrialState.COMPLETE
            if rec.outcome == "ok":
                assert rec.prepare_ms is not None and trial.value == record_cost(rec)
    finally:
        store.close()


# ---- 5. can_implement, pinned: feasible counts per space and arch ------------------------------
# Counted 2026-12-01 at B=1 H=2 S=4096 (seq_len and heads enter no constraint; head_dim does).
# A change here is a change of what the search may compile: regenerate the counts only with a
# reason (a measured spill, a new knob value) in the commit that moves them.
FEASIBLE = {
    # family, GPU profile (its arch), head_dim: (space size, feasible)
    # wgmma doubled by tile_order: every order fits wherever the other does.
    # The block scales' registers in the estimate take 3144 -> 2916 and 4704 -> 4368:
    # 1 WG x 256 keys and 3 WG x 128 smem-P at 128, 2 WG x 256 with V in the kernel and 3 WG x
    # 192 smem-P at 64; every such config measured spills 80-264 B after the fold, except 1 WG
    # x 256 without overlap at 128 (0 B, refused by the estimate's margin).
    # q_quant doubles the space: Q's in-kernel quantization runs before the K/V
    # loop, so its registers fit wherever the loop's do (tests/test_wgmma_compile.py: no
    # spills); its 2 * block_m * head_dim bytes of bf16 staging tile leave 2700 of the 2916
    # at head_dim 128 under the 227 KB a CTA (all 4368 at 64).
    # k_smoothing and qk_rotation (prepare-only, one build for all four) x4 the spaces: every
    # config takes smoothing; the rotation needs Q quantized in prepare (wgmma q_quant=prepare:
    # 4374 of 8424 at 128, 6552 of 13104 at 64), so wgmma's feasible count is 2 x (base + those).
    # pack_gqa x2 and head_swizzle x4 the space; at H=2 (one query head per KV head) pack_gqa
    # is refused, and head_swizzle's sections apply to longest_first only: x2.5 the feasible.
    # pv_dtype x2 the space; bf16 P.V needs v_layout=prepared, and its V ring and P registers
    # refuse some tiles: x1.4 the feasible.
    # qk_dtype x2 the space; int8 needs q_quant=prepare and costs e4m3's shared memory and
    # registers: the feasible gain the q_quant=prepare configs (61380 at 128, 90360 at 64).
    ("wgmma", "h200", 128): (3538944, 151020),    # sm_90a (split_tail: persistent configs x2)
    ("wgmma", "h200", 64): (3538944, 225720),
    ("wgmma", "4090", 128): (3538944, 0),       # sm_89: no wgmma
    ("wgmma", "5080", 128): (3538944, 0),       # sm_120a: no wgmma
    ("mma_sync", "h200", 128): (6912, 1152),    # sm_90a
    ("mma_sync", "h200", 64): (6912, 1536),
    ("mma_sync", "4090", 128): (6912, 1088),    # sm_89: 99 KB of shared memory a block
    ("mma_sync", "4090", 64): (6912, 1536),
    ("mma_sync", "5080", 128): (13824, 2176),   # sm_120a: mma=mxf8 doubles the space
    ("mma_sync", "5080", 64): (13824, 3072),
}


@pytest.mark.parametrize("family, gpu, head_dim", sorted(FEASIBLE),
                         ids=lambda v: str(v))
def test_feasible_counts_per_space_and_arch_are_pinned(family, gpu, head_dim):
    from variants import load_family
    from variants.base import judge_space

    verdicts = [ok for _, ok, _ in judge_space(load_family(family), Problem(1, 2, 4096, head_dim),
                                                PROFILES[gpu])]
    assert (len(verdicts), sum(verdicts)) == FEASIBLE[family, gpu, head_dim]


# ---- 6. tuner import stores a table in one transaction ---------------------------------------

def test_an_import_that_fails_midway_stores_nothing(tmp_path, monkeypatch, capsys):
    """The database fails on the 5th trial insert of the shipped table's import: the command
    fails and not one of the entries before it is stored."""
    import sqlite3

    from sqlalchemy import event

    from tuner.store import _Trial

    shipped = REPO / "db" / "tables" / "h200.yaml"
    db = tmp_path / "db.sqlite"
    inserts = []

    def fail_on_the_fifth(mapper, connection, target):
        inserts.append(target)
        if len(inserts) == 5:
            raise RuntimeError("planted: the database fails midway")

    event.listen(_Trial, "before_insert", fail_on_the_fifth)
    try:
        assert main(["import", str(shipped), "--db", f"sqlite:///{db}", "--force"]) != 0
    finally:
        event.remove(_Trial, "before_insert", fail_on_the_fifth)
    assert "planted: the database fails midway" in capsys.readouterr().err
    assert len(inserts) == 5
    # The database did not exist before this import: it is not left behind, empty or not.
    assert list(tmp_path.iterdir()) == []
    # Into an existing (empty) database: not one of the entries before the failure is stored.
    Store(f"sqlite:///{db}").close()
    inserts.clear()
    event.listen(_Trial, "before_insert", fail_on_the_fifth)
    try:
        assert main(["import", str(shipped), "--db", f"sqlite:///{db}", "--force"]) != 0
    finally:
        event.remove(_Trial, "before_insert", fail_on_the_fifth)
    assert len(inserts) == 5
    con = sqlite3.connect(db)
    try:
        for table in ("tuner_trials", "tuner_best", "tuner_problems", "tuner_devices"):
            assert con.execute(f"SELECT COUNT(*) FROM {table}").fetchone() == (0,), table
    finally:
        con.close()
    # ... and the same import, nothing planted, then stores the whole table.
    assert main(["import", str(shipped), "--db", f"sqlite:///{db}", "--force"]) == 0
    store = Store(f"sqlite:///{db}", readonly=True)
    try:
        import yaml

        assert len(store.winners()) == yaml.safe_load(shipped.read_text())["entry_count"] > 2
    finally:
        store.close()


# ---- 7. a connection error never prints the password ------------------------------------------

PLAIN_URL = "postgresql://user:secret@127.0.0.1:1/db"  # port 1 on loopback refuses at once
COMMANDS = {
    "show": ["show", "--db", PLAIN_URL],
    "import": ["import", str(REPO / "db" / "tables" / "h200.yaml"), "--db", PLAIN_URL,
               "--force"],
    "search": [*SEARCH, "--families", NOISY, "--trials", "1", "--db", PLAIN_URL],
}


@pytest.fixture
def echoing_driver(monkeypatch):
    """A driver whose error quotes the connection string it was given, password and all (as
    libpq's "invalid connection option" and several drivers' DSN errors do)."""
    psycopg = pytest.importorskip("psycopg")

    def connect(*args, **kwargs):
        conninfo = " ".join(f"{k}={v}" for k, v in kwargs.items())
        raise psycopg.OperationalError(f"could not connect with conninfo '{conninfo}'\n"
                                       "second line: password=secret")

    monkeypatch.setattr(psycopg, "connect", connect)


@pytest.mark.parametrize("driver", ["refusing", "echoing"])
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_connection_error_is_one_masked_line(command, driver, request, capsys, caplog):
    import logging

    if driver == "echoing":
        request.getfixturevalue("echoing_driver")
    with caplog.at_level(logging.DEBUG):
        code = main(list(COMMANDS[command]))
    out, err = capsys.readouterr()
    assert code == 2, err
    assert err.endswith("\n") and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "://user:***@127.0.0.1:1/db" in err, err  # the URL as the engine got it
    assert "secret" not in out + err + caplog.text
