"""A search starts from what is known (tuner/search/known.py): the GPU's table rows and the
database's nearest winners are measured right after the default, in that order, once each and
only where feasible; `--no-warm-start` measures none of them; a table row that is already the
best ends the search after `--patience` candidates, and after SearchSettings.confirm_patience
where the row was measured by this code within the search's accuracy budget (a confirmed row)."""

from __future__ import annotations

import json

import optuna
import pytest

from tests.doubles import fake_family_large
from tests.doubles.tables import write_table
from tests.test_search import BASE, LARGE, PROBLEM, measured, run_cli
from tuner import runtime
from tuner.errors import TunerError
from tuner.problem import Problem
from tuner.search import SearchSettings, Space, make_target
from tuner.search.known import PER_SOURCE, confirmed_row, known_configs
from tuner.search.records import code_version
from tuner.store import Store, TrialRecord, config_hash
from variants import load_family

MODULES = {LARGE: fake_family_large}
TARGET = make_target("h200", MODULES)


def cfg(tile: int, stages: int, warps: int = 4, swizzle: bool = True) -> dict:
    return fake_family_large.Config(tile, stages, warps, swizzle).to_dict()


DEFAULT = cfg(64, 2, swizzle=False)
SEED = cfg(64, 2)  # fake_family_large.seeds: measured after the known configs
BEST = cfg(64, 3)  # the optimum of fake_family_large.cost_ms
TABLE_NEAR = cfg(32, 2)
DB_NEAR, DB_NEXT = cfg(64, 4), cfg(128, 2)
# Winners of other head_dim and mask: never a known config of PROBLEM (d64, full).
OTHER_DIM, OTHER_MASK = cfg(32, 3, 2, False), cfg(128, 2, 8, False)
INFEASIBLE = cfg(128, 4, swizzle=False)  # tile x stages = 512 > 256 (fake_family.can_implement)


@pytest.fixture
def tables(tmp_path, monkeypatch):
    """write(rows): db/tables/h200.yaml of (problem, config) rows of the large double, in a
    tables directory of the test's own (runtime.TABLES_DIR, where the lookup and the search
    read it)."""
    folder = tmp_path / "tables"
    folder.mkdir()
    monkeypatch.setattr(runtime, "TABLES_DIR", folder)
    # Tables name this package's families only; the double stands in for one here.
    monkeypatch.setattr("variants.KNOWN_FAMILIES", ("mma_sync", "wgmma", LARGE))

    def write(*rows, gpu="h200", device="NVIDIA H200"):
        """Rows (problem, config) or (problem, config, more fields of the entry)."""
        entries = [{"problem": p.to_dict(), "family": LARGE, "config": c, "median_ms": 1.0,
                    **(more[0] if more else {})} for p, c, *more in rows]
        write_table(folder, entries, gpu, device)

    return write


def add_winners(url: str, *rows, device_id: str = TARGET.device_id) -> None:
    """(problem, config) winners of the large double on `device_id`, as a search stores them."""
    store = Store(url)
    try:
        store.record_device(device_id, TARGET.fingerprint)
        for problem, config in rows:
            trial = store.record_trial(TrialRecord(
                id=None, device_id=device_id, problem_key=problem.key(), family_set=LARGE,
                family=LARGE, config=config, config_hash=config_hash(LARGE, config),
                outcome="ok", role="retime", median_ms=1.0))
            store.set_best(device_id, problem, LARGE, trial, None, None)
    finally:
        store.close()


def neighbours(tables, url: str) -> None:
    """A table and a database around PROBLEM (b1-h2-s64-d64-full) with every kind of entry."""
    tables(
        (Problem(1, 2, 256, 64), TABLE_NEAR),
        (Problem(1, 2, 512, 64), INFEASIBLE),
        (PROBLEM, BEST),  # the row of the problem itself: first, wherever the table lists it
        (Problem(1, 2, 128, 64), DEFAULT),  # a baseline: measured as the default only
    )
    add_winners(
        url,
        (Problem(1, 2, 32, 64), DB_NEXT),
        (Problem(1, 2, 128, 64), DB_NEAR),  # 128 and 32 are as near: the longer first
        (Problem(1, 2, 16, 64), BEST),  # the table's already: measured once
        (Problem(1, 2, 64, 128), OTHER_DIM),
        (Problem(1, 2, 64, 64, causal=True), OTHER_MASK),
    )
    # Another device's winner of the problem itself: never this search's.
    add_winners(url, (PROBLEM, cfg(128, 2, 2)), device_id="another-device")


