"""Fixtures of the GPU tests."""

import pytest

from tuner import runtime


@pytest.fixture
def empty_db(tmp_path, monkeypatch):
    """A results database of the test's own, empty: the runtime serves the shipped table or the
    family default, and no plan or lookup of an earlier test is reused."""
    monkeypatch.setenv("TUNER_DB_URL", f"sqlite:///{tmp_path / 'empty.sqlite'}")
    runtime.clear_cache()
