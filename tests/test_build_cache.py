"""The compile cache across processes (compile only, no GPU): a build one process made is loaded
from disk by the next one, not compiled again, and a broken entry falls back to compiling."""

from __future__ import annotations

import textwrap

import pytest

pytestmark = pytest.mark.compile

# Runs in a fresh interpreter: compile the default mma_sync config for sm_90a and report how the
# kernel was obtained. A fresh process is the point: nothing is in its memory cache.
_CHILD = textwrap.dedent("""
    import json, time
    from tuner.problem import Problem
    from variants.mma_sync import compile, default
    problem = Problem(batch=1, heads=2, seq_len=77, head_dim=128)
    t0 = time.perf_counter()
    kernel = compile(default("sm_90a", problem), problem, "sm_90a")
    print(json.dumps({"from_disk": kernel.loaded_from_disk, "seconds": time.perf_counter() - t0,
                      "has_fn": kernel._fn is not None, "registers": kernel.resources.registers,
                      "compile_seconds": kernel.compile_seconds}))
""")


@pytest.fixture
def run_child(python_child):
    def run(cache_dir, cwd=None) -> tuple[dict, str]:
        return python_child(_CHILD, env={"TUNER_CACHE_DIR": str(cache_dir)}, cwd=cwd)

    return run


def _entry(cache_dir):
    entries = list((cache_dir / "mma_sync").iterdir())
    assert len(entries) == 1
    return entries[0]


def test_second_process_loads_the_build_from_disk(tmp_path, run_child):
    first, _ = run_child(tmp_path)
    assert not first["from_disk"] and first["has_fn"]
    entry = _entry(tmp_path)
    assert {"kernel.cubin", "kernel.o", "meta.json"} <= {p.name for p in entry.iterdir()}

    second, _ = run_child(tmp_path)
    assert second["from_disk"] and second["has_fn"]
    assert second["registers"] == first["registers"]
    # The original build's seconds travel with the entry; loading is far cheaper than building.
    assert second["compile_seconds"] == pytest.approx(first["compile_seconds"])
    assert second["seconds"] < first["seconds"] / 2, (first, second)


def test_a_build_leaves_nothing_in_the_working_directory(tmp_path, run_child):
    # CuTe DSL's --keep-cubin writes <cwd>/<entry name>.cubin unless given a dump directory: one
    # name for every config, which parallel compiles in one directory used to read half-written.
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    run_child(tmp_path / "cache", cwd=cwd)
    assert list(cwd.iterdir()) == []


def test_a_broken_object_is_compiled_again(tmp_path, run_child):
    run_child(tmp_path)
    obj = _entry(tmp_path) / "kernel.o"
    obj.write_bytes(b"not an ELF object")
    again, stderr = run_child(tmp_path)
    assert not again["from_disk"] and again["has_fn"]
    assert "compiling again" in stderr
    # ... and the rebuilt entry is whole again for the process after.
    assert obj.read_bytes()[:4] == b"\x7fELF"
    assert run_child(tmp_path)[0]["from_disk"]


def test_an_incomplete_entry_is_not_loaded(tmp_path, run_child):
    run_child(tmp_path)
    (_entry(tmp_path) / "meta.json").unlink()  # a build killed before its last write
    again, _ = run_child(tmp_path)
    assert not again["from_disk"] and again["has_fn"]


def test_the_shared_hash_covers_every_module_the_kernels_import(monkeypatch):
    """A module of variants/ that a family's device code imports (outside its own package) holds
    code-generation inputs (block_scales.KV_BLOCK, say): editing it must change every cache key,
    so it must be among the files the shared hash reads."""
    import ast
    from pathlib import Path

    from variants import build

    root = Path(build.__file__).resolve().parent
    families = {"wgmma", "mma_sync"}
    imported = set()
    for path in [*(root / "common").glob("*.py"),
                 *(p for fam in families for p in (root / fam).glob("*.py"))]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("variants."):
                top = node.module.split(".")[1]
                # launch: host code only; defaults: the rules of default(), no codegen input
                if top not in families | {"common", "launch", "defaults"}:
                    imported.add(top)
    hashed = []
    monkeypatch.setattr(build, "files_hash", lambda paths: hashed.extend(paths) or "x")
    build.shared_source_hash.__wrapped__()
    names = {p.name for p in hashed}
    assert imported and {f"{m}.py" for m in imported} <= names, imported - {
        n[:-3] for n in names}
    assert {p.name for p in (root / "common").glob("*.py")} <= names


def test_the_key_names_the_toolkit_flavor_the_dsl_loaded(monkeypatch, tmp_path):
    """cu12 and cu13 ptxas schedule the same kernel differently, and a machine can hold both
    flavors (the DSL picks by the driver): a cubin built under one must not be found under the
    other."""
    import re
    import sys

    from variants import build

    build.dsl_toolkit.cache_clear()
    flavor = build.dsl_toolkit()
    loaded = sys.modules["cutlass._mlir._mlir_libs._cutlass_ir"].__file__
    tagged = re.search(r"\.(cu\d+)\.", loaded)
    assert flavor == (tagged.group(1) if tagged else "untagged"), loaded

    from tuner.problem import Problem
    from variants.mma_sync import default

    cfg = default("sm_120a", Problem(1, 2, 77))
    keys = set()
    for name in ("cu12", "cu13"):
        monkeypatch.setattr(build, "dsl_toolkit", lambda name=name: name)
        keys.add(build.codegen_key("mma_sync", cfg, 128, "sm_120a", tmp_path))
    assert len(keys) == 2