def knobs(row) -> dict:
    return json.loads(row["config_json"])


def by_number(db) -> list:
    return sorted(measured(db), key=lambda r: r["optuna_number"])


def test_known_configs_are_measured_after_the_default_table_first_then_the_database(
        tmp_path, tables, capsys):
    db = tmp_path / "db.sqlite"
    neighbours(tables, f"sqlite:///{db}")
    out = run_cli(capsys, [*BASE, "--families", LARGE, "--trials", "7", "--seed", "1",
                           "--db", f"sqlite:///{db}"])
    (result,) = out["results"]
    assert result["mode"] == "tpe"
    done = by_number(db)
    assert [(r["optuna_number"], r["role"], knobs(r)) for r in done[:6]] == [
        (0, "default", DEFAULT),
        (1, "known", BEST), (2, "known", TABLE_NEAR),  # the table: this problem, then nearest
        (3, "known", DB_NEAR), (4, "known", DB_NEXT),  # the database, nearest first
        (5, "search", SEED),  # then the family's seeds and the sampler
    ]
    assert [r for r in done if r["role"] == "known"] == done[1:5]
    assert result["winner"]["config"] == BEST
    # The study says where each came from.
    study = optuna.load_study(study_name=result["study"], storage=f"sqlite:///{db}")
    assert [study.trials[n].user_attrs.get("known_from") for n in range(1, 5)] == [
        "table h200.yaml: b1-h2-s64-d64-full", "table h200.yaml: b1-h2-s256-d64-full",
        "database: b1-h2-s128-d64-full", "database: b1-h2-s32-d64-full"]


def test_infeasible_duplicate_other_family_and_other_shape_entries_are_skipped(tmp_path, tables):
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    neighbours(tables, url)
    store = Store(url)
    try:
        # A wgmma winner of the nearest problem: not in a search over the double alone.
        trial = store.record_trial(TrialRecord(
            id=None, device_id=TARGET.device_id, problem_key=Problem(1, 2, 48, 64).key(),
            family_set="wgmma", family="wgmma", config={"block_n": 128}, config_hash="w",
            outcome="ok", median_ms=0.5))
        store.set_best(TARGET.device_id, Problem(1, 2, 48, 64), "wgmma", trial, None, None)
        space = Space.build(MODULES, PROBLEM, TARGET.gpu, exhaustive_up_to=64)
        known = known_configs(space, PROBLEM, TARGET.gpu, store, TARGET.device_id)
    finally:
        store.close()
    assert [(k.config, k.source) for k in known] == [
        (BEST, "table h200.yaml: b1-h2-s64-d64-full"),
        (TABLE_NEAR, "table h200.yaml: b1-h2-s256-d64-full"),
        (DB_NEAR, "database: b1-h2-s128-d64-full"),
        (DB_NEXT, "database: b1-h2-s32-d64-full"),
    ]


def test_a_table_row_that_is_already_the_best_stops_the_search_after_patience(
        tmp_path, tables, capsys):
    tables((PROBLEM, BEST))
    db = tmp_path / "db.sqlite"
    patience = 4
    out = run_cli(capsys, [*BASE, "--families", LARGE, "--trials", "60", "--seed", "5",
                           "--patience", str(patience), "--db", f"sqlite:///{db}"])
    (result,) = out["results"]
    assert result["stopped"] == f"no improvement in {patience} trials"
    # The default, the row, `patience` more, and what the compile pipeline held in flight
    # (--compile-jobs 1: one compiling, one compiled, one on the GPU).
    assert patience + 2 <= result["measured_here"] <= patience + 2 + 3
    assert result["winner"]["config"] == BEST
    done = by_number(db)
    assert [(r["role"], knobs(r)) for r in done[:2]] == [("default", DEFAULT), ("known", BEST)]


def test_no_warm_start_measures_none_of_the_known_configs(tmp_path, tables, capsys):
    db = tmp_path / "db.sqlite"
    neighbours(tables, f"sqlite:///{db}")
    run_cli(capsys, [*BASE, "--families", LARGE, "--trials", "3", "--seed", "1",
                     "--patience", "0", "--no-warm-start", "--db", f"sqlite:///{db}"])
    done = by_number(db)
    assert [(r["role"], knobs(r)) for r in done[:2]] == [("default", DEFAULT), ("search", SEED)]
    assert "known" not in {r["role"] for r in done}


