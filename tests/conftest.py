import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import torch

PG_SKIP = ("TUNER_TEST_PG_URL is not set: no PostgreSQL server to test against "
           "(.ci/run starts one on loopback; export the URL of one to run these here)")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (run on the device: pytest -m gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture
def pg_url():
    """A new, empty database on the PostgreSQL server TUNER_TEST_PG_URL names (its role may
    create databases), dropped after the test: every test starts from nothing."""
    base = os.environ.get("TUNER_TEST_PG_URL")
    if not base:
        pytest.skip(PG_SKIP)
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url
    from sqlalchemy.pool import NullPool

    from tuner.dburl import engine_url

    base = engine_url(base)
    name = f"tuner_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(base).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url_any(request, tmp_path):
    """The results database on each backend the Store promises (PostgreSQL skips without a
    server)."""
    if request.param == "postgresql":
        return request.getfixturevalue("pg_url")
    return f"sqlite:///{tmp_path / 'any.sqlite'}"


_REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def python_child():
    """Run `code` in a fresh interpreter (nothing in any memory cache) that imports this checkout
    from any working directory; returns (the JSON its last stdout line holds, its stderr)."""

    def run(code: str, *args: str, env: dict | None = None, cwd=None, timeout: float = 600):
        child_env = {**os.environ, **(env or {}), "PYTHONPATH": os.pathsep.join(
            filter(None, [str(_REPO), os.environ.get("PYTHONPATH")]))}
        done = subprocess.run([sys.executable, "-c", code, *args], env=child_env, cwd=cwd,
                              capture_output=True, text=True, timeout=timeout, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr

    return run
