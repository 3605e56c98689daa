"""A message names an argument as its caller wrote it: the keyword argument for a Python caller
(`gpu='h200'`), the flag for a user of the `tuner` command (`--gpu h200`)."""

import sqlite3
from pathlib import Path

import pytest

import tuner
from tuner import gpus
from tuner.cli import main
from tuner.errors import TunerError
from tuner.store import NoResults, Store
from tuner.tables import import_table

SHIPPED = Path(__file__).resolve().parents[1] / "db" / "tables" / "h200.yaml"


@pytest.fixture(autouse=True)
def _fresh_gpu_lookup():
    # The runtime keeps the local GPU it found for the life of the process.
    from tuner import runtime

    runtime._local_gpu_and_device.cache_clear()
    yield
    runtime._local_gpu_and_device.cache_clear()


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(gpus, "_cuda_available", lambda: False)


@pytest.fixture
def an_h100(monkeypatch):
    monkeypatch.setattr(gpus, "_cuda_available", lambda: True)
    monkeypatch.setattr(gpus, "_local_device_name", lambda device=0: ("NVIDIA H100 80GB HBM3",
                                                                      (9, 0)))


def _python_error(call) -> str:
    with pytest.raises(TunerError) as err:
        call()
    return str(err.value)


def _cli_error(args, capsys) -> str:
    assert main(args) == 2
    return capsys.readouterr().err


def test_a_gpu_that_is_not_here_is_named_as_given(no_gpu, capsys):
    python = _python_error(lambda: tuner.load_best_config(4096, heads=8, gpu="h200"))
    assert python.startswith("gpu='h200' needs that GPU") and "--gpu h200 needs" not in python
    cli = _cli_error(["search", "--gpu", "h200", "--seq-lens", "4096", "--heads", "8"], capsys)
    assert "error: --gpu h200 needs that GPU" in cli


def test_another_local_gpu_is_suggested_as_the_caller_would_write_it(an_h100, capsys):
    python = _python_error(lambda: tuner.load_best_config(4096, heads=8, gpu="h200"))
    assert "use gpu='h100' or gpu='auto'" in python and "--gpu" not in python
    cli = _cli_error(["search", "--gpu", "h200", "--seq-lens", "4096", "--heads", "8"], capsys)
    assert "--gpu h200 asks for" in cli and "use --gpu h100 or --gpu auto" in cli


def test_a_database_without_results_names_db(tmp_path, capsys):
    path = tmp_path / "other.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE someone_elses (x INTEGER)")
    url = f"sqlite:///{path}"
    with pytest.raises(NoResults) as err:
        Store(url, readonly=True)
    assert "check db= or TUNER_DB_URL" in str(err.value)
    assert "check --db or TUNER_DB_URL" in _cli_error(["show", "--db", url], capsys)


def test_an_unchecked_table_names_force(tmp_path, no_gpu, capsys):
    url = f"sqlite:///{tmp_path / 'in.sqlite'}"
    store = Store(url)
    try:
        python = _python_error(lambda: import_table(store, SHIPPED, local_fingerprint=None))
    finally:
        store.close()
    assert "Re-run with force=True" in python and "--force" not in python
    assert "Re-run with --force" in _cli_error(["import", str(SHIPPED), "--db", url], capsys)