def test_a_broken_table_stops_the_search_naming_the_way_around_it(tmp_path, tables):
    (runtime.TABLES_DIR / "h200.yaml").write_text("kind: fp8-attn-tuner/tuning-table\n")
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    try:
        space = Space.build(MODULES, PROBLEM, TARGET.gpu, exhaustive_up_to=64)
        with pytest.raises(TunerError, match=r"schema version.*--no-warm-start"):
            known_configs(space, PROBLEM, TARGET.gpu, store, TARGET.device_id)
    finally:
        store.close()


# ---- a confirmed row: the problem's own, measured by this code, within the budget -------------

def current(**more) -> dict:
    """Fields of a row measured by this code within the default budget on the realistic data."""
    return {"code_version": code_version(fake_family_large), "e2e_error": 0.05,
            "e2e_data": "realistic", "max_error": 10.0, "trials": 64, **more}  # ANY_ACCURACY


@pytest.mark.parametrize("row, confirms", [
    (current(), True),
    (current(code_version="older-code"), False),  # measured by other code
    (current(trials=19), False),  # a search shorter than this one's patience (20)
    (current(e2e_error=20.0), False),  # over the search's budget (ANY_ACCURACY: 10)
    (current(max_error=0.12), False),  # a tighter budget: faster configs were never timed
    (current(family_set=f"{LARGE}+wgmma"), False),  # decided among other families too
    (current(e2e_data="calibration:" + "0f" * 32), False),  # on data the search does not hold it to
    ({}, False),  # a row of an older schema: no code version, no error
])
def test_a_confirmed_row_ends_the_search_after_the_confirming_patience(
        tmp_path, tables, capsys, row, confirms):
    tables((PROBLEM, BEST, row))
    db = tmp_path / "db.sqlite"
    out = run_cli(capsys, [*BASE, "--families", LARGE, "--trials", "60", "--seed", "5",
                           "--patience", "20", "--db", f"sqlite:///{db}"])
    (result,) = out["results"]
    if confirms:
        patience = SearchSettings().confirm_patience
        assert patience < 20
        assert result["stopped"] == (f"no improvement in {patience} trials (confirming table "
                                     f"h200.yaml: {PROBLEM.key()})")
        assert result["measured_here"] <= 2 + patience + 3  # the default, the row, in flight
    else:
        assert result["stopped"] == "no improvement in 20 trials"
    assert result["winner"]["config"] == BEST


def test_only_the_problems_own_row_that_the_search_measures_confirms(tables, tmp_path):
    versions = {LARGE: code_version(fake_family_large)}
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")

    def confirms(families=LARGE):
        space = Space.build(MODULES, PROBLEM, TARGET.gpu, exhaustive_up_to=64)
        space.known = known_configs(space, PROBLEM, TARGET.gpu, store, TARGET.device_id)
        return confirmed_row(space, PROBLEM, TARGET.gpu, versions, families, None, 32)

    try:
        tables((Problem(1, 2, 128, 64), BEST, current()))
        assert confirms() is None  # a neighbour's row
        tables((PROBLEM, BEST, current()))
        assert confirms() == f"table h200.yaml: {PROBLEM.key()}"
        assert confirms(f"{LARGE}+wgmma") is None  # another family set searched
        tables((PROBLEM, INFEASIBLE, current()))
        assert confirms() is None  # a row this search does not measure
        (runtime.TABLES_DIR / "h200.yaml").write_text("kind: fp8-attn-tuner/tuning-table\n")
        assert confirmed_row(Space.build(MODULES, PROBLEM, TARGET.gpu, exhaustive_up_to=64),
                             PROBLEM, TARGET.gpu, versions, LARGE, None, 32) is None  # unreadable
    finally:
        store.close()


def _hashed_files(monkeypatch, family_module) -> set[str]:
    """"folder/file" of each file records.code_version hashes for the family."""
    from tuner.search import records

    hashed = []
    monkeypatch.setattr(records, "code_hash", lambda paths: hashed.extend(paths) or "0" * 64)
    records.code_version(family_module)
    return {f"{p.parent.name}/{p.name}" for p in hashed}


