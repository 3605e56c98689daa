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


# The GPU tiers (tests/gpu/__init__.py): the covering one and the exhaustive sweeps.
GPU_MARKERS = ("gpu", "gpu_full")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (run on the device: pytest -m gpu)")
    for item in items:
        if any(item.get_closest_marker(name) for name in GPU_MARKERS):
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session", autouse=True)
def _gpu_builds_ahead(request, tmp_path_factory):
    """On a GPU machine, the kernels the selected GPU tests build, compiled in parallel before
    the first test (tests/gpu/__init__.py: compile time dominates the GPU tiers); under
    pytest-xdist by one worker while the others wait (the workers' temp folders share a
    parent)."""
    if not torch.cuda.is_available():
        return
    from tests.gpu import compile_ahead, compile_ahead_once, selected_builds

    builds = selected_builds(request.session.items)
    if not builds:
        return
    jobs = max(1, (os.cpu_count() or 2) - 1)
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        compile_ahead(builds, jobs)
    else:
        compile_ahead_once(builds, jobs, tmp_path_factory.getbasetemp().parent)


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


@pytest.fixture
def lookup(tmp_path, monkeypatch):
    """(add(problem, cfg) to the database, table((problem, cfg), ...) as db/tables/h200.yaml,
    best(problem): what tuner.attention would run it with, the database URL) for the runtime
    lookup on a pretend H200 (tests/test_runtime.py's DEVICE)."""
    from tests.doubles.tables import write_table
    from tests.test_runtime import DEVICE
    from tuner import runtime
    from tuner.gpus import PROFILES
    from tuner.store import Store, TrialRecord

    url = f"sqlite:///{tmp_path / 'tuner.sqlite'}"
    tables = tmp_path / "tables"
    tables.mkdir()
    monkeypatch.setattr(runtime, "_local_gpu_and_device", lambda gpu: (PROFILES["h200"], DEVICE))
    monkeypatch.setattr(runtime, "TABLES_DIR", tables)
    runtime.clear_cache()
    store = Store(url)
    store.record_device(DEVICE, {"name": "NVIDIA H200", "compute_capability": "9.0",
                                 "sm_count": 132})

    def add(problem, cfg):
        tid = store.record_trial(TrialRecord(
            id=None, device_id=DEVICE, problem_key=problem.key(), family_set="mma_sync",
            family="mma_sync", config=cfg.to_dict(), config_hash="x", outcome="ok",
            median_ms=1.0))
        store.set_best(DEVICE, problem, "mma_sync", tid, None, None)

    def table(*entries):
        rows = [{"problem": p.to_dict(), "family": "mma_sync", "config": cfg.to_dict(),
                 "median_ms": 1.0} for p, cfg in entries]
        write_table(tables, rows)
        runtime.clear_cache()

    def best(problem):
        """What tuner.attention would run the problem with: (source, tuned problem, config)."""
        found = runtime.config_for_problem(problem, gpu="h200", db=url)
        return found.source, found.tuned_problem, found.config

    yield add, table, best, url
    store.close()
    runtime.clear_cache()


@pytest.fixture
def one_torch_thread():
    """torch on one CPU thread for the test, the caller's count restored after it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def own_build(tmp_path, monkeypatch):
    """A build of the test's own: an empty disk cache and empty memory caches, so that the
    caches neither hand this test another's build nor hand this build to other tests, which
    expect theirs on their own disk cache."""
    from variants import build

    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(build, "_FUNCTIONS", {})
    monkeypatch.setattr(build, "_KERNELS", {})


@pytest.fixture
def compile_in_tmp(tmp_path, monkeypatch):
    """Builds into the test's own cache, and from its own working directory: --keep-cubin
    writes the cubin there."""
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path))
    monkeypatch.chdir(tmp_path)
