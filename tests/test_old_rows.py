"""A table or database row written before prepare's exact transforms existed (no k_smoothing,
qk_rotation) runs with the family default's values for them, not "off": the lookup, the
search's warm start, and an import and export in between all keep the row as written."""

from __future__ import annotations

from types import SimpleNamespace

import yaml

from tests.doubles.tables import write_table as write_doc
from tests.test_runtime import DEVICE, db  # noqa: F401 (the fixture)
from tests.test_winner_preference import FINGERPRINT
from tuner import runtime
from tuner.gpus import PROFILES
from tuner.problem import Problem
from tuner.store import Store, config_hash
from tuner.tables import build_table, dump_table, import_table
from variants import wgmma
from variants.base import PREPARE_ONLY_KNOBS

PROBLEM = Problem(1, 56, 16384, 128)
H200 = PROFILES["h200"]
DEFAULT = wgmma.default(H200.arch, PROBLEM)
# The transforms the default turns on at PROBLEM (smoothing, and the rotation at its length).
DEFAULT_ON = [k for k, off in PREPARE_ONLY_KNOBS.items() if getattr(DEFAULT, k) != off]


def old_row(**knobs) -> dict:
    """The default's kernel knobs, as a row written before the transforms existed names them."""
    config = {k: v for k, v in DEFAULT.to_dict().items()
              if k not in ("k_smoothing", "qk_rotation")}
    return {**config, "block_n": 64, **knobs}


def write_table(folder, config: dict):
    """db/tables/h200.yaml in `folder` with one row of PROBLEM."""
    folder.mkdir(exist_ok=True)
    path = write_doc(folder, [{"problem": PROBLEM.to_dict(), "family": "wgmma",
                               "config": config, "median_ms": 5.0}])
    runtime.clear_cache()
    return path


def test_the_default_has_k_smoothing_on():
    assert DEFAULT.k_smoothing == "mean"  # else these tests show nothing


def test_a_row_without_the_transform_knobs_runs_the_defaults_not_off(db, tmp_path):  # noqa: F811
    url, _ = db
    write_table(tmp_path / "tables", old_row())
    best = runtime.load_best_config(16384, heads=56, db=url, with_source=True)
    assert best.source == "table-exact" and best.config.block_n == 64  # the row's kernel
    assert (best.config.k_smoothing, best.config.qk_rotation) == ("mean", DEFAULT.qk_rotation)
    assert DEFAULT_ON == ["k_smoothing", "qk_rotation"]  # PROBLEM is long enough to rotate
    assert ("before k_smoothing, qk_rotation existed: the default's k_smoothing=mean, "
            "qk_rotation=hadamard") in best.detail


def test_a_row_that_names_them_keeps_its_values(db, tmp_path):  # noqa: F811
    url, _ = db
    write_table(tmp_path / "tables", old_row(k_smoothing="off", qk_rotation="none"))
    best = runtime.load_best_config(16384, heads=56, db=url, with_source=True)
    assert (best.config.k_smoothing, best.config.qk_rotation) == ("off", "none")
    assert "existed" not in best.detail


def test_an_import_and_an_export_keep_the_row_as_written(db, tmp_path):  # noqa: F811
    url, _ = db
    table = write_table(tmp_path / "shipped", old_row())
    store = Store(f"sqlite:///{tmp_path / 'imported.sqlite'}")
    assert import_table(store, table, local_fingerprint=FINGERPRINT) == 1
    (winner,) = store.winners()
    assert "k_smoothing" not in winner.config
    (entry,) = yaml.safe_load(dump_table(build_table(store, winner.device_id, "h200")))["entries"]
    assert "k_smoothing" not in entry["config"] and entry["config"]["block_n"] == 64
    # Looked up from the database it was imported into, the row runs the default's smoothing.
    (_, family, config, _), = runtime.db_entries(store.url, winner.device_id)
    cfg, filled = runtime.config_from_row(wgmma, config, PROBLEM, H200)
    assert (cfg.k_smoothing, filled) == ("mean", DEFAULT_ON)
    store.close()


def test_the_warm_start_measures_the_row_as_the_runtime_runs_it():
    from tuner.search.known import Known, _in_space

    filled = {**old_row(), "k_smoothing": DEFAULT.k_smoothing,
              "qk_rotation": DEFAULT.qk_rotation}
    space = SimpleNamespace(modules={"wgmma": wgmma}, baselines=[],
                            feasible_hashes={config_hash("wgmma", filled)})
    (known,) = _in_space([Known("wgmma", old_row(), "table h200.yaml")], space, PROBLEM, H200)
    assert known.config == wgmma.Config.from_dict(filled).to_dict()


def test_each_knob_is_filled_where_it_fits_the_rows_kernel(monkeypatch):
    """A default that rotates, for a row that quantizes Q in the kernel (where wgmma refuses the
    rotation): the row takes the default's smoothing and keeps the rotation off."""
    import dataclasses

    rotating = dataclasses.replace(DEFAULT, qk_rotation="hadamard")
    monkeypatch.setattr(wgmma, "default", lambda arch, problem=None: rotating)
    cfg, filled = runtime.config_from_row(wgmma, old_row(q_quant="kernel"), PROBLEM, H200)
    assert (cfg.k_smoothing, cfg.qk_rotation, filled) == ("mean", "none", ["k_smoothing"])
    cfg, filled = runtime.config_from_row(wgmma, old_row(q_quant="prepare"), PROBLEM, H200)
    assert (cfg.qk_rotation, filled) == ("hadamard", ["k_smoothing", "qk_rotation"])