def test_the_code_version_covers_the_kernel_code_every_family_shares(monkeypatch):
    """A stored time (and so a confirmed row) depends on the family's files, the device code
    every family shares and prepare's quantization as much as on the measuring code: an edit to
    any of them is another code version."""
    names = _hashed_files(monkeypatch, fake_family_large)
    assert {"doubles/fake_family_large.py", "variants/prepare.py",
            "variants/block_quantize_kernel.py", "variants/transforms.py", "common/mask.py",
            "tuner/measure.py", "tuner/sandbox_task.py", "variants/input_layout.py"} <= names
    # The gate's modules, the boundary's input checks, the sandbox's process handling and the
    # runtime's repeated-call path time nothing, and the default rules only choose a config: an
    # edit to them keeps every stored time comparable.
    assert not {"variants/reference.py", "variants/reference_bounds.py",
                "variants/prepare_check.py", "variants/defaults.py", "variants/input_checks.py",
                "tuner/sandbox.py", "variants/launch_plan.py"} & names
    assert {"variants/launch.py", "variants/build.py"} <= names  # what run launches through


def test_a_familys_default_rules_are_not_part_of_its_code_version(monkeypatch):
    names = _hashed_files(monkeypatch, load_family("wgmma"))
    assert {"wgmma/kernel.py", "wgmma/config.py", "wgmma/softmax.py"} <= names
    assert not {"wgmma/defaults.py", "variants/defaults.py"} & names


CODE = '''"""A module."""
import math


class Scale:
    """A class."""

    def __call__(self, x):
        """Half of x."""
        return math.ldexp(x, -1)  # one exponent step
'''


@pytest.mark.parametrize("edit", [
    lambda s: s.replace('"""A module."""', '"""The module, reworded."""'),
    lambda s: s.replace('        """Half of x."""\n', ""),
    lambda s: s.replace("# one exponent step", "# why, said otherwise"),
    lambda s: s.replace("import math\n", "import math\n\n\n# a comment of its own\n"),
    lambda s: s.replace("math.ldexp(x, -1)", "math.ldexp(\n            x, -1)"),
], ids=["module docstring", "function docstring dropped", "comment", "blank lines", "layout"])
def test_the_code_version_ignores_comments_docstrings_and_layout(edit):
    """A stored time stays comparable across an edit that leaves the code as Python runs it."""
    from tuner.search.records import code_text

    assert edit(CODE) != CODE
    assert code_text(edit(CODE)) == code_text(CODE)


@pytest.mark.parametrize("edit", [
    lambda s: s.replace("-1)", "-2)"),
    lambda s: s.replace("ldexp", "frexp"),
    lambda s: s.replace("return math", "x = 0.0\n        return math"),
    lambda s: s.replace('"""Half of x."""', 'print("Half of x.")'),
    lambda s: s.replace("class Scale:", "class Scale(float):"),
], ids=["constant", "call", "statement", "string that is no docstring", "base class"])
def test_the_code_version_changes_with_the_code(edit):
    from tuner.search.records import code_text

    assert code_text(edit(CODE)) != code_text(CODE)


def test_the_tables_of_the_other_gpus_of_the_arch_come_after_this_gpus_and_the_database(
        tmp_path, tables):
    """An H200's search (sm_90a) also starts from the H100's table, after its own table and the
    database (times of another GPU, the same kernels), PER_SOURCE of its rows at most; an sm_89
    GPU's table never."""
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    neighbours(tables, url)
    configs = [cfg(32, 3, 2), cfg(32, 2, 2), cfg(32, 4, 2), cfg(128, 2, 8), cfg(32, 2, 8),
               cfg(64, 2, 8)]
    sibling = [(Problem(1, 2, 64 * 2**i, 64), c) for i, c in enumerate(configs)]
    tables(*sibling, gpu="h100", device="NVIDIA H100 80GB HBM3")
    (runtime.TABLES_DIR / "4090.yaml").write_text("kind: not read\n")  # another arch's
    store = Store(url)
    try:
        space = Space.build(MODULES, PROBLEM, TARGET.gpu, exhaustive_up_to=64)
        known = known_configs(space, PROBLEM, TARGET.gpu, store, TARGET.device_id)
    finally:
        store.close()
    sources = [k.source for k in known]
    assert sources[:4] == ["table h200.yaml: b1-h2-s64-d64-full",
                           "table h200.yaml: b1-h2-s256-d64-full",
                           "database: b1-h2-s128-d64-full", "database: b1-h2-s32-d64-full"]
    # Six rows, PER_SOURCE of them: the problem's own first, then the nearest.
    assert PER_SOURCE == 4 and sources[4:] == [
        f"table h100.yaml: b1-h2-s{s}-d64-full" for s in (64, 128, 256, 512)]
